"""What the run log's writer and reader share: the file names, the schema version, the errors,
plain JSON, and the checks of a run folder."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import platform
import re
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from lld_monitor import columns as C

logger = logging.getLogger("lld_monitor")

#: Version of the on-disk format this module writes and the newest one it reads.
SCHEMA_VERSION = 1

META_FILE = "meta.json"
STEPS_FILE = "steps.jsonl"
EVENTS_FILE = "events.jsonl"
TOKENS_DIR = "tokens"
CLOSED_FILE = "closed.json"

#: Default byte budget for the token samples of one run (Parquet bytes on disk).
DEFAULT_TOKEN_BUDGET_BYTES = 50_000_000
#: Default fsync cadence of the step log, in seconds (events and closing are always fsynced).
DEFAULT_FSYNC_EVERY_S = 1.0
#: Default bytes of rows and events a writer holds in memory while its files cannot be written
#: (a full disk), retried before the next write; beyond it the oldest held rows are lost.
DEFAULT_MAX_PENDING_BYTES = 8 * 1024 * 1024
#: Seconds between two warnings about write failures (every episode is reported, rate-limited).
WRITE_WARNING_EVERY_S = 60.0
#: Steps named one by one in a ``log_recovered`` event; beyond it only ranges are kept.
_MAX_STEPS_NAMED = 1000

# Packages whose versions go into meta.json (read from installed metadata, never imported).
_VERSIONED_PACKAGES = (
    "lld_monitor",
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "deepspeed",
    "verl",
    "numpy",
    "pandas",
    "pyarrow",
    "wandb",
)
# Below this many bytes the line-by-line parser is faster than pyarrow's reader (its setup cost).
_FAST_PATH_MIN_BYTES = 128 * 1024
_TOKEN_FILE_RE = re.compile(r"^step(-?\d+)_(\d+)\.parquet$")
_EVENT_ORDER = (
    C.EVENT_TYPE,
    C.EVENT_STEP,
    C.EVENT_TIME,
    C.EVENT_KIND,
    C.EVENT_SEVERITY,
    C.EVENT_MESSAGE,
    C.EVENT_EVIDENCE,
)


class RunFormatError(ValueError):
    """A path that is not a readable run folder (missing, not a run, future schema, bad meta)."""


class RunSummaryError(RunFormatError):
    """A run folder kept as a summary: its metadata, events and end-of-run summary are there,
    its step log (``steps.jsonl``) was not kept. Nothing to plot or analyse, by design."""


#: Files that mark a finished run (its end-of-run record; the toy testbed's evaluation).
SUMMARY_FILES: tuple[str, ...] = ("closed.json", "toy_summary.json")


# --- plain JSON ---------------------------------------------------------------------------------


def _plain(value: Any, where: str, *, lenient: bool = False) -> Any:
    """``value`` as plain JSON: numpy/torch scalars unwrapped, non-finite floats as None.

    ``lenient`` (for meta) stores dataclasses as dicts and other unknown objects as ``str``.
    """
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}", lenient=lenient) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, where, lenient=lenient) for v in value]
    item = getattr(value, "item", None)
    if callable(item):  # numpy scalar, 0-d array, one-element torch tensor
        try:
            return _plain(item(), where, lenient=lenient)
        except (ValueError, RuntimeError):  # more than one element: fall through to tolist
            pass
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return _plain(tolist(), where, lenient=lenient)
    if lenient:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return _plain(dataclasses.asdict(value), where, lenient=True)
        return str(value)
    raise TypeError(
        f"{where}: cannot store a {type(value).__name__} in the run log; "
        "pass numbers, strings, bools, lists or dicts"
    )


def _plain_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A step row as plain JSON values; the common types take a fast path."""
    out: dict[str, Any] = {}
    bad: list[str] = []  # non-finite loss / grad norm, stored as null, named in C.NONFINITE
    for key, value in row.items():
        kind = type(value)
        if kind is float:
            if math.isfinite(value):
                out[str(key)] = value
            else:
                out[str(key)] = None
                if key in C.NONFINITE_COLUMNS:
                    bad.append(str(key))
        elif kind is int or kind is str or value is None:
            out[str(key)] = value
        else:
            v = _plain(value, str(key))
            if v is None and key in C.NONFINITE_COLUMNS:
                bad.append(str(key))
            out[str(key)] = v
    if bad and C.NONFINITE not in out:
        out[C.NONFINITE] = ",".join(bad)
    return out


