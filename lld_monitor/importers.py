"""Read logged runs of any origin into one table with the canonical column names.

``load_table(path)`` detects the format from the content (not the extension alone), maps the
foreign metric names to ``lld_monitor.columns`` through one table (``FOREIGN_NAMES``), keeps the
training rows, and returns a numeric DataFrame sorted by ``step``. No torch import here.
"""

from __future__ import annotations

import ast
import csv
import io
import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C

# --- formats ----------------------------------------------------------------------------------

#: format name -> what it is (the names ``detect_format`` returns, in the order they are tried).
FORMATS: dict[str, str] = {
    "lld_run": "an lld_monitor run folder (meta.json + steps.jsonl)",
    "tensorboard": "a TensorBoard event folder or events.out.tfevents.* file",
    "parquet": "a Parquet table with canonical column names",
    "trl_trainer_state": "a TRL/transformers trainer_state.json (log_history)",
    "log_history": "a JSON list of log_history-style metric dicts",
    "notebook_log": "a notebook stream log or .ipynb with TRL's printed metric dicts",
    "verl_jsonl": 'a verl file-logger JSONL ({"step": ..., "data": {...}} per line)',
    "jsonl": "a JSONL table with canonical column names",
    "verl_console": "a verl console log (step:N - actor/grad_norm:... lines)",
    "trl_console": "a console log or terminal capture with TRL's printed metric dicts",
    "wandb_csv": "a W&B history export (CSV with _step, train/reward, ...)",
    "csv": "a CSV table with canonical column names",
}

_EXPECTED = (
    "expected an lld_monitor run folder, a CSV/Parquet/JSONL table, a TRL trainer_state.json or "
    "log_history JSON, a console/notebook log with TRL metric dicts, a W&B history CSV, a "
    "TensorBoard event folder, or a verl console/file log"
)


class ImportFormatError(ValueError):
    """The file is unreadable or in no format ``load_table`` knows; the message is one line."""


# --- the one mapping table ----------------------------------------------------------------------

#: canonical column -> foreign names, highest priority first. Every format goes through this one
#: table. Besides these, every canonical ``<col>`` is reached from ``<col>``, ``lld/<col>``,
#: ``actor/lld/<col>`` (our verl loss's metrics after verl prefixes ``actor/``), ``train/lld/<col>``
#: and ``train/<col>``; and ``train/<name>`` maps like ``<name>`` (transformers' W&B and
#: TensorBoard callbacks prefix training metrics with ``train/``).
FOREIGN_NAMES: dict[str, tuple[str, ...]] = {
    C.STEP: ("global_step", "train/global_step", "trainer/global_step", "_step", "Step"),
    C.TIME: ("_timestamp", "timestamp", "wall_time"),
    # TRL: reward; verl: critic/score/mean (the task score, before any in-reward KL penalty)
    C.REWARD_MEAN: ("reward", "critic/score/mean", "critic/rewards/mean"),
    # TRL's stock accuracy_reward returns 1/0 per completion: its mean is the accuracy
    C.ACCURACY: ("rewards/accuracy_reward/mean", "rewards/accuracy_reward"),
    C.LOSS: ("actor/pg_loss",),
    C.LEARNING_RATE: ("lr", "actor/lr"),
    C.GRAD_NORM: ("actor/grad_norm",),
    C.ENTROPY: ("actor/entropy", "actor/entropy_loss"),
    # KL to the reference first (verl's kl_loss), then verl's old-vs-current ppo_kl
    C.KL: ("actor/kl_loss", "actor/ppo_kl"),
    C.COMPLETION_LENGTH: ("completions/mean_length", "response_length/mean"),
    # TRL: share of completions that hit max_completion_length; verl: of max_response_length
    C.FRAC_TRUNCATED: ("completions/clipped_ratio", "response_length/clip_ratio"),
    C.NUM_SEARCHES: ("tools/call_frequency", "env/number_of_valid_search"),
    C.FRAC_ZERO_STD_GROUPS: ("frac_reward_zero_std",),
    # the paper authors' verl fork (Search-R1 + LLDS): the lambda in force
    C.LLDS_LAMBDA: ("actor/loss_noreduce_coef",),
    # ... and its sampling-policy confidence (AUTHORS_VERL_NAMES: what these mean)
    C.LOGP_CORRECT: ("actor/pos_avg_old_log_prob",),
    C.LOGP_INCORRECT: ("actor/neg_avg_old_log_prob",),
}

