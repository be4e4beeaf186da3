"""The training tables of a saved Jupyter / Colab notebook (``.ipynb`` with its outputs).

transformers' ``NotebookProgressCallback`` draws a run as an HTML table (``<table border="1"
class="dataframe">``) under a ``<progress>`` bar: a header row ``Step | Training Loss | reward |
...`` (TRL's logged keys, with " / " where the key has "/"), then one row per logged step, cells
"No log" where a value is missing. A saved notebook keeps the last state of each such output, so
its training tables are the whole run. ``notebook_tables(doc)`` finds every table whose header
starts with ``Step`` in the notebook's rich outputs (stdlib ``html.parser``, no extra dependency);
``pick_table`` chooses the GRPO one (the last with a reward column) or the one asked for, and says
which it read and what else is there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import pandas as pd

from lld_monitor import columns as C
from lld_monitor.importers.base import ImportFormatError
from lld_monitor.importers.names import canonical_name

#: Cell texts that mean "no value logged at this step".
MISSING_CELLS = frozenset({"", "no log", "nan", "none", "-"})
#: Output types whose ``data`` may hold an HTML table.
_RICH_OUTPUTS = ("display_data", "execute_result", "update_display_data")


@dataclass(frozen=True)
class NotebookTable:
    """One training table of a notebook: its number (1 = the first in the notebook), the code
    cell it is in (0-based, counting every cell), the header and the rows as shown."""

    number: int
    cell: int
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    @property
    def columns(self) -> list[str]:
        """The header as logged keys: " / " back to "/", "Step" -> step, "Training Loss" -> loss."""
        return [_column_name(h) for h in self.header]

    @property
    def has_reward(self) -> bool:
        return any(
            (name := canonical_name(c)) == C.REWARD_MEAN
            or (name is not None and name.startswith(C.REWARD_FN_PREFIX))
            for c in self.columns
        )

    def steps(self) -> list[float]:
        return [_number(r[0]) for r in self.rows if r]

    def describe(self) -> str:
        """'table 2 (Step | Training Loss | reward | ...: 140 rows, steps 51-190, cell 7)'."""
        shown = " | ".join(self.header[:5]) + (" | ..." if len(self.header) > 5 else "")
        steps = [s for s in self.steps() if s == s]
        span = f", steps {steps[0]:g}-{steps[-1]:g}" if steps else ""
        return f"table {self.number} ({shown}: {len(self.rows)} rows{span}, cell {self.cell + 1})"

    def frame(self) -> pd.DataFrame:
        """The rows as a table of logged keys; "No log" and unreadable cells are NaN."""
        cols = self.columns
        data: dict[str, list[float]] = {c: [] for c in cols}
        for row in self.rows:
            cells = list(row) + [""] * (len(cols) - len(row))
            for c, cell in zip(cols, cells, strict=False):
                data[c].append(_number(cell))
        frame = pd.DataFrame(data)
        return frame.loc[:, ~frame.columns.duplicated()]


def _column_name(header: str) -> str:
    h = " ".join(header.split())
    low = h.lower()
    if low == "step":
        return C.STEP
    if low == "training loss":
        return "loss"
    return h.replace(" / ", "/")


def _number(cell: str) -> float:
    text = cell.strip()
    if text.lower() in MISSING_CELLS:
        return math.nan
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return math.nan


class _TableParser(HTMLParser):
    """Every ``<table>`` of an HTML text as rows of cell texts (th and td alike)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[list[list[str]]] = []
        self._depth = 0
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._depth += 1
            if self._depth == 1:
                self.tables.append([])
        elif self._depth == 1 and tag == "tr":
            self._row = []
        elif self._depth == 1 and tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._depth:
            self._depth -= 1
        elif self._depth == 1 and tag in ("td", "th") and self._cell is not None:
            if self._row is not None:
                self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif self._depth == 1 and tag == "tr" and self._row is not None:
            if self._row:
                self.tables[-1].append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def html_tables(html: str) -> list[list[list[str]]]:
    """The tables of an HTML text, each a list of rows of cell texts."""
    parser = _TableParser()
    parser.feed(html)
    parser.close()
    return [t for t in parser.tables if t]


def _html_of(output: Mapping[str, Any]) -> str:
    data = output.get("data")
    if not isinstance(data, Mapping):
        return ""
    html = data.get("text/html", "")
    return "".join(html) if isinstance(html, list) else str(html)


def has_outputs(doc: Mapping[str, Any]) -> bool:
    """True when some code cell of the notebook kept an output."""
    return any(cell.get("outputs") for cell in doc.get("cells", []) if isinstance(cell, Mapping))


def notebook_tables(doc: Mapping[str, Any]) -> list[NotebookTable]:
    """Every training table (header starting with ``Step``) of the notebook's rich outputs, in
    cell order."""
    found: list[NotebookTable] = []
    for index, cell in enumerate(doc.get("cells", [])):
        if not isinstance(cell, Mapping):
            continue
        for out in cell.get("outputs", []) or []:
            if not isinstance(out, Mapping) or out.get("output_type") not in _RICH_OUTPUTS:
                continue
            html = _html_of(out)
            if "<table" not in html:
                continue
            for rows in html_tables(html):
                header = rows[0]
                if not header or header[0].strip().lower() != "step" or len(header) < 2:
                    continue
                body = tuple(tuple(r) for r in rows[1:])
                found.append(NotebookTable(len(found) + 1, index, tuple(header), body))
    return found


def pick_table(
    tables: Sequence[NotebookTable], run: str | None = None
) -> tuple[NotebookTable, list[str]]:
    """The table to read and the notes that say which it is and what else is there: ``run`` (a
    table's number, as the notes list them), else the last table with a reward column (the GRPO
    run after an SFT warm-up), else the last table."""
    if not tables:
        raise ValueError("no training table")
    if run is not None:
        wanted = run.strip().lower().removeprefix("table").strip()
        chosen = next((t for t in tables if str(t.number) == wanted), None)
        if chosen is None:
            listed = "; ".join(t.describe() for t in tables)
            raise ImportFormatError(
                f"--run {run!r}: the notebook's training tables are numbered "
                f"1-{len(tables)}: {listed}"
            )
        why = "as asked"
    else:
        with_reward = [t for t in tables if t.has_reward]
        chosen = (with_reward or list(tables))[-1]
        why = "the last with a reward column" if with_reward else "the last; none has a reward"
    notes = [f"read the notebook's training {chosen.describe()}: {why}"]
    others = [t for t in tables if t is not chosen]
    if others:
        notes.append(
            "also in the notebook: "
            + "; ".join(t.describe() for t in others)
            + " (pick one with --run N)"
        )
    return chosen, notes