def _dumps(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")


def _package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.

    On failure (a full disk) the temporary file is removed before the error propagates.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("lld_monitor: could not remove %s (%s); delete it by hand", tmp, exc)
        raise


def _step_ranges(steps: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``"3-5, 9"`` (sorted, repeats merged)."""
    parts: list[str] = []
    ordered = sorted(set(steps))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(parts)


# --- checks shared by reader and writer ---------------------------------------------------------


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a folder holding ``meta.json`` and ``steps.jsonl``."""
    p = Path(path)
    return (p / META_FILE).is_file() and (p / STEPS_FILE).is_file()


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """Run folders at or under ``root`` (recursive, hidden folders skipped), sorted by path."""
    root_path = Path(root)
    if not root_path.is_dir():
        what = "is a file, not a folder" if root_path.exists() else "no such folder"
        raise RunFormatError(f"{root_path}: {what}; pass a run folder or a folder of runs")
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root_path):
        if is_run_dir(dirpath):
            found.append(Path(dirpath))
            dirnames[:] = []  # a run does not contain runs
            continue
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
    return sorted(found)


def _check_run_dir(path: Path) -> None:
    if not path.exists():
        raise RunFormatError(f"{path}: no such run folder")
    if not path.is_dir():
        raise RunFormatError(
            f"{path} is a file, not a run folder (a folder with {META_FILE} and {STEPS_FILE}); "
            "for a foreign log (CSV, trainer_state.json, ...) use lld_monitor.load_table"
        )
    missing = [name for name in (META_FILE, STEPS_FILE) if not (path / name).is_file()]
    if missing == [STEPS_FILE] and any((path / f).is_file() for f in SUMMARY_FILES):
        kept = [f for f in (META_FILE, EVENTS_FILE, *SUMMARY_FILES) if (path / f).is_file()]
        raise RunSummaryError(
            f"{path} is a run summary, not a run log: it keeps {', '.join(kept)}, missing "
            f"{STEPS_FILE} (the step rows were not kept, or were deleted), so there is nothing "
            "to plot or analyse; its events and summary can be read as files"
        )
    if missing:
        hint = ""
        below = find_runs(path)
        if below:
            hint = f"; it contains {len(below)} run(s), e.g. {below[0]}"
        raise RunFormatError(
            f"{path} is not a run folder: expected {META_FILE} and {STEPS_FILE}, "
            f"missing {', '.join(missing)}{hint}"
        )


def _read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / META_FILE
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunFormatError(f"{meta_path}: unreadable run metadata ({exc})") from exc
    if not isinstance(meta, dict):
        raise RunFormatError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    version = meta.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise RunFormatError(f"{meta_path}: missing or non-integer schema_version ({version!r})")
    if version > SCHEMA_VERSION:
        raise RunFormatError(
            f"{path} uses run-format schema version {version}, but this lld_monitor reads up to "
            f"version {SCHEMA_VERSION}: upgrade lld_monitor to read it"
        )
    if version < 1:
        raise RunFormatError(f"{meta_path}: invalid schema_version {version} (must be >= 1)")
    return meta


def _read_closed(path: Path) -> dict[str, Any] | None:
    try:
        closed = json.loads((path / CLOSED_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # written atomically, so only a foreign hand could garble it
    return closed if isinstance(closed, dict) else None