#: The paper authors' verl fork (``dp_actor.py``): metric -> what it is and how it is imported.
#: ``pos/neg_avg_old_log_prob`` are ``masked_mean(old_log_prob * (A > 0 | A < 0), response_mask)``:
#: the group's log-prob sum over ALL response tokens of the batch, so the level is the per-token
#: mean times the group's share of tokens; the trend carries over (the detector reads trends).
#: Our own ``actor/lld/logp_*`` win when both are logged. The others have no canonical column.
AUTHORS_VERL_NAMES: dict[str, str] = {
    "actor/pos_avg_old_log_prob": C.LOGP_CORRECT + " (level scaled by the A>0 token share)",
    "actor/neg_avg_old_log_prob": C.LOGP_INCORRECT + " (level scaled by the A<0 token share)",
    "actor/pos_avg_ref_log_prob": "not imported (reference policy, not the sampling policy)",
    "actor/neg_avg_ref_log_prob": "not imported (reference policy, not the sampling policy)",
    "actor/lowest_prob_avg_mean": "not imported (no canonical column)",
    "actor/lowest_prob_avg_min": "not imported (no canonical column)",
    "actor/loss_noreduce_coef": C.LLDS_LAMBDA,
}

_NON_TRAINING = frozenset({C.STEP, C.TIME, C.LEARNING_RATE})

#: Per-reward-function means: ours (``reward_fn/<name>``, also under ``lld/``) and TRL's
#: ``rewards/<name>/mean`` (``rewards/<name>`` before TRL 0.15) -> ``C.REWARD_FN_PREFIX + name``.
_REWARD_FN_RE = re.compile(
    r"^(?:train/)?(?:(?:(?:actor/)?lld/)?" + re.escape(C.REWARD_FN_PREFIX) + r"(?P<ours>.+)"
    r"|rewards/(?P<trl>(?!.*/std$).+?)(?:/mean)?)$"
)


def _build_lookup() -> dict[str, tuple[str, int]]:
    """Source name -> (canonical column, priority); lower priority numbers win."""
    lookup: dict[str, tuple[str, int]] = {}

    def add(name: str, col: str, prio: int) -> None:
        if name not in lookup or lookup[name][1] > prio:
            lookup[name] = (col, prio)

    for col in C.STEP_COLUMNS:
        names = (col, f"lld/{col}", f"actor/lld/{col}", f"train/lld/{col}", f"train/{col}")
        for prio, name in enumerate(names):
            add(name, col, prio)
    for col, names in FOREIGN_NAMES.items():
        for i, name in enumerate(names):
            add(name, col, 10 + i)
            add(f"train/{name}", col, 50 + i)
    return lookup


_LOOKUP = _build_lookup()


def canonical_name(source: str) -> str | None:
    """The canonical column a foreign metric name maps to, or None when it maps to none."""
    hit = _LOOKUP.get(str(source).strip())
    if hit is not None:
        return hit[0]
    return _reward_fn_name(str(source).strip())


def _reward_fn_name(source: str) -> str | None:
    """``reward_fn/<name>`` for a per-reward-function mean column, else None."""
    m = _REWARD_FN_RE.match(source)
    if m is None:
        return None
    return C.REWARD_FN_PREFIX + (m.group("ours") or m.group("trl"))


# --- public API ---------------------------------------------------------------------------------


def detect_format(path: str | Path) -> str:
    """Name of the format of ``path`` (a key of ``FORMATS``), from its content.

    Files up to ``SNIFF_BYTES`` are detected exactly as ``load_table`` does; larger ones from
    their first ``SNIFF_BYTES`` (cheap enough to list a folder of growing logs).
    """
    path = Path(path)
    if path.is_file() and _TB_NAME not in path.name and path.stat().st_size > SNIFF_BYTES:
        return _detect_head(path)
    fmt, _ = _detect(path)
    return fmt


def load_table(path: str | Path) -> pd.DataFrame:
    """Load a logged run as a numeric DataFrame of canonical columns, sorted by ``step``.

    ``df.attrs``: ``source_format`` (a ``FORMATS`` key), ``unmapped_columns`` (foreign names not
    mapped), ``step_source`` (where ``step`` came from: ``logged``, ``progress_bar``, ``epoch``,
    ``logging_steps`` or ``row_order``), ``step_note`` (the same as a sentence),
    ``import_notes`` (cells, lines and rows dropped or changed, counted), ``source_path``.
    """
    path = Path(path)
    fmt, payload = _detect(path)
    try:
        frame, step_source = _READERS[fmt](path, payload)
    except ImportFormatError:
        raise
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ImportFormatError(
            f"{path}: looked like {FORMATS[fmt]} but could not be read ({_one_line(exc)})"
        ) from exc
    df, unmapped = canonicalize(frame)
    if df.empty:
        raise ImportFormatError(
            f"{path}: read as {FORMATS[fmt]} but found no training rows with a known metric "
            f"({', '.join(sorted(FOREIGN_NAMES[C.REWARD_MEAN]))}, grad_norm, loss, ...)"
        )
    df.attrs["source_format"] = fmt
    df.attrs["unmapped_columns"] = unmapped
    df.attrs["step_source"] = step_source
    df.attrs["step_note"] = frame.attrs.get("step_note") or _STEP_NOTES.get(step_source, "")
    df.attrs["import_notes"] = [
        *frame.attrs.get("import_notes", []),
        *df.attrs.get("import_notes", []),
    ]
    df.attrs["source_path"] = str(path)
    return df


