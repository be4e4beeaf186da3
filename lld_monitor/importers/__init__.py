"""Read logged runs of any origin into one table with the canonical column names.

``load_table(path)`` detects the format from the content (not the extension alone), maps the
foreign metric names to ``lld_monitor.columns`` through one table (``FOREIGN_NAMES``), keeps the
training rows, and returns a numeric DataFrame sorted by ``step``. No torch import here.

``names`` (the mapping table), ``formats`` (one class per format with ``sniff(head)`` and
``read(path)``, the registry, detection), ``load`` (``load_table``, ``load_eval_table``,
``runs_in_file``), ``parts`` (runs appended to one log, eval rows), ``plain`` (plain
training-loop prints), ``table`` (``canonicalize`` and its
input checks), ``text`` (console-log parsers), ``base`` (``Head``, ``Format``, the error).
"""

from __future__ import annotations

from lld_monitor.importers.base import SNIFF_BYTES, Format, Head, ImportFormatError
from lld_monitor.importers.formats import FORMATS, REGISTRY, detect, reader
from lld_monitor.importers.load import detect_format, load_eval_table, load_table, runs_in_file
from lld_monitor.importers.names import AUTHORS_VERL_NAMES, FOREIGN_NAMES, canonical_name
from lld_monitor.importers.table import MAX_STEP, canonicalize
from lld_monitor.importers.text import CONSOLE_STEP_SOURCES, console_steps, parse_verl_console

__all__ = [
    "AUTHORS_VERL_NAMES",
    "CONSOLE_STEP_SOURCES",
    "FOREIGN_NAMES",
    "FORMATS",
    "MAX_STEP",
    "REGISTRY",
    "SNIFF_BYTES",
    "Format",
    "Head",
    "ImportFormatError",
    "canonical_name",
    "canonicalize",
    "console_steps",
    "detect",
    "detect_format",
    "load_eval_table",
    "load_table",
    "parse_verl_console",
    "reader",
    "runs_in_file",
]
