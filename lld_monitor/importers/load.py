"""Open a logged run: ``load_table`` (the one "open any run" entry point: the CLI, the analyzer,
the triage and the dashboard call it), the evaluation rows it keeps apart (``load_eval_table``),
the runs a file holds (``runs_in_file``) and the other logs an output folder holds.

The formats themselves (one class each, the registry, ``detect``) are in ``formats.py``; this
module picks the run, splits off the evaluation rows (``parts.split_eval``) and maps the columns
(``table.canonicalize``). No torch import here.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from lld_monitor import columns as C
from lld_monitor.importers.base import (
    SNIFF_BYTES,
    Format,
    Head,
    ImportFormatError,
    Run,
    _one_line,
    pick_run,
)
from lld_monitor.importers.formats import (
    _TB_NAME,
    _is_run_dir,
    checkpoint_states,
    detect,
)
from lld_monitor.importers.names import FOREIGN_NAMES, authors_note
from lld_monitor.importers.parts import split_eval
from lld_monitor.importers.table import canonicalize
from lld_monitor.importers.wandb_run import is_wandb_run_dir


def _folder_sources(path: Path) -> list[tuple[str, Path, str]]:
    """Every log an output folder holds that ``load_table`` could read: (format, path, what),
    in the order ``_detect_folder`` prefers them. Checkpoints' copies of ``trainer_state.json``
    count as one source (the latest checkpoint's)."""
    found: list[tuple[str, Path, str]] = []
    if _is_run_dir(path):
        found.append(("lld_run", path, "the lld_monitor run log (steps.jsonl)"))
    if is_wandb_run_dir(path):
        found.append(("wandb_run", path, "a W&B run folder"))
    events = sorted(p for p in path.rglob(f"*{_TB_NAME}*") if p.is_file())
    if events:
        n = len(events)
        found.append(("tensorboard", path, f"TensorBoard events ({n} file{'s' if n != 1 else ''})"))
    if (path / "trainer_state.json").is_file():
        found.append(("trl_trainer_state", path / "trainer_state.json", "TRL's trainer_state.json"))
    latest, n_ckpts, skipped = checkpoint_states(path)
    if latest is not None:
        cut = f"; passed over: {', '.join(skipped)}" if skipped else ""
        found.append(
            (
                "trl_trainer_state",
                latest,
                f"trainer_state.json of {latest.parent.name}, the latest complete of {n_ckpts} "
                f"checkpoints (each holds the run's history up to it){cut}",
            )
        )
    for sub in sorted(path.glob("wandb/*run-*")):
        if sub.is_dir() and is_wandb_run_dir(sub):
            found.append(("wandb_run", sub, "a W&B run folder"))
    return found


def folder_notes(path: Path, fmt: str) -> tuple[str | None, list[str]]:
    """For an output folder read as ``fmt`` (its sources listed once): the note saying which of
    its checkpoints was read when it was one (and any later one passed over, cut off
    mid-write), else None; and a line per other log it holds (what and where), so the analysis
    can say what it did not read. (None, []) for a file."""
    if not path.is_dir():
        return None, []
    sources = _folder_sources(path)
    chosen = next((i for i, (name, _, _) in enumerate(sources) if name == fmt), None)
    note = None
    if chosen is not None:
        name, where, what = sources[chosen]
        if name == "trl_trainer_state" and where.parent != path:
            note = f"read {what}"
    others = [f"{what}: {where}" for i, (_, where, what) in enumerate(sources) if i != chosen]
    return note, others


# --- public API ---------------------------------------------------------------------------------


def detect_format(path: str | Path) -> str:
    """Name of the format of ``path`` (a key of ``FORMATS``), from its content.

    Files up to ``SNIFF_BYTES`` are detected exactly as ``load_table`` does; larger ones from
    their first ``SNIFF_BYTES`` (cheap enough to list a folder of growing logs).
    """
    path = Path(path)
    partial = path.is_file() and _TB_NAME not in path.name and path.stat().st_size > SNIFF_BYTES
    fmt, _ = detect(path, complete=not partial)
    return fmt.name


#: The tables of the last few files read (up to ``_TABLES_MAX_BYTES``), keyed by (path, run,
#: mtime_ns, size, its first and last 256 bytes): the dashboard's listing, its picker's verdict
#: and its charts read a log once on a first render, not three times. A changed file is read
#: again.
_TABLES: dict[tuple[str, str | None, int, int, int], pd.DataFrame] = {}
_TABLES_SIZE = 4
_TABLES_MAX_BYTES = 32 << 20
_TABLES_LOCK = threading.Lock()


def load_table(path: str | Path, *, run: str | None = None) -> pd.DataFrame:
    """Load a logged run as a numeric DataFrame of canonical columns, sorted by ``step``.

    The one entry point for opening any run, ours or foreign. ``run``: which of several runs a
    file holds (a notebook's training table, by its number); None: the file's own choice.
    ``df.attrs``: ``source_format``
    (a ``FORMATS`` key), ``unmapped_columns`` (foreign names not mapped), ``step_source`` (where
    ``step`` came from: ``logged``, ``progress_bar``, ``epoch``, ``logging_steps`` or
    ``row_order``), ``step_note`` (the same as a sentence), ``import_notes`` (cells, lines and
    rows dropped or changed, counted), ``source_path``, ``other_sources`` (for a folder: the
    other logs it holds that were not read, one line each).

    A file read before and unchanged since is not parsed again: each call gets its own frame
    (a shallow copy; pandas copies on write) with its own attrs.
    """
    path = Path(path)
    key = _file_key(path, run, _TABLES_MAX_BYTES)
    with _TABLES_LOCK:
        hit = _TABLES.get(key) if key is not None else None
    if hit is None:
        hit = _load_table(path, run)
        if key is not None:
            with _TABLES_LOCK:
                while _TABLES and len(_TABLES) >= _TABLES_SIZE:
                    _TABLES.pop(next(iter(_TABLES)))
                _TABLES[key] = hit
    out = hit.copy(deep=False)
    out.attrs = copy.deepcopy(hit.attrs)
    return out


#: What ``load_table`` says of a file that reads but logs no training metric (the triage's
#: "skipped": a config, a timing file).
NO_ROWS = "found no training rows with a known metric"


def _file_key(
    path: Path, extra: str | None, max_bytes: int
) -> tuple[str, str | None, int, int, int] | None:
    """What a cache knows a file's content by: (path, ``extra``, mtime_ns, size, a hash of its
    first and last 256 bytes); None for a folder, a file over ``max_bytes``, an unreadable one.
    (A file rewritten to the same size within one tick of the clock: its ends differ.)"""
    try:
        if not path.is_file():
            return None  # (a folder: its files change without its own mtime changing)
        st = path.stat()
        if st.st_size > max_bytes:
            return None
        with path.open("rb") as fh:
            ends = fh.read(256)
            fh.seek(max(0, st.st_size - 256))
            ends += fh.read(256)
    except OSError:
        return None
    return (str(path.resolve()), extra, st.st_mtime_ns, st.st_size, hash(ends))


def _read_raw(path: Path, run: str | None) -> tuple[Format, pd.DataFrame, str]:
    """(format, the raw table of the run asked for, its step source): one run of a file that
    holds several (``run``, else the file's own choice)."""
    cached = _cached_runs(path)
    if cached is not None:  # (listed before: neither detected nor parsed again)
        fmt, runs = cached
        return fmt, *pick_run(path, fmt, runs, run)
    fmt, head = detect(path)
    with _read_errors(path, fmt):
        if fmt.appendable:  # (its runs are kept: listing them and reading one parse once)
            frame, step_source = pick_run(path, fmt, _runs_of(path, fmt, head), run)
        else:
            frame, step_source = fmt.read(path, head, run=run)
    return fmt, frame, step_source


@contextlib.contextmanager
def _read_errors(path: Path, fmt: Format) -> Iterator[None]:
    """A reader's failure as one ImportFormatError naming the format it looked like."""
    try:
        yield
    except ImportFormatError:
        raise
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ImportFormatError(
            f"{path}: looked like {fmt.description} but could not be read ({_one_line(exc)})"
        ) from exc


def load_runs(path: str | Path) -> list[tuple[str, pd.DataFrame]]:
    """Every run a file holds, ``(name, table)``, each table as ``load_table(path, run=name)``
    gives it (one run: its name and ``load_table(path)``): the file is detected and parsed
    once, whatever its size (``load_table`` of each run parses a file above the runs cache's
    size again). The triage reads a file of several runs through it."""
    path = Path(path)
    fmt, head = detect(path)
    with _read_errors(path, fmt):
        if fmt.appendable:
            cached = _cached_runs(path)
            runs = cached[1] if cached is not None else _runs_of(path, fmt, head)
            one = len(runs) == 1
            raws = [(n, *pick_run(path, fmt, runs, None if one else n)) for n, _, _ in runs]
        else:
            names = fmt.runs(path, head)
            one = len(names) == 1
            raws = [(n, *fmt.read(path, head, run=None if one else n)) for n in names]
    return [(name, _finish(path, fmt, frame, source)) for name, frame, source in raws]


def _load_table(path: Path, run: str | None) -> pd.DataFrame:
    return _finish(path, *_read_raw(path, run))


def _finish(path: Path, fmt: Format, frame: pd.DataFrame, step_source: str) -> pd.DataFrame:
    """A raw run table as ``load_table`` returns it: evaluation rows apart, canonical columns,
    the attrs that say where it came from."""
    frame, evals = split_eval(frame)
    df, unmapped = canonicalize(frame)
    if df.empty and evals is not None and len(evals):
        names = ", ".join(str(c) for c in list(evals.columns)[:5] if c != C.STEP)
        raise ImportFormatError(
            f"{path}: read as {fmt.description} but found no training rows: it holds only "
            f"evaluation rows ({len(evals)}: {names}), kept apart from training by design"
        )
    if df.empty:
        raise ImportFormatError(
            f"{path}: read as {fmt.description} but {NO_ROWS} "
            f"({', '.join(sorted(FOREIGN_NAMES[C.REWARD_MEAN]))}, grad_norm, loss, ...)"
        )
    df.attrs["source_format"] = fmt.name
    df.attrs["unmapped_columns"] = unmapped
    df.attrs["step_source"] = step_source
    df.attrs["step_note"] = frame.attrs.get("step_note") or _STEP_NOTES.get(step_source, "")
    authors = authors_note(frame.columns)
    # an output folder may hold several logs of the run (TensorBoard events beside TRL's
    # trainer_state.json, a wandb/ folder): say which one was read and what else is there
    chosen, others = folder_notes(path, fmt.name)
    df.attrs["import_notes"] = [
        *([chosen] if chosen else []),
        *frame.attrs.get("import_notes", []),
        *df.attrs.get("import_notes", []),
        *([authors] if authors else []),
    ]
    if evals is not None and len(evals):
        names = [c for c in evals.columns if c != C.STEP]
        shown = ", ".join(names[:4]) + (f", ... ({len(names)} columns)" if len(names) > 4 else "")
        df.attrs["import_notes"].append(
            f"{len(evals)} evaluation row(s) kept apart ({shown}): not analysed, not drawn as "
            "training metrics (importers.load_eval_table reads them)"
        )
    df.attrs["eval_rows"] = 0 if evals is None else len(evals)
    df.attrs["source_path"] = str(path)
    df.attrs["other_sources"] = others
    return df


def load_eval_table(path: str | Path, *, run: str | None = None) -> pd.DataFrame:
    """The evaluation rows that ``load_table`` keeps apart from the training rows: ``step`` and
    the evaluation columns under their logged names (``eval/accuracy``, ``eval_loss``,
    ``val-core/...``, ``test/env/all/reward/total``; a typed record of type eval gives
    ``eval/<key>``), sorted by step. Empty (only a ``step`` column) when the log has none."""
    _, frame, _ = _read_raw(Path(path), run)
    _, evals = split_eval(frame)
    if evals is None or C.STEP not in evals.columns:
        return pd.DataFrame(columns=[C.STEP])
    out = evals.apply(pd.to_numeric, errors="coerce")
    out = out[out[C.STEP].notna()].sort_values(C.STEP, kind="stable").reset_index(drop=True)
    return out


#: ``_file_key`` -> (format, runs) of an appendable log, for the last few read: listing a file's
#: runs and reading one of them detect and parse it once.
_RUNS_CACHE: dict[tuple[str, str | None, int, int, int], tuple[Format, list[Run]]] = {}
_RUNS_CACHE_SIZE = 4
_RUNS_CACHE_MAX_BYTES = 64 << 20


def _cached_runs(path: Path) -> tuple[Format, list[Run]] | None:
    """(format, runs) of an appendable log read before and unchanged since, else None."""
    key = _file_key(path, None, _RUNS_CACHE_MAX_BYTES)
    if key is None:
        return None
    with _TABLES_LOCK:
        return _RUNS_CACHE.get(key)


def _runs_of(path: Path, fmt: Format, head: Head | None) -> list[Run]:
    """The runs of an appendable log (``fmt.load_runs``), kept for the next reader."""
    runs = fmt.load_runs(path, head)
    key = _file_key(path, None, _RUNS_CACHE_MAX_BYTES)
    if key is not None:
        with _TABLES_LOCK:  # (the dashboard's sessions read logs from threads of their own)
            while _RUNS_CACHE and len(_RUNS_CACHE) >= _RUNS_CACHE_SIZE:
                _RUNS_CACHE.pop(next(iter(_RUNS_CACHE)))
            _RUNS_CACHE[key] = (fmt, runs)
    return runs


#: ``step_source`` -> how the steps were found, for tables (console logs say more).
_STEP_NOTES = {
    "logged": "step from the log's own step column",
    "row_order": "no step column: the rows are numbered 1, 2, 3, ...",
}


def runs_in_file(path: Path) -> list[str]:
    """The runs a single file holds when it holds several, else []: a W&B panel export's run
    names (from the header line alone), or "1", "2", ... for the runs appended to a log whose
    step counter restarts (the log is parsed once: ``load_table`` of one of its runs reuses it).
    Each format says (``Format.runs``)."""
    try:
        fmt, head = detect(path, complete=False)
    except ImportFormatError:
        return []
    if head is None:
        return []
    try:
        if not fmt.appendable:
            # (a notebook's or a table's one run: nothing to ask; a panel export's from its head)
            names = fmt.runs(path, head) if fmt.several else []
        else:
            cached = _cached_runs(path)
            if cached is None:
                fmt, head = detect(path)  # (as load_table detects it: the whole file)
                cached = (fmt, _runs_of(path, fmt, head) if fmt.appendable else [])
            names = [name for name, _, _ in cached[1]]
    except (OSError, ValueError, KeyError, TypeError, ImportFormatError):
        return []
    return names if len(names) > 1 else []
