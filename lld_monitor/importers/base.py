"""What every format reader shares: the error it raises, the file head it sniffs, its base class.

A format is one small class (``formats.py``) with ``sniff(head) -> bool`` (is this file mine?)
and ``read(path) -> (frame, step_source)``; ``Head`` reads and parses a file's start at most once,
whichever formats look at it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

#: Files larger than this are sniffed from their first ``SNIFF_BYTES`` by ``detect_format``.
SNIFF_BYTES = 1 << 20
_START_BYTES = 1 << 16  # what a complete head reads to tell a JSON file from a table

_EXPECTED = (
    "expected an lld_monitor run folder, a CSV/Parquet/JSONL table, a TRL trainer_state.json or "
    "log_history JSON, a console/notebook log with TRL metric dicts, a W&B history CSV, a "
    "TensorBoard event folder, a verl console/file log, or the console log of OpenRLHF, slime, "
    "SkyRL, NeMo-RL, AReaL, prime-rl or ROLL"
)

_NOT_JSON = object()  # Head.json_doc when the text does not parse as one JSON document


class ImportFormatError(ValueError):
    """The file is unreadable or in no format ``load_table`` knows; the message is one line."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class _Lines(list):  # type: ignore[type-arg]
    """Records parsed from JSON lines, and the numbers of the lines that were not JSON objects."""

    skipped: tuple[int, ...] = ()


class Head:
    """The start of one file as the formats sniff it, each view parsed once on first use.

    ``complete``: the whole file (``load_table``; the sniffing is exact); else its first
    ``SNIFF_BYTES`` (``detect_format`` on a large file: the same rules on the start alone).
    """

    def __init__(self, path: Path, *, complete: bool) -> None:
        self.path = path
        self.complete = complete

    @functools.cached_property
    def magic(self) -> bytes:
        """The first four bytes (``PAR1`` for Parquet)."""
        return self.raw[:4] if not self.complete else self._read_bytes(4)

    @functools.cached_property
    def raw(self) -> bytes:
        """The first ``SNIFF_BYTES`` (a partial head only)."""
        return self._read_bytes(SNIFF_BYTES)

    def _read_bytes(self, n: int) -> bytes:
        try:
            with self.path.open("rb") as fh:
                return fh.read(n)
        except OSError as exc:
            raise ImportFormatError(
                f"{self.path}: cannot read ({_one_line(exc)}); {_EXPECTED}"
            ) from exc

    @functools.cached_property
    def text(self) -> str:
        """The text (a partial head: stripped of leading blanks); binary or empty: an error."""
        if not self.complete:
            if b"\x00" in self.raw[:4096]:
                raise ImportFormatError(f"{self.path}: binary file of unknown format; {_EXPECTED}")
            return self.raw.decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace").lstrip("\ufeff")
        except OSError as exc:
            raise ImportFormatError(
                f"{self.path}: cannot read ({_one_line(exc)}); {_EXPECTED}"
            ) from exc
        if "\x00" in text[:4096]:
            raise ImportFormatError(f"{self.path}: binary file of unknown format; {_EXPECTED}")
        if not text.lstrip():
            raise ImportFormatError(f"{self.path}: empty file (nothing logged yet?); {_EXPECTED}")
        return text

    @functools.cached_property
    def stripped(self) -> str:
        return self.text.lstrip()

    @functools.cached_property
    def _start(self) -> tuple[str, bool]:
        """The text of the first ``_START_BYTES`` and whether that is the whole file (a
        complete head's cheap view: a large CSV is sniffed without reading it whole)."""
        if not self.complete:
            return self.text, True
        raw = self._read_bytes(_START_BYTES)
        text = raw.decode("utf-8", errors="replace").lstrip("\ufeff")
        # newlines as ``text`` reads them (universal: \r\n and \r are \n)
        return text.replace("\r\n", "\n").replace("\r", "\n"), len(raw) < _START_BYTES

    @functools.cached_property
    def lead(self) -> str:
        """The first non-blank character ('' for a blank file)."""
        start, whole = self._start
        start = start.lstrip()
        if start or whole:
            return start[:1]
        return self.stripped[:1]  # (more blanks than the start holds)

    @functools.cached_property
    def first_line(self) -> str:
        """The first line (the CSV header, the first JSON line)."""
        if self.complete:
            start, whole = self._start
            if "\n" in start or whole:
                return start.split("\n", 1)[0]
            return self.text.split("\n", 1)[0]
        return self.text.split("\n", 1)[0].strip()

    @functools.cached_property
    def json_doc(self) -> Any:
        """The whole text as one JSON document (complete heads), else ``_NOT_JSON``."""
        if not self.complete or self.lead not in ("[", "{"):
            return _NOT_JSON
        try:
            return json.loads(self.stripped)
        except json.JSONDecodeError:
            return _NOT_JSON

    @functools.cached_property
    def doc_records(self) -> list[dict[str, Any]] | None:
        """The JSON document as records: a list of dicts, or one dict as a one-line JSONL."""
        doc = self.json_doc
        if isinstance(doc, dict):
            return [doc]
        if isinstance(doc, list) and doc and all(isinstance(r, dict) for r in doc):
            return doc
        return None

    @functools.cached_property
    def line_records(self) -> _Lines | None:
        """JSON lines (when the text is no JSON document): the dict records, lines skipped."""
        if self.json_doc is not _NOT_JSON or not self.complete:
            return None
        if self.lead not in ("[", "{"):
            return None
        records = _Lines()
        skipped: list[int] = []
        for number, line in enumerate(self.stripped.splitlines(), start=1):
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
        return records

    @property
    def records(self) -> list[dict[str, Any]] | None:
        """The JSON records, from the document or else from its lines."""
        recs = self.doc_records
        return recs if recs is not None else self.line_records

    @functools.cached_property
    def first_record(self) -> Any:
        """The first line parsed as JSON (a partial head's JSONL test); None if it is not JSON."""
        try:
            return json.loads(self.first_line)
        except json.JSONDecodeError:
            return None


