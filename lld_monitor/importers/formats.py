"""The format readers: one small class per format, one registry, one detection path.

``detect(path)`` tries the folder rules, then every registered format's ``sniff(head)`` in
registry order; the first that says yes reads the file. ``load.load_table`` (the one "open any
run" entry point: the CLI, the analyzer and the dashboard call it) maps the result to canonical
columns.
No torch import here.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.importers.base import (
    _EXPECTED,
    _NOT_JSON,
    Format,
    Head,
    ImportFormatError,
    Run,
    _one_line,
)
from lld_monitor.importers.names import (
    _LOOKUP,
    _is_training_key,
    canonical_name,
)
from lld_monitor.importers.notebook import has_outputs, notebook_tables, pick_table
from lld_monitor.importers.parts import (
    EVAL_TYPES,
    is_eval_name,
    run_bounds,
)
from lld_monitor.importers.plain import parse_iterations, parse_plain, sniff_plain
from lld_monitor.importers.table import _frame, _skipped_lines_note
from lld_monitor.importers.text import (
    _ANSI_RE,
    _VERL_LINE_RE,
    _as_float,
    _bar_steps,
    _find_printed_dicts,
    _is_summary,
    _printed_dicts_at,
    console_steps,
    parse_verl_console,
)
from lld_monitor.importers.wandb_run import IDENT as WANDB_IDENT
from lld_monitor.importers.wandb_run import (
    is_wandb_run_dir,
    read_wandb_history,
    summary_row,
    wandb_file_of,
)

_TB_NAME = "tfevents"

# --- what the formats look at -------------------------------------------------------------------


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
    if "{" in first or "}" in first:
        return None  # (a console line with a printed dict, not a table's header)
    fields = [f.strip().strip('"') for f in first.split(sep)]
    if fields and _is_index_name(fields[0]):
        fields = fields[1:]  # (a table saved by pandas with its index: a first, unnamed column)
    if len(fields) < 2 or not all(fields):
        return None
    if not any(canonical_name(f) or " - " in f for f in fields):
        return None
    return fields


def _is_index_name(field: str) -> bool:
    """The header of an index column that pandas wrote (``df.to_csv(path)``): empty, or the
    ``Unnamed: 0`` that a frame read back and saved again carries."""
    return field == "" or re.fullmatch(r"Unnamed: \d+", field) is not None


def _drop_index(table: pd.DataFrame) -> pd.DataFrame:
    """The table without a first column that is pandas' saved index (read as ``Unnamed: 0``),
    with a note saying so."""
    if not len(table.columns) or not _is_index_name(str(table.columns[0]).strip()):
        return table
    out = table.iloc[:, 1:]
    out.attrs["import_notes"] = [
        *table.attrs.get("import_notes", []),
        "the first column is an index that pandas saved with the table (no header): dropped",
    ]
    return out


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


def _csv_fields(head: Head) -> list[str] | None:
    """The header fields of a CSV/TSV naming a known metric (complete heads: it must parse)."""
    if not head.complete:
        return _csv_header(head.first_line)
    table = _csv_table(head)
    return None if table is None else [str(c) for c in table.columns]


def _csv_table(head: Head) -> pd.DataFrame | None:
    if "csv_table" not in head.__dict__:
        if head.complete:  # parsed from the file: a large table is never held as text too
            table = _read_csv(head.path, head.first_line)
        else:
            table = _sniff_csv(head.text)
        head.__dict__["csv_table"] = None if table is None else _drop_index(table)
    return head.__dict__["csv_table"]


def _read_csv(path: Path, first_line: str) -> pd.DataFrame | None:
    """The whole file as ``_sniff_csv`` reads a text (None when the header names no known
    metric or it does not parse)."""
    if _csv_header(first_line) is None:
        return None
    sep = "\t" if first_line.count("\t") > first_line.count(",") else ","
    kw: dict[str, Any] = {
        "sep": sep,
        "keep_default_na": False,
        "na_values": [""],
        "encoding": "utf-8-sig",
        "encoding_errors": "replace",
    }
    try:
        if path.stat().st_size > CSV_CHUNK_BYTES:
            frame = _read_numeric_csv(path, kw)
            if frame is not None:
                return frame
        return pd.read_csv(path, **kw)
    except (ValueError, csv.Error, UnicodeError, OSError):
        return None


#: A CSV larger than this is parsed in chunks of ``CSV_CHUNK_ROWS`` rows when every column is
#: numeric (a W&B history export): the parser's buffers stay one chunk's size.
CSV_CHUNK_BYTES = 16 << 20
CSV_CHUNK_ROWS = 16384


def _read_numeric_csv(path: Path, kw: dict[str, Any]) -> pd.DataFrame | None:
    """The whole CSV, parsed chunk by chunk, when every chunk parses every column as numbers
    (int64/float64): the frame ``pd.read_csv`` gives (a column int in one chunk and float in
    another is float, as read whole); None at the first other column (text, bool: those are
    read whole, so that a column's type is decided over all its cells).

    Each column is one array sized by the file's line count (an upper bound of its rows), filled
    chunk by chunk: the table is never held twice (chunk arrays and their join)."""
    numeric = (np.dtype(np.int64), np.dtype(np.float64))
    bound = _count_lines(path)
    cols: dict[str, np.ndarray] | None = None
    names: list[str] = []
    n = 0
    with pd.read_csv(path, chunksize=CSV_CHUNK_ROWS, **kw) as chunks:
        for chunk in chunks:
            if any(dt not in numeric for dt in chunk.dtypes):
                return None
            if cols is None:
                names = list(chunk.columns)
                if len(set(names)) != len(names):
                    return None
                cols = {c: np.empty(bound, dtype=chunk[c].dtype) for c in names}
            m = len(chunk)
            if n + m > bound:  # (lines the count missed, e.g. a lone carriage return)
                return None
            for c in names:
                part = chunk[c].to_numpy()
                if part.dtype != cols[c].dtype and part.dtype == np.float64:
                    # an int column with decimals from here on: float64 (the values so far
                    # cast as np.concatenate would cast them)
                    cols[c] = cols[c].astype(np.float64)
                cols[c][n : n + m] = part
            n += m
    if cols is None:
        return None
    # (the unused tail is the header and blank lines: a view, unless it is a sizable share)
    short = bound - n > max(1024, n // 100)
    return pd.DataFrame({c: a[:n].copy() if short else a[:n] for c, a in cols.items()}, copy=False)


def _count_lines(path: Path) -> int:
    """Line breaks in the file, plus one (its last line may have none)."""
    count = 1
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            count += block.count(b"\n")
    return count


def _step_source(frame: pd.DataFrame) -> str:
    """'logged' when a column maps to ``step``, else 'row_order' (canonicalize numbers rows)."""
    return "logged" if any(canonical_name(c) == C.STEP for c in frame.columns) else "row_order"


def _full(path: Path, head: Head | None) -> Head:
    return head if head is not None and head.complete else Head(path, complete=True)


#: Fields that say what kind of record a JSON line is (``{"type": "train", ...}`` next to
#: ``{"type": "eval", ...}``); a record of an evaluation kind (``parts.EVAL_TYPES``) is kept apart.
_RECORD_KIND_KEYS = ("type", "split", "mode", "kind", "event", "stage", "phase", "tag")


def _flat(rec: Mapping[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for k, v in rec.items():
        if type(v) is dict:
            _flat(v, f"{prefix}{k}/", out)
        else:
            out[f"{prefix}{k}"] = v


def _metric_record(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """One JSON record as a flat metric row: nested objects joined with "/" (``{"env": {"all":
    {"reward": ...}}}`` -> ``env/all/reward``); a typed record of an evaluation kind has its
    metrics renamed ``eval/<key>`` (its step and time kept) so that they stay apart."""
    kinds = [k for k in _RECORD_KIND_KEYS if k in rec and isinstance(rec[k], str)]
    if not kinds and not any(type(v) is dict for v in rec.values()):  # (json gives dicts)
        return rec
    flat: dict[str, Any] = {}
    _flat(rec, "", flat)
    if not kinds:
        return flat
    words = set(re.findall(r"[a-z]+", str(rec[kinds[0]]).lower()))  # ("eval_end", "val-step")
    for k in kinds:
        flat.pop(k, None)
    _own_step(flat)
    if not words & EVAL_TYPES:
        return flat
    keep = {C.STEP, C.TIME}
    return {
        (k if (_LOOKUP.get(k, ("",))[0] in keep or is_eval_name(k)) else f"eval/{k}"): v
        for k, v in flat.items()
    }


#: A typed record's own step field (``rollout_step``, ``train/step``, ``iteration``), where it
#: has no field that is a step by name (``step``, ``global_step``, ``_step``).
_OWN_STEP_RE = re.compile(r"(?i)^(?:[a-z]+[_/.])?(?:step|iteration|iter)$")


def _own_step(flat: dict[str, Any]) -> None:
    """Rename a typed record's own step field to ``step`` (in place), so that the records of
    one training step (its rollout, its update) merge into one row by their step."""
    if any(_LOOKUP.get(k, ("",))[0] == C.STEP for k in flat):
        return
    own = next((k for k in flat if _OWN_STEP_RE.match(k)), None)
    if own is not None:
        flat[C.STEP] = flat.pop(own)


def _read_records(
    records: Sequence[Mapping[str, Any]], text: str | None = None
) -> tuple[pd.DataFrame, str]:
    """``text``: the file's text, when the records are all of it: a file with one ``{`` per
    record and no kind field needs no record looked at (a long flat JSONL)."""
    plain = text is not None and (
        text.count("{") == len(records) and not any(f'"{k}"' in text for k in _RECORD_KIND_KEYS)
    )
    frame = _frame(records if plain else [_metric_record(r) for r in records])
    frame.attrs["import_notes"] = _skipped_lines_note(records)
    return frame, _step_source(frame)


def _read_printed(text: str) -> tuple[pd.DataFrame, str]:
    """Every training dict of ``text`` as one run (a notebook's printed dicts)."""
    return _read_printed_runs(text, split=False)[0]


def _read_printed_runs(text: str, *, split: bool = True) -> list[tuple[pd.DataFrame, str]]:
    """The runs of a console log of printed TRL dicts, each with its own steps (``console_steps``
    on its own stretch of the text). A new run starts where the progress bar's count (else the
    dicts' epoch) goes back to the run's beginning (``parts.run_bounds``); a log with neither
    is cut after each end-of-training summary dict (``train_runtime``) that training dicts
    follow. ``split=False``: one run of every training dict."""
    training: list[tuple[int, dict[str, Any]]] = []
    cuts: set[int] = set()
    finished = False
    for pos, d in _printed_dicts_at(text):
        if _is_summary(d):
            finished = finished or "train_runtime" in d
            continue
        if not any(map(_is_training_key, d)):
            continue
        if finished and training and split:
            cuts.add(len(training))
        finished = False
        training.append((pos, d))
    if split:
        counters = list(_bar_steps(text, [pos for pos, _ in training], None))
        if any(c is None for c in counters):
            counters = [_as_float(d.get("epoch")) for _, d in training]
        if training and all(c is not None for c in counters):  # (a resumed run's counter)
            cuts = set(run_bounds([float(c) for c in counters if c is not None]))
    edges = [0, *sorted(cuts), len(training)]
    out: list[tuple[pd.DataFrame, str]] = []
    for a, b in itertools.pairwise(edges):
        start = training[a - 1][0] + 1 if a > 0 else 0
        end = training[b][0] if b < len(training) else len(text)
        seg = [(pos - start, d) for pos, d in training[a:b]]
        steps, source, how = console_steps(text[start:end], seg)
        frame = _frame([{**d, C.STEP: step} for (_, d), step in zip(seg, steps)])
        frame.attrs["step_note"] = how
        out.append((frame, source))
    return out or [(_frame([]), "row_order")]


# --- the formats, in the order they are tried ---------------------------------------------------


#: Suffixes of console logs (a terminal capture in markdown too): taken for runs only when their
#: content is a known format, so a README or a library's debug log is not listed.
CONSOLE_SUFFIXES = frozenset({".log", ".out", ".md", ".txt"})


class LldRun(Format):
    name = "lld_run"
    description = "an lld_monitor run folder (meta.json + steps.jsonl)"

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        from lld_monitor.runlog import RunFormatError, load_run

        try:
            run = load_run(path, warn=False)  # (skipped lines: a note, not a Python warning)
        except RunFormatError as exc:
            raise ImportFormatError(
                f"{path}: cannot read this lld_monitor run folder ({_one_line(exc)})"
            ) from exc
        frame = run.steps.copy()
        bad = {k: v for k, v in run.skipped_lines.items() if v}
        if bad:
            frame.attrs["import_notes"] = [
                f"skipped {sum(bad.values())} garbled or torn line(s) of the run log ("
                + ", ".join(f"{v} in {k}" for k, v in bad.items())
                + "): the rows around them are kept"
            ]
        return frame, "logged"


class TensorBoard(Format):
    name = "tensorboard"
    rank = 20
    description = "a TensorBoard event folder or events.out.tfevents.* file"

    def sniff(self, head: Head) -> bool:
        return _TB_NAME in head.path.name

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
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


class Parquet(Format):
    name = "parquet"
    rank = 30
    suffixes = frozenset({".parquet"})
    description = "a Parquet table with canonical column names"

    def sniff(self, head: Head) -> bool:
        return head.magic == b"PAR1"

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        frame = pd.read_parquet(path)
        return frame, _step_source(frame)


class TrlTrainerState(Format):
    name = "trl_trainer_state"
    rank = 40
    suffixes = frozenset({".json"})
    description = "a TRL/transformers trainer_state.json (log_history)"

    def sniff(self, head: Head) -> bool:
        if not head.complete:
            return head.text[:1] == "{" and '"log_history"' in head.text
        doc = head.json_doc
        if doc is _NOT_JSON:  # cut off mid-write? (read says so); not one JSON object a line
            start, _ = head._start
            return head.lead == "{" and '"log_history"' in start and head.first_record is None
        return isinstance(doc, dict) and isinstance(doc.get("log_history"), list)

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        doc = _full(path, head).json_doc
        if doc is _NOT_JSON:
            raise ImportFormatError(
                f"{path}: a trainer_state.json that is invalid JSON (cut off? the job may have "
                "been killed while saving it): read an earlier checkpoint's, or the output "
                "folder (its latest complete checkpoint is read)"
            )
        return _read_records(doc["log_history"])


class NotebookLog(Format):
    name = "notebook_log"
    rank = 50
    suffixes = frozenset({".ipynb"})
    description = (
        "a Jupyter/Colab notebook (.ipynb: its training tables, or TRL's printed metric dicts) "
        "or a notebook stream log"
    )

    def sniff(self, head: Head) -> bool:
        if head.path.suffix.lower() == ".ipynb":
            return True  # (read says what is wrong with one that does not parse)
        if not head.complete:
            text = head.text
            if text[:1] == "{":
                return '"cells"' in text and '"nbformat"' in text
            return text[:1] == "[" and ('"stream_name"' in text or '"output_type"' in text)
        doc = head.json_doc
        if isinstance(doc, dict) and isinstance(doc.get("cells"), list):
            return True
        return head.doc_records is not None and any(map(_is_stream_record, head.doc_records))

    def text(self, head: Head) -> str:
        """The notebook's stream output, in cell order: the console log it holds."""
        doc = head.json_doc
        if isinstance(doc, dict) and isinstance(doc.get("cells"), list):
            return _notebook_text(doc)
        return "".join(_stream_text(r) for r in head.doc_records or [])

    def runs(self, path: Path, head: Head | None = None) -> list[str]:
        """One run, named by the number of the training table read by default (the last with
        a reward column); "1" for printed dicts. ``--run N`` may pick any other table."""
        doc = _full(path, head).json_doc
        if isinstance(doc, dict) and isinstance(doc.get("cells"), list) and has_outputs(doc):
            tables = notebook_tables(doc)
            if tables:
                return [str(pick_table(tables)[0].number)]
        return ["1"]

    def load_runs(self, path: Path, head: Head | None = None) -> list[Run]:
        full = _full(path, head)
        return [(name, *self.read(path, full, run=name)) for name in self.runs(path, full)]

    def read(
        self, path: Path, head: Head | None = None, run: str | None = None
    ) -> tuple[pd.DataFrame, str]:
        """The notebook's training table (``notebook.pick_table``: ``run`` = its number), else
        the metric dicts TRL printed into its stream output."""
        full = _full(path, head)
        doc = full.json_doc
        if doc is _NOT_JSON and path.suffix.lower() == ".ipynb":
            raise ImportFormatError(
                f"{path}: a notebook (.ipynb) that is not valid JSON: cut short or still being "
                "saved? Save it again (Jupyter: File > Save; Colab: File > Download .ipynb) "
                "and analyse the new file"
            )
        if isinstance(doc, dict) and isinstance(doc.get("cells"), list):
            if not has_outputs(doc):
                raise ImportFormatError(
                    f"{path}: the notebook was saved without outputs, so it holds no training "
                    "log: re-run it, or save it with outputs (Colab: Edit > Notebook settings, "
                    "untick 'Omit code cell output'), and analyse it again"
                )
            tables = notebook_tables(doc)
            if tables:
                table, notes = pick_table(tables, run)
                frame = table.frame()
                frame.attrs["import_notes"] = notes
                frame.attrs["step_note"] = (
                    f"step from the Step column of the notebook's training table {table.number}"
                )
                return frame, "logged"
        if run not in (None, "1"):
            raise ImportFormatError(
                f"{path}: --run picks one of a notebook's training tables, and this one has "
                "none (it is read from the metric dicts printed in its output)"
            )
        return _read_printed(self.text(full))


class WandbRun(Format):
    name = "wandb_run"
    rank = 10
    suffixes = frozenset({".wandb"})
    description = (
        "a W&B run folder (wandb/run-*, offline-run-*, latest-run: the history in its "
        "run-*.wandb file) or a .wandb file"
    )

    def sniff(self, head: Head) -> bool:
        return head.magic == WANDB_IDENT

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        """The history of the run's ``.wandb`` file; without one, ``files/output.log`` (the
        console), then ``files/wandb-summary.json`` (one row); the notes say which."""
        folder = path if path.is_dir() else path.parent
        source = path if path.is_file() else wandb_file_of(path)
        extras = [
            f"files/{name}"
            for name in ("output.log", "wandb-summary.json")
            if path.is_dir() and (folder / "files" / name).is_file()
        ]
        also = f"; also there: {', '.join(extras)}" if extras else ""
        notes: list[str] = []
        if source is not None:
            rows, notes = read_wandb_history(source)
            if rows:
                frame = _frame(rows)
                frame.attrs["import_notes"] = [
                    f"read the W&B history from {source.name} ({len(rows)} rows){also}",
                    *notes,
                ]
                return frame, _step_source(frame)
            notes = [f"{source.name} holds no history rows", *notes]
        console = folder / "files" / "output.log"
        if path.is_dir() and console.is_file():
            try:
                fmt, chead = detect(console)
                frame, step_source = fmt.read(console, chead)
            except ImportFormatError as exc:
                notes.append(f"files/output.log: {_one_line(exc)}")
            else:
                why = "; ".join(notes) if notes else "no run-*.wandb file"
                frame.attrs["import_notes"] = [
                    f"read the console log files/output.log ({fmt.description}): {why}",
                    *frame.attrs.get("import_notes", []),
                ]
                return frame, step_source
        summary = folder / "files" / "wandb-summary.json"
        if path.is_dir() and summary.is_file():
            frame = _frame([summary_row(summary)])
            frame.attrs["import_notes"] = [
                "read only files/wandb-summary.json (the run's last values, one row): "
                + ("; ".join(notes) if notes else "no run-*.wandb file and no console metrics")
            ]
            return frame, "row_order"
        raise ImportFormatError(
            f"{path}: a W&B run folder with no history to read ({'; '.join(notes) or 'no '}"
            "run-*.wandb file, no files/output.log with metrics, no files/wandb-summary.json)"
        )


class VerlJsonl(Format):
    name = "verl_jsonl"
    rank = 60
    suffixes = frozenset({".jsonl"})
    description = 'a verl file-logger JSONL ({"step": ..., "data": {...}} per line)'
    appendable = True

    def sniff(self, head: Head) -> bool:
        if not head.complete:
            rec = head.first_record if head.text[:1] == "{" else None
            return isinstance(rec, dict) and _is_verl_record(rec)
        records = head.records
        return bool(records) and all(map(_is_verl_record, records))

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        records = _full(path, head).records or []
        rows = [{**dict(r["data"]), C.STEP: r["step"]} for r in records]
        frame = _frame(rows)
        frame.attrs["import_notes"] = _skipped_lines_note(records)
        return frame, "logged"


class LogHistory(Format):
    name = "log_history"
    rank = 70
    suffixes = frozenset({".json"})
    description = "a JSON list of log_history-style metric dicts"

    def sniff(self, head: Head) -> bool:
        if not head.complete:  # (a JSON list of objects; not a "[INFO] ..." console line)
            return head.text[:1] == "[" and head.text[1:].lstrip()[:1] in ("{", "]")
        return head.doc_records is not None and head.stripped.startswith("[")

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        full = _full(path, head)
        return _read_records(full.records or [], full.stripped)


class Jsonl(Format):
    name = "jsonl"
    rank = 80
    suffixes = frozenset({".jsonl"})
    description = "a JSONL table with canonical column names"
    appendable = True

    def sniff(self, head: Head) -> bool:
        if not head.complete:
            return head.text[:1] == "{" and isinstance(head.first_record, dict)
        return head.records is not None

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        full = _full(path, head)
        return _read_records(full.records or [], full.stripped)


#: A console line that ends in a JSON metrics record: ROLL's stdout tracker prints
#: ``metrics_tag: {"step": 12, "metrics": {"critic/score/mean": 0.4, ...}}`` through its logger
_CONSOLE_JSON_RE = re.compile(r'(\{"step"\s*:.*\})\s*$', re.MULTILINE)


def _console_json_rows(text: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The metric rows of the JSON records printed at the end of console lines: ``step`` and
    the record's ``metrics`` (or ``data``) object flattened with "/"; at most ``limit``."""
    rows: list[dict[str, Any]] = []
    for m in _CONSOLE_JSON_RE.finditer(text):
        try:
            rec = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        inner = rec.get("metrics", rec.get("data")) if isinstance(rec, dict) else None
        if not isinstance(inner, dict):
            continue
        row: dict[str, Any] = {}
        _flat(inner, "", row)
        row[C.STEP] = rec["step"]
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    return rows


class ConsoleJson(Format):
    name = "console_json"
    rank = 110
    maybe_suffixes = CONSOLE_SUFFIXES
    description = (
        'a console log whose lines end in JSON metrics records (ROLL: metrics_tag: {"step": '
        '12, "metrics": {...}})'
    )
    appendable = True

    def sniff(self, head: Head) -> bool:
        text = head.text
        return '{"step"' in text and bool(_console_json_rows(text, limit=1))

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        return _frame(_console_json_rows(_full(path, head).text)), "logged"


class VerlConsole(Format):
    name = "verl_console"
    rank = 120
    maybe_suffixes = CONSOLE_SUFFIXES
    description = "a verl console log (step:N - actor/grad_norm:... lines)"
    appendable = True

    def sniff(self, head: Head) -> bool:
        text = head.text
        return "step:" in text and _VERL_LINE_RE.search(_ANSI_RE.sub("", text)) is not None

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        return _frame(parse_verl_console(_full(path, head).text)), "logged"


class TrlConsole(Format):
    name = "trl_console"
    rank = 130
    maybe_suffixes = CONSOLE_SUFFIXES
    description = (
        "a console log or terminal capture with printed metric dicts (TRL, OpenRLHF, slime, SkyRL)"
    )
    appendable = True

    def sniff(self, head: Head) -> bool:
        return bool(_find_printed_dicts(head.text))

    def text(self, head: Head) -> str:
        return head.text

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        return _read_printed(self.text(_full(path, head)))

    def load_runs(self, path: Path, head: Head | None = None) -> list[Run]:
        runs = _read_printed_runs(self.text(_full(path, head)))
        return [(str(i), frame, source) for i, (frame, source) in enumerate(runs, start=1)]


class PlainConsole(Format):
    name = "plain_console"
    rank = 140
    maybe_suffixes = CONSOLE_SUFFIXES
    description = (
        "a plain training-loop log (step 10 | loss 0.12 | reward 0.45 | acc 0.40 lines, "
        "printed reward tensors)"
    )
    appendable = True

    def sniff(self, head: Head) -> bool:
        return sniff_plain(head.text)

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        text = _full(path, head).text
        rows = parse_plain(text)
        if not rows:  # (no step printed: one row per iteration)
            frame = _frame(parse_iterations(text))
            frame.attrs["step_note"] = (
                "no step printed: one row per iteration, numbered 1, 2, 3, ... (an iteration "
                "ends where one of its metrics is printed again)"
            )
            return frame, "row_order"
        frame = _frame(rows)
        return frame, "logged" if C.STEP in frame.columns else "row_order"


class WandbCsv(Format):
    name = "wandb_csv"
    several = True  # (a panel export of several runs)
    rank = 90
    suffixes = frozenset({".csv"})
    maybe_suffixes = frozenset({".tsv"})
    description = "a W&B history export (CSV with _step, train/reward, ...)"

    def sniff(self, head: Head) -> bool:
        fields = _csv_fields(head)
        return fields is not None and _csv_kind(fields) == self.name

    def runs(self, path: Path, head: Head | None = None) -> list[str]:
        """The run names of a panel export of several runs (from the header line), else
        ["1"]."""
        first = head.first_line if head is not None else Head(path, complete=False).first_line
        names = panel_runs(_csv_header(first) or [])
        return names if len(names) > 1 else ["1"]

    def load_runs(self, path: Path, head: Head | None = None) -> list[Run]:
        full = _full(path, head)
        return [(name, *self.read(path, full, run=name)) for name in self.runs(path, full)]

    def read(
        self, path: Path, head: Head | None = None, run: str | None = None
    ) -> tuple[pd.DataFrame, str]:
        """W&B history export; a panel export ("Step", "<run> - <metric>", "__MIN/__MAX") too.
        A panel export of several runs: ``run`` (a run's name), else the first, with a note
        naming the others; never a merge."""
        table = _csv_table(_full(path, head))
        if table is None:
            raise ImportFormatError(f"{path}: not a CSV table with a known metric")
        names = panel_runs(table.columns)
        notes: list[str] = list(table.attrs.get("import_notes", []))
        chosen = None
        if run == "1" and len(names) < 2:
            run = None  # (the one run of a history export)
        if run is not None:
            if run not in names:
                listed = ", ".join(names) if names else "none (one run, no '<run> - ' columns)"
                raise ImportFormatError(f"{path}: --run {run!r}: the export's runs are {listed}")
            chosen = run
        elif len(names) > 1:
            chosen = names[0]
            notes.append(
                f"a W&B export of {len(names)} runs: read {chosen!r}; also there: "
                f"{', '.join(names[1:])} (pick one with --run NAME; analysing the file lists them)"
            )
        renamed = {}
        for col in table.columns:
            name = str(col)
            if name.endswith(("__MIN", "__MAX")):
                continue
            if " - " in name:
                owner, name = name.split(" - ", 1)
                if chosen is not None and owner != chosen:
                    continue
            renamed[col] = name
        table = table[list(renamed)].rename(columns=renamed)
        frame = table.loc[:, ~table.columns.duplicated()]
        if run is not None:
            notes.append(f"read run {run!r} of the W&B export's {len(names)}: as asked")
        frame.attrs["import_notes"] = notes
        return frame, "logged"


def panel_runs(columns: Any) -> list[str]:
    """The run names of a W&B panel export's ``<run> - <metric>`` columns, in column order."""
    names: list[str] = []
    for col in columns:
        name = str(col)
        if " - " in name and not name.endswith(("__MIN", "__MAX")):
            owner = name.split(" - ", 1)[0]
            if owner not in names:
                names.append(owner)
    return names


class Csv(Format):
    name = "csv"
    rank = 100
    suffixes = frozenset({".csv"})
    maybe_suffixes = frozenset({".tsv"})
    description = "a CSV table with canonical column names"

    def sniff(self, head: Head) -> bool:
        fields = _csv_fields(head)
        return fields is not None and _csv_kind(fields) == self.name

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        table = _csv_table(_full(path, head))
        if table is None:
            raise ImportFormatError(f"{path}: not a CSV table with a known metric")
        return table, _step_source(table)


#: Every format, in the order of ``FORMATS``: register a new one here (its class declares
#: its rank in detection, its suffixes and its runs: ``base.Format``).
REGISTRY: tuple[Format, ...] = (
    LldRun(),
    TensorBoard(),
    Parquet(),
    WandbRun(),
    TrlTrainerState(),
    LogHistory(),
    NotebookLog(),
    VerlJsonl(),
    Jsonl(),
    ConsoleJson(),
    VerlConsole(),
    TrlConsole(),
    PlainConsole(),
    WandbCsv(),
    Csv(),
)
_BY_NAME: dict[str, Format] = {f.name: f for f in REGISTRY}
#: The order ``detect`` sniffs a file in: each format's ``rank`` (the binary formats, the JSON
#: ones, most specific first, CSV, the console logs last).
_SNIFFED: tuple[Format, ...] = tuple(
    sorted((f for f in REGISTRY if f.rank is not None), key=lambda f: f.rank or 0)
)
#: Suffixes of loose files taken for runs (listed even when they do not read), and those taken
#: only when their content is a known format (a console log, a markdown capture, a TSV): the
#: formats' own declarations.
LOG_SUFFIXES: frozenset[str] = frozenset().union(*(f.suffixes for f in REGISTRY))
MAYBE_LOG_SUFFIXES: frozenset[str] = (
    frozenset().union(*(f.maybe_suffixes for f in REGISTRY)) - LOG_SUFFIXES
)

#: format name -> what it is (the names ``detect_format`` returns).
FORMATS: dict[str, str] = {f.name: f.description for f in REGISTRY}


def reader(name: str) -> Format:
    """The registered format called ``name`` (a ``FORMATS`` key)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"format must be one of {sorted(_BY_NAME)}, got {name!r}") from None


# --- detection ----------------------------------------------------------------------------------


def detect(path: Path, *, complete: bool = True) -> tuple[Format, Head | None]:
    """(format, the head it was sniffed from; None for a folder) of ``path``.

    ``complete=False`` sniffs a file from its first ``SNIFF_BYTES`` only. Raises
    ImportFormatError, saying what was expected.
    """
    if not path.exists():
        raise ImportFormatError(f"{path}: no such file or folder; {_EXPECTED}")
    if path.is_dir():
        return _detect_folder(path)
    head = Head(path, complete=complete)
    for fmt in _SNIFFED:
        if fmt.sniff(head):
            return fmt, head
    where = "" if complete else " (from its first MiB)"
    try:
        hint = framework_hint(head.text)
    except ImportFormatError:
        hint = ""
    raise ImportFormatError(f"{path}: unknown format{where}; {hint}{_EXPECTED}")


#: What each RL framework's log names (a marker in its text) -> (the framework, the metric
#: lines its logger writes, which this file lacks). docs/importers.md, "Frameworks".
FRAMEWORK_MARKERS: tuple[tuple[str, str, str], ...] = (
    (r"verl|TaskRunner", "verl", "'step:N - key:value' lines (its console logger)"),
    (r"openrlhf|OpenRLHF", "OpenRLHF", "'Global step N: {...}' lines (ppo_trainer.py)"),
    (r"\bslime\b", "slime", "'step N: {...}' / 'rollout N: {...}' lines"),
    (r"skyrl|SkyRL", "SkyRL", "'Step N:' and a printed dict (trainer.logger=console)"),
    (r"nemo_rl|NeMo-RL|NeMo RL", "NeMo-RL", "'Step N/M' banners and '• Avg Reward:' lines"),
    (r"areal|AReaL|StatsLogger", "AReaL", "'Train step N/M done.' and its stats table"),
    (r"prime_rl|prime-rl", "prime-rl", "'Step N | ... | Reward x |' lines"),
    (r"metrics_tag|\broll\.", "ROLL", '\'metrics_tag: {"step": N, "metrics": {...}}\' lines'),
    (r"open_instruct|open-instruct", "Open-Instruct", "its W&B history (training_step, scores)"),
    (r"tinker_cookbook|tinker", "Tinker cookbook", 'metrics.jsonl ({"step": N, ...} lines)'),
    (r"unsloth|Unsloth", "Unsloth", "TRL's printed dicts or the notebook's training table"),
    (r"GRPOTrainer|trl\b", "TRL", "printed dicts {'loss': ..., 'reward': ...} after tqdm bars"),
)


def framework_hint(text: str) -> str:
    """'looks like a <framework> log ...; ' for a file no reader accepts whose text names a
    framework (what its logger writes, which the file lacks), else ''."""
    head = text[:SNIFF_HINT_CHARS]
    for marker, name, lines in FRAMEWORK_MARKERS:
        m = re.search(marker, head)
        if m is not None:
            return (
                f"it looks like a log of {name} (it names {m.group(0)!r}) "
                f"but holds none of the metric lines its logger writes: {lines}; was the "
                "metrics logger off, or is this another process's log? "
            )
    return ""


SNIFF_HINT_CHARS = 1 << 16


def checkpoint_states(path: Path) -> tuple[Path | None, int, list[str]]:
    """(the ``trainer_state.json`` of the latest complete checkpoint of an output folder, how
    many ``checkpoint-N/trainer_state.json`` it holds, a line per later one that does not parse).

    Each checkpoint's trainer_state.json holds the run's whole log history up to it: the run is
    its latest checkpoint, an earlier one is not a second run. One cut off mid-write (the job
    was killed while saving) is passed over, and named."""
    found = []
    for p in path.glob("checkpoint-*/trainer_state.json"):
        tail = p.parent.name.removeprefix("checkpoint-")
        if tail.isdigit() and p.is_file():
            found.append((int(tail), p))
    skipped: list[str] = []
    for _, p in sorted(found, reverse=True):
        try:
            st = p.stat()
            why = _state_problem(str(p), st.st_mtime_ns, st.st_size)
        except OSError:
            why = "unreadable"
        if why is None:
            return p, len(found), skipped
        skipped.append(f"{p.parent.name}/{p.name}: {why}")
    return None, len(found), skipped


@functools.lru_cache(maxsize=64)
def _state_problem(path: str, mtime_ns: int, size: int) -> str | None:
    """What keeps a checkpoint's trainer_state.json from being read (None: nothing), parsed
    once per version of the file (its detection and the folder's notes both ask)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, json.JSONDecodeError):
        return "invalid JSON (cut off?)"
    if isinstance(doc, dict) and isinstance(doc.get("log_history"), list):
        return None
    return "no log_history"


def _detect_folder(path: Path) -> tuple[Format, Head | None]:
    if _is_run_dir(path):
        return _BY_NAME["lld_run"], None
    if is_wandb_run_dir(path):
        return _BY_NAME["wandb_run"], None
    if any(_TB_NAME in p.name for p in path.rglob("*") if p.is_file()):
        return _BY_NAME["tensorboard"], None
    state = path / "trainer_state.json"
    if state.is_file():
        return detect(state)
    latest, _, _ = checkpoint_states(path)
    if latest is not None:  # (a TRL output folder of checkpoints: the run is its latest)
        return detect(latest)
    if (path / "meta.json").is_file():  # a run without steps.jsonl: load_run says what is amiss
        return _BY_NAME["lld_run"], None
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
        f"{path}: folder holds no run log, TensorBoard events or trainer_state.json; {_EXPECTED}"
    )