#: ``step_source`` -> how the steps were found, for tables (console logs say more).
_STEP_NOTES = {
    "logged": "step from the log's own step column",
    "row_order": "no step column: the rows are numbered 1, 2, 3, ...",
}


def canonicalize(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Map a raw metric table to canonical columns; return it and the unmapped source names.

    Keeps rows that carry at least one training metric (drops eval/summary rows), merges rows of
    the same step (last logged value wins), sorts by step. Without a step column, step = 1, 2, ...
    """
    by_col: dict[str, list[tuple[int, str]]] = {}
    unmapped: list[str] = []
    for source in frame.columns:
        if source == C.NONFINITE:  # an lld_monitor run log's own marks: kept below
            continue
        hit = _LOOKUP.get(str(source).strip())
        fn_col = _reward_fn_name(str(source).strip())
        if hit is not None:
            by_col.setdefault(hit[0], []).append((hit[1], source))
        if fn_col is not None:
            by_col.setdefault(fn_col, []).append((0 if fn_col == source else 1, source))
        if hit is None and fn_col is None:
            unmapped.append(str(source))
    fn_cols = sorted(c for c in by_col if c.startswith(C.REWARD_FN_PREFIX))
    out = pd.DataFrame(index=frame.index)
    marks = pd.Series("", index=frame.index, dtype=object)
    if C.NONFINITE in frame.columns:  # the run log named the values it stored as null
        logged = frame[C.NONFINITE]
        marks = logged.where(logged.map(lambda v: isinstance(v, str)), "").astype(object)
    unreadable = 0  # cells of mapped columns that hold something other than a number
    for col in (*C.STEP_COLUMNS, *fn_cols):
        sources = [s for _, s in sorted(by_col.get(col, []), key=lambda t: t[0])]
        if not sources:
            continue
        numbers = [_numeric(frame[s]) for s in sources]
        unreadable += sum(_unreadable_cells(frame[s], n) for s, n in zip(sources, numbers))
        series = numbers[0]
        for other in numbers[1:]:
            series = series.fillna(other)
        out[col] = series
        if col in C.NONFINITE_COLUMNS:
            lit = _literal_nonfinite(frame[sources[0]])
            marks = marks.where(~lit, marks + "," + col)
    if C.STEP not in out.columns:
        out.insert(0, C.STEP, np.arange(1, len(out) + 1, dtype=float))
    # which missing values were literal nan/inf (the rest are blank cells: missing)
    out[C.NONFINITE] = marks.str.strip(",").replace("", None)
    training = [c for c in out.columns if c not in _NON_TRAINING and c != C.NONFINITE]
    if not training:
        return pd.DataFrame(columns=[C.STEP]), unmapped
    notes = _row_notes(out, training, unreadable)
    out = out[out[training].notna().any(axis=1) & out[C.STEP].notna()]
    if out.empty:
        return pd.DataFrame(columns=list(out.columns)), unmapped
    out, step_notes = _checked_steps(out)
    out = out.groupby(C.STEP, sort=True, as_index=False).last()
    out[C.STEP] = out[C.STEP].astype("int64")
    out = out.reset_index(drop=True)
    out[C.NONFINITE] = out[C.NONFINITE].fillna("")
    out = out[[c for c in (*C.STEP_COLUMNS, *fn_cols, C.NONFINITE) if c in out.columns]]
    out.attrs["import_notes"] = notes + step_notes
    return out, unmapped


# --- detection ----------------------------------------------------------------------------------

_PRINTED_DICT_RE = re.compile(r"\{'[^{}\n]*\}")
_VERL_LINE_RE = re.compile(r"(?:^|[\s)\]])step:\d+ - [^\s:]+:\S", re.MULTILINE)
_TB_NAME = "tfevents"


def _detect(path: Path) -> tuple[str, Any]:
    """(format, parsed payload or None) for ``path``; raises ImportFormatError."""
    if not path.exists():
        raise ImportFormatError(f"{path}: no such file or folder; {_EXPECTED}")
    if path.is_dir():
        if _is_run_dir(path):
            return "lld_run", None
        if any(_TB_NAME in p.name for p in path.rglob("*") if p.is_file()):
            return "tensorboard", None
        state = path / "trainer_state.json"
        if state.is_file():
            return _detect(state)
        if (path / "meta.json").is_file():  # a run without steps.jsonl: load_run says what is amiss
            return "lld_run", None
        if (path / "steps.jsonl").is_file():
            raise ImportFormatError(
                f"{path}: holds steps.jsonl but no meta.json, so it is not a complete lld_monitor "
                f"run folder (meta.json is written first; was it deleted or not copied?); read "
                f"the step log alone with `lld-monitor analyze {path / 'steps.jsonl'}`"
            )
        from lld_monitor.runlog import find_runs

        runs = find_runs(path)
        if runs:
            raise ImportFormatError(
                f"{path}: a folder of {len(runs)} runs, not one run; pass one of them "
                f"(e.g. {runs[0]}), or view them all with `lld-monitor dashboard {path}`"
            )
        raise ImportFormatError(
            f"{path}: folder holds no run log, TensorBoard events or trainer_state.json; "
            f"{_EXPECTED}"
        )
    if _TB_NAME in path.name:
        return "tensorboard", None
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
        if head == b"PAR1":
            return "parquet", None
        text = path.read_text(encoding="utf-8", errors="replace").lstrip("\ufeff")
    except OSError as exc:
        raise ImportFormatError(f"{path}: cannot read ({_one_line(exc)}); {_EXPECTED}") from exc
    if "\x00" in text[:4096]:
        raise ImportFormatError(f"{path}: binary file of unknown format; {_EXPECTED}")
    stripped = text.lstrip()
    if not stripped:
        raise ImportFormatError(f"{path}: empty file (nothing logged yet?); {_EXPECTED}")
    if stripped[:1] in ("[", "{"):
        found = _detect_json(stripped)
        if found is not None:
            return found
    table = _sniff_csv(text)
    if table is not None:
        return _csv_kind([str(c) for c in table.columns]), table
    if "step:" in text and _VERL_LINE_RE.search(_ANSI_RE.sub("", text)):
        return "verl_console", text
    if _find_printed_dicts(text):
        return "trl_console", text
    raise ImportFormatError(f"{path}: unknown format; {_EXPECTED}")


SNIFF_BYTES = 1 << 20


def _detect_head(path: Path) -> str:
    """Format of a large file from its first ``SNIFF_BYTES`` (same rules, no full parse)."""
    with path.open("rb") as fh:
        raw = fh.read(SNIFF_BYTES)
    if raw[:4] == b"PAR1":
        return "parquet"
    if b"\x00" in raw[:4096]:
        raise ImportFormatError(f"{path}: binary file of unknown format; {_EXPECTED}")
    head = raw.decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
    first = head.split("\n", 1)[0].strip()
    if head[:1] == "{":
        if '"log_history"' in head:
            return "trl_trainer_state"
        if '"cells"' in head and '"nbformat"' in head:
            return "notebook_log"
        try:
            rec = json.loads(first)
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict):
            return "verl_jsonl" if _is_verl_record(rec) else "jsonl"
    if head[:1] == "[":
        stream = '"stream_name"' in head or '"output_type"' in head
        return "notebook_log" if stream else "log_history"
    fields = _csv_header(first)
    if fields is not None:
        return _csv_kind(fields)
    if "step:" in head and _VERL_LINE_RE.search(_ANSI_RE.sub("", head)):
        return "verl_console"
    if _find_printed_dicts(head):
        return "trl_console"
    raise ImportFormatError(f"{path}: unknown format (from its first MiB); {_EXPECTED}")


def _detect_json(text: str) -> tuple[str, Any] | None:
    """Detect the JSON-based formats (whole document, then JSON lines)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        if isinstance(doc.get("log_history"), list):
            return "trl_trainer_state", doc["log_history"]
        if isinstance(doc.get("cells"), list):
            return "notebook_log", _notebook_text(doc)
        doc = [doc]  # a one-line JSONL file
    if isinstance(doc, list) and doc and all(isinstance(r, dict) for r in doc):
        if any(_is_stream_record(r) for r in doc):
            return "notebook_log", "".join(_stream_text(r) for r in doc)
        if all(_is_verl_record(r) for r in doc):
            return "verl_jsonl", doc
        return ("log_history" if text.startswith("[") else "jsonl"), doc
    if doc is not None:
        return None
    records = _Lines()
    skipped: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            skipped.append(number)  # a torn last line or a stray print: skipped and counted
            continue
        if isinstance(rec, dict):
            records.append(rec)
        else:
            skipped.append(number)
    if not records:
        return None
    records.skipped = tuple(skipped)
    if all(_is_verl_record(r) for r in records):
        return "verl_jsonl", records
    return "jsonl", records


def _is_verl_record(rec: Mapping[str, Any]) -> bool:
    return isinstance(rec.get("data"), dict) and "step" in rec


def _is_stream_record(rec: Mapping[str, Any]) -> bool:
    return ("stream_name" in rec or rec.get("output_type") == "stream" or "name" in rec) and (
        isinstance(rec.get("data"), str) or isinstance(rec.get("text"), (str, list))
    )


def _stream_text(rec: Mapping[str, Any]) -> str:
    data = rec.get("data", rec.get("text", ""))
    return "".join(data) if isinstance(data, list) else str(data)


def _notebook_text(doc: Mapping[str, Any]) -> str:
    """All stream output text of an .ipynb, in cell order."""
    parts: list[str] = []
    for cell in doc.get("cells", []):
        for out in cell.get("outputs", []) or []:
            if out.get("output_type") == "stream":
                parts.append(_stream_text(out))
    return "".join(parts)


def _is_run_dir(path: Path) -> bool:
    try:
        from lld_monitor.runlog import is_run_dir
    except ImportError:
        return (path / "meta.json").is_file() and (path / "steps.jsonl").is_file()
    return bool(is_run_dir(path))


def _csv_header(first_line: str) -> list[str] | None:
    """The fields of a CSV/TSV header line naming at least one known metric, else None."""
    first = first_line.strip()
    sep = "\t" if first.count("\t") > first.count(",") else ","
    fields = [f.strip().strip('"') for f in first.split(sep)]
    if len(fields) < 2 or not all(fields):
        return None
    if not any(canonical_name(f) or " - " in f for f in fields):
        return None
    return fields


def _csv_kind(fields: Sequence[str]) -> str:
    """'wandb_csv' for W&B history/panel exports, else 'csv'."""
    wandb = any(f in ("_step", "_timestamp", "_runtime") for f in fields) or any(
        f.startswith("train/") or " - " in f for f in fields
    )
    return "wandb_csv" if wandb else "csv"


def _sniff_csv(text: str) -> pd.DataFrame | None:
    """The table when the first line is a CSV/TSV header naming a known metric, else None."""
    first = text.split("\n", 1)[0]
    if _csv_header(first) is None:
        return None
    sep = "\t" if first.count("\t") > first.count(",") else ","
    try:
        # only an empty cell is missing: a literal nan/inf stays text until canonicalize
        # names it non-finite (C.NONFINITE)
        return pd.read_csv(io.StringIO(text), sep=sep, keep_default_na=False, na_values=[""])
    except (ValueError, csv.Error):
        return None


# --- readers ------------------------------------------------------------------------------------


def _read_lld_run(path: Path, _: Any) -> tuple[pd.DataFrame, str]:
    from lld_monitor.runlog import RunFormatError, load_run

    try:
        run = load_run(path)
    except RunFormatError as exc:
        raise ImportFormatError(
            f"{path}: cannot read this lld_monitor run folder ({_one_line(exc)})"
        ) from exc
    return run.steps.copy(), "logged"


def _step_source(frame: pd.DataFrame) -> str:
    """'logged' when a column maps to ``step``, else 'row_order' (canonicalize numbers rows)."""
    return "logged" if any(canonical_name(c) == C.STEP for c in frame.columns) else "row_order"


def _read_parquet(path: Path, _: Any) -> tuple[pd.DataFrame, str]:
    frame = pd.read_parquet(path)
    return frame, _step_source(frame)


def _read_table(_: Path, table: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    return table, _step_source(table)


def _read_wandb_csv(_: Path, table: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """W&B history export; a panel export ("Step", "<run> - <metric>", "__MIN/__MAX") too."""
    renamed = {}
    for col in table.columns:
        name = str(col)
        if name.endswith(("__MIN", "__MAX")):
            continue
        if " - " in name:
            name = name.split(" - ", 1)[1]
        renamed[col] = name
    table = table[list(renamed)].rename(columns=renamed)
    return table.loc[:, ~table.columns.duplicated()], "logged"


def _read_records(_: Path, records: Sequence[Mapping[str, Any]]) -> tuple[pd.DataFrame, str]:
    frame = _frame(records)
    frame.attrs["import_notes"] = _skipped_lines_note(records)
    return frame, _step_source(frame)


def _read_verl_jsonl(_: Path, records: Sequence[Mapping[str, Any]]) -> tuple[pd.DataFrame, str]:
    rows = [{**dict(r["data"]), C.STEP: r["step"]} for r in records]
    frame = _frame(rows)
    frame.attrs["import_notes"] = _skipped_lines_note(records)
    return frame, "logged"


def _read_verl_console(_: Path, text: str) -> tuple[pd.DataFrame, str]:
    return _frame(parse_verl_console(text)), "logged"


def _read_printed(_: Path, text: str) -> tuple[pd.DataFrame, str]:
    found = _printed_dicts_at(text)
    training = [
        (pos, d) for pos, d in found if not _is_summary(d) and any(map(_is_training_key, d))
    ]
    steps, source, how = console_steps(text, training)
    rows = [{**d, C.STEP: step} for (_, d), step in zip(training, steps)]
    frame = _frame(rows)
    frame.attrs["step_note"] = how
    return frame, source


def _read_tensorboard(path: Path, _: Any) -> tuple[pd.DataFrame, str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = [path] if path.is_file() else sorted(p for p in path.rglob(f"*{_TB_NAME}*"))
    values: dict[int, dict[str, float]] = {}
    times: dict[int, float] = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for ev in acc.Scalars(tag):
                values.setdefault(int(ev.step), {})[tag] = float(ev.value)
                times[int(ev.step)] = max(times.get(int(ev.step), 0.0), float(ev.wall_time))
    if not values:
        raise ImportFormatError(f"{path}: TensorBoard events hold no scalars")
    rows = [{**v, C.STEP: s, "wall_time": times[s]} for s, v in sorted(values.items())]
    return _frame(rows), "logged"


_READERS = {
    "lld_run": _read_lld_run,
    "tensorboard": _read_tensorboard,
    "parquet": _read_parquet,
    "trl_trainer_state": _read_records,
    "log_history": _read_records,
    "notebook_log": _read_printed,
    "verl_jsonl": _read_verl_jsonl,
    "jsonl": _read_records,
    "verl_console": _read_verl_console,
    "trl_console": _read_printed,
    "wandb_csv": _read_wandb_csv,
    "csv": _read_table,
}


# --- text parsers -------------------------------------------------------------------------------

_ITEM_RE = re.compile(
    r"""'((?:[^'\\]|\\.)*)'\s*:\s*("""
    r"""'(?:[^'\\]|\\.)*'"""  # a quoted value ('0.1476' in recent TRL)
    r"""|[-+]?(?:nan|inf|\d[\d.]*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"""
    r"""|None|True|False"""
    r"""|(?:tensor|np\.\w+|numpy\.\w+)\([^()]*\)"""  # tensor(0.31, device='cuda:0')
    r""")\s*(?=,|\})"""
)
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUMBER_WRAPPER_RE = re.compile(r"^(?:np\.\w+|numpy\.\w+|tensor|float|int)\((.*?)(?:,.*)?\)$")


def _printed_dicts_at(text: str) -> list[tuple[int, dict[str, Any]]]:
    """Python dict reprs of metrics in ``text``, each with its offset in ``text``."""
    found: list[tuple[int, dict[str, Any]]] = []
    for m in _PRINTED_DICT_RE.finditer(text):
        items = {k: _parse_value(v) for k, v in _ITEM_RE.findall(m.group(0))}
        if items and (any(k in _LOOKUP for k in items) or _is_summary(items)):
            found.append((m.start(), items))
    return found


def _find_printed_dicts(text: str) -> list[tuple[int | None, dict[str, Any]]]:
    """Python dict reprs of metrics in ``text`` with the tqdm step printed before each (or None)."""
    found = _printed_dicts_at(text)
    if not found:
        return []
    steps = _bar_steps(text, [pos for pos, _ in found], None)
    return [(step, items) for step, (_, items) in zip(steps, found)]


def _is_summary(items: Mapping[str, Any]) -> bool:
    return "train_runtime" in items or any(k.startswith("eval_") for k in items)


def _is_training_key(key: str) -> bool:
    hit = _LOOKUP.get(key)
    return hit is not None and hit[0] not in _NON_TRAINING


def _parse_value(token: str) -> Any:
    token = token.strip()
    if token[:1] == "'":
        token = ast.literal_eval(token) if "\\" in token else token[1:-1]
    return token


def parse_verl_console(text: str) -> list[dict[str, Any]]:
    """verl console metric lines (``step:12 - actor/grad_norm:0.31 - ...``) as dicts with step."""
    rows: list[dict[str, Any]] = []
    for line in _ANSI_RE.sub("", text).splitlines():
        i = line.find("step:")
        while i > 0 and not line[i - 1].isspace() and line[i - 1] not in ")]":
            i = line.find("step:", i + 1)
        if i < 0:
            continue
        parts = line[i:].rstrip().split(" - ")
        head = parts[0][len("step:") :].strip()
        if not head.isdigit() or len(parts) < 2:
            continue
        row: dict[str, Any] = {C.STEP: int(head)}
        for part in parts[1:]:
            key, sep, value = part.rpartition(":")
            if sep and key:
                row[key.strip()] = _unwrap_number(value.strip())
        if len(row) > 1:
            rows.append(row)
    return rows


def _unwrap_number(value: str) -> str:
    """``np.float64(0.3)`` / ``tensor(0.3)`` (pprint of numpy/torch scalars) -> ``0.3``."""
    m = _NUMBER_WRAPPER_RE.match(value)
    return m.group(1) if m else value


# --- input checks: what was dropped or changed is counted and said ------------------------------

#: Cell texts that mean "no value" (not counted as unreadable).
_MISSING_TEXTS = frozenset({"", "nan", "none", "null", "n/a", "na", "-", "inf", "-inf", "+inf"})
#: Steps beyond this are not optimizer steps (and lose integer precision as floats).
MAX_STEP = 2**53


def _unreadable_cells(raw: pd.Series, numbers: pd.Series) -> int:
    """Cells holding something (not a missing-value text) that is not a number."""
    lost = raw.notna().to_numpy() & numbers.isna().to_numpy()
    if not lost.any():
        return 0
    texts = raw[lost].astype(str).str.strip().str.lower()
    return int((~texts.isin(_MISSING_TEXTS)).sum())


def _row_notes(out: pd.DataFrame, training: Sequence[str], unreadable: int) -> list[str]:
    """Notes on cells that are not numbers and rows without a readable step."""
    notes = []
    if unreadable:
        notes.append(
            f"{unreadable} cell(s) of known metrics were not numbers and are read as missing"
        )
    no_step = int((out[training].notna().any(axis=1) & out[C.STEP].isna()).sum())
    if no_step:
        notes.append(f"{no_step} row(s) with metrics but no readable step were dropped")
    return notes


def _checked_steps(out: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Steps beyond ``MAX_STEP`` refused; fractional steps floored, and counted; duplicates
    counted (``canonicalize`` merges them)."""
    step = out[C.STEP].to_numpy(dtype=float)
    bad = ~np.isfinite(step) | (np.abs(step) > MAX_STEP)
    if bad.any():
        worst = step[bad][np.argmax(np.abs(np.nan_to_num(step[bad], posinf=1e308)))]
        raise ImportFormatError(
            f"{int(bad.sum())} row(s) have step values such as {worst:g}, beyond 2**53: not "
            "optimizer steps (is the step column the right one?)"
        )
    notes = []
    whole = np.floor(step)
    fractional = int((whole != step).sum())
    if fractional:
        example = step[whole != step][0]
        notes.append(
            f"{fractional} row(s) had a fractional step (e.g. {example:g}): taken as its whole part"
        )
        out = out.assign(**{C.STEP: whole})
    duplicates = int(pd.Series(whole).duplicated().sum())
    if duplicates:
        notes.append(
            f"{duplicates} row(s) repeat the step of an earlier row: merged into it (the last "
            "value of each column wins)"
        )
    return out, notes


class _Lines(list):  # type: ignore[type-arg]
    """Records parsed from JSON lines, and the numbers of the lines that were not JSON objects."""

    skipped: tuple[int, ...] = ()


def _skipped_lines_note(records: Any) -> list[str]:
    skipped = getattr(records, "skipped", ())
    if not skipped:
        return []
    shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
    return [f"{len(skipped)} line(s) that are not JSON objects were skipped (line {shown})"]


# --- console-log steps ---------------------------------------------------------------------------

_BAR_RE = re.compile(r"(?<![\d/])(\d+)/(\d+) \[")
_TOTAL_STEPS_RE = re.compile(r"Total (?:optimization )?steps\s*=\s*([\d,]+)")
_NUM_EPOCHS_RE = re.compile(
    r"(?:Num Epochs\s*=\s*|num_train_epochs['\"]?\s*[=:]\s*)(\d+(?:\.\d+)?)"
)
_LOGGING_STEPS_RE = re.compile(r"\blogging_steps['\"]?\s*[=:]\s*(\d+)\b")

#: ``step_source`` of a console log -> how its steps were found (the analysis says it).
CONSOLE_STEP_SOURCES: dict[str, str] = {
    "progress_bar": "the tqdm progress bar (N/TOTAL) printed before each metric dict",
    "epoch": "each dict's epoch x steps per epoch (total steps / epochs, from the trainer banner)",
    "logging_steps": "logging_steps from the log's configuration: dict k is step k x logging_steps",
    "row_order": "nothing in the log says the step: the metric dicts are numbered 1, 2, 3, ...",
}


def console_steps(
    text: str, training: Sequence[tuple[int, Mapping[str, Any]]]
) -> tuple[list[int], str, str]:
    """The training step of each printed metric dict of a console log, from what the log says.

    ``training``: (offset in ``text``, dict) of the training dicts, in order. Returns (steps,
    ``step_source``, a sentence saying how). Tried in order: the tqdm progress bar of training
    (the bar with the most common total; bars of checkpoint loading are ignored), the dicts'
    ``epoch`` times steps per epoch, ``logging_steps`` from a configuration line, row numbers.
    A source is used only when it gives every dict a step and the steps strictly increase.
    """
    n = len(training)
    total = _training_bar_total(text, [pos for pos, _ in training])
    bars = _bar_steps(text, [pos for pos, _ in training], total)
    if n and _increasing(bars):
        return (
            [int(b) for b in bars],
            "progress_bar",
            (f"step from {CONSOLE_STEP_SOURCES['progress_bar']} (N/{total})"),
        )
    per_epoch = _steps_per_epoch(text, total)
    if n and per_epoch is not None:
        epochs = [_as_float(d.get("epoch")) for _, d in training]
        steps = [None if e is None else round(e * per_epoch) for e in epochs]
        if _increasing(steps) and steps[0] > 0:
            return (
                [int(s) for s in steps],
                "epoch",
                (
                    f"step from each dict's epoch x {per_epoch:g} steps per epoch "
                    "(total steps / epochs, from the trainer banner)"
                ),
            )
    every = _LOGGING_STEPS_RE.findall(text)
    if n and every and int(every[0]) > 0:
        k = int(every[0])
        return (
            [k * (i + 1) for i in range(n)],
            "logging_steps",
            (f"step from logging_steps = {k} in the log's configuration: dict i is step i x {k}"),
        )
    return list(range(1, n + 1)), "row_order", f"step: {CONSOLE_STEP_SOURCES['row_order']}"


def _increasing(steps: Sequence[int | None]) -> bool:
    """Every step known and strictly increasing."""
    known = [s for s in steps if s is not None]
    return len(known) == len(steps) and all(b > a for a, b in itertools.pairwise(known))


def _training_bar_total(text: str, positions: Sequence[int]) -> int | None:
    """The total of the training progress bar: the most common total among the bars that
    precede a metric dict (checkpoint-loading bars such as ``2/2 [`` precede none or few)."""
    if not positions:
        return None
    counts: dict[int, int] = {}
    prev = 0
    for pos in positions:
        last = None
        for m in _BAR_RE.finditer(text, prev, pos):
            last = m
        if last is not None:
            t = int(last.group(2))
            counts[t] = counts.get(t, 0) + 1
        prev = pos
    if not counts:
        return None
    return max(counts, key=lambda t: (counts[t], t))


def _bar_steps(text: str, positions: Sequence[int], total: int | None) -> list[int | None]:
    """For each offset, N of the last progress bar ``N/TOTAL [`` before it (any total if None)."""
    out: list[int | None] = []
    if not positions:
        return out
    bars = _BAR_RE.finditer(text, 0, positions[-1])
    bar = next(bars, None)
    last: int | None = None
    for pos in positions:
        while bar is not None and bar.start() < pos:
            if total is None or int(bar.group(2)) == total:
                last = int(bar.group(1))
            bar = next(bars, None)
        out.append(last)
    return out


def _steps_per_epoch(text: str, bar_total: int | None) -> float | None:
    """Total optimizer steps / epochs, from the trainer's banner (or the training bar's total)."""
    epochs = _NUM_EPOCHS_RE.search(text)
    totals = _TOTAL_STEPS_RE.search(text)
    total = int(totals.group(1).replace(",", "")) if totals else bar_total
    if epochs is None or not total:
        return None
    n_epochs = float(epochs.group(1))
    return total / n_epochs if n_epochs > 0 else None


def _as_float(value: Any) -> float | None:
    try:
        out = float(_scalar(value))
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


# --- helpers ------------------------------------------------------------------------------------


_NONFINITE_TEXT = frozenset({"nan", "-nan", "inf", "+inf", "-inf", "infinity", "-infinity"})


def _literal_nonfinite(series: pd.Series) -> pd.Series:
    """True where a raw cell is a literal non-finite value ('nan', 'inf', a float inf, or a
    NaN that a JSON record carried as a value: ``_frame`` keeps those as 'nan'); a blank cell
    or an absent key is not."""
    if series.dtype == object or pd.api.types.is_string_dtype(series):

        def lit(v: Any) -> bool:
            if isinstance(v, str):
                return v.strip().lower() in _NONFINITE_TEXT
            return isinstance(v, float) and math.isinf(v)  # a float NaN here is a blank cell

        return series.map(lit).astype(bool)
    if pd.api.types.is_float_dtype(series):
        return pd.Series(np.isinf(series.to_numpy()), index=series.index)
    return pd.Series(False, index=series.index)


def _frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    # a NaN a record carries as a value was logged (an absent key is missing): keep it as text
    rows = [
        {k: ("nan" if isinstance(v, float) and v != v else v) for k, v in r.items()}
        for r in records
        if isinstance(r, Mapping)
    ]
    return pd.DataFrame.from_records(rows) if rows else pd.DataFrame()


def _numeric(series: pd.Series) -> pd.Series:
    if series.dtype == bool:
        return series.astype(float)
    if series.dtype == object or pd.api.types.is_string_dtype(series):
        series = series.astype(object).map(_scalar)
    return pd.to_numeric(series, errors="coerce").astype(float)


def _scalar(value: Any) -> Any:
    """One raw cell -> something ``pd.to_numeric`` reads (unwrapped string, float for bools)."""
    if isinstance(value, str):
        return _unwrap_number(value.strip())
    if isinstance(value, bool):
        return float(value)
    return value


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