#: One run of a file: (its name, the raw metric table, its step source).
Run = tuple[str, pd.DataFrame, str]


class Format:
    """One log format, declared in one place (register an instance in ``formats.REGISTRY``):

    - ``name``, ``description``;
    - ``rank``: its place in detection (``detect`` sniffs a file with every ranked format, the
      lowest rank first; the first that says yes reads it); None: never sniffed from a file
      (a folder format);
    - ``suffixes``: loose files with these suffixes are taken for runs in a folder of runs
      (listed even when they do not read, so that their error shows); ``maybe_suffixes``:
      only when their content sniffs as a known format;
    - ``sniff(head)``: is this file mine?
    - ``read_one(path, head)``: the raw metric table of the whole file (foreign names;
      ``canonicalize`` maps them) and its ``step_source``;
    - ``load_runs(path, head)``: the file parsed once into its runs, ``(name, frame,
      step_source)`` each: one run named "1" unless ``appendable`` (runs appended to one log:
      cut where the step counter restarts, ``parts.split_runs``, named "1", "2", ...);
    - ``runs(path, head)``: the names of its runs (cheap where the format can say without
      parsing the whole file; a folder listing asks it only of ``several`` formats);
      ``read(path, head, run=)``: one run (``run``: its name; None: the file's own choice, the
      latest of appended runs).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    rank: ClassVar[int | None] = None
    suffixes: ClassVar[frozenset[str]] = frozenset()
    maybe_suffixes: ClassVar[frozenset[str]] = frozenset()
    #: A log that runs are appended to (a console log, a JSONL metrics file): ``load_runs``
    #: cuts it where the step counter restarts (``parts.run_bounds``).
    appendable: ClassVar[bool] = False
    #: A file of this format may name several runs of its own (a W&B panel export): a folder
    #: listing asks ``runs``; for the others (one run, or appended ones) it need not.
    several: ClassVar[bool] = False

    def sniff(self, head: Head) -> bool:
        return False

    def read_one(self, path: Path, head: Head | None = None) -> tuple[pd.DataFrame, str]:
        raise NotImplementedError

    def load_runs(self, path: Path, head: Head | None = None) -> list[Run]:
        frame, source = self.read_one(path, head)
        if not self.appendable:
            return [("1", frame, source)]
        from lld_monitor.importers.parts import split_runs

        return [(str(i), part, source) for i, part in enumerate(split_runs(frame), start=1)]

    def runs(self, path: Path, head: Head | None = None) -> list[str]:
        if not self.appendable:
            return ["1"]
        return [name for name, _, _ in self.load_runs(path, head)]

    def read(
        self, path: Path, head: Head | None = None, run: str | None = None
    ) -> tuple[pd.DataFrame, str]:
        return pick_run(path, self, self.load_runs(path, head), run)


def pick_run(path: Path, fmt: Format, runs: list[Run], run: str | None) -> tuple[pd.DataFrame, str]:
    """One run of a file that holds ``runs``: ``run`` (its name), else the latest; where the
    file holds several, a note says which was read and names the others."""
    from lld_monitor.importers.parts import describe_runs

    names = [name for name, _, _ in runs]
    if len(runs) == 1 and run in (None, names[0]):
        return runs[0][1], runs[0][2]
    if len(runs) == 1 and not fmt.appendable:
        raise ImportFormatError(
            f"{path}: --run picks one training table of a notebook, one run of a W&B export, "
            f"or one of the runs appended to a log; this file is {fmt.description}, one run"
        )
    labels = describe_runs([f for _, f, _ in runs])
    if run is None:
        index = len(runs) - 1
    elif str(run).strip() in names:
        index = names.index(str(run).strip())
    else:
        raise ImportFormatError(
            f"{path}: --run {run!r}: this log holds {len(runs)} run(s): " + "; ".join(labels)
        )
    _, frame, source = runs[index]
    out = frame.copy(deep=False)
    out.attrs = dict(frame.attrs)
    others = [lab for i, lab in enumerate(labels) if i != index]
    how = "as asked" if run is not None else "the latest"
    out.attrs["import_notes"] = [
        *frame.attrs.get("import_notes", []),
        f"a log of {len(runs)} runs appended one after another (the step counter restarts): "
        f"read {labels[index]}, {how}; also there: {'; '.join(others)} (pick one with --run N; "
        "analysing the file lists them all)",
    ]
    return out, source
