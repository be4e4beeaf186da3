"""The run log: one folder per run, append-only JSON lines, readable while it is written.

A run folder holds ``meta.json``, ``steps.jsonl`` (one row per step), ``events.jsonl`` (alerts,
phases, interventions, lifecycle), ``tokens/*.parquet`` (bounded token samples) and, once the
writer closed, ``closed.json``. The format is documented in docs/run-format.md. No torch here.

``common`` (file names, errors, plain JSON, the checks of a run folder), ``writer``
(``RunWriter``), ``reader`` (``load_run``, ``RunReader``); their public names are here too.
"""

from __future__ import annotations

from lld_monitor.runlog.common import (
    _FAST_PATH_MIN_BYTES,
    CLOSED_FILE,
    DEFAULT_FSYNC_EVERY_S,
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_TOKEN_BUDGET_BYTES,
    EVENTS_FILE,
    META_FILE,
    SCHEMA_VERSION,
    STEPS_FILE,
    SUMMARY_FILES,
    TOKENS_DIR,
    WRITE_WARNING_EVERY_S,
    RunFormatError,
    RunSummaryError,
    _dumps,
    find_runs,
    is_run_dir,
    logger,
)
from lld_monitor.runlog.follow import ColumnStore, RunFollower
from lld_monitor.runlog.reader import (
    Run,
    RunReader,
    _fast_steps,
    load_run,
    one_row_per_step,
    run_story,
    table_story,
)
from lld_monitor.runlog.writer import (
    RunWriter,
)

__all__ = [
    "CLOSED_FILE",
    "DEFAULT_FSYNC_EVERY_S",
    "DEFAULT_MAX_PENDING_BYTES",
    "DEFAULT_TOKEN_BUDGET_BYTES",
    "EVENTS_FILE",
    "META_FILE",
    "SCHEMA_VERSION",
    "STEPS_FILE",
    "SUMMARY_FILES",
    "TOKENS_DIR",
    "WRITE_WARNING_EVERY_S",
    "_FAST_PATH_MIN_BYTES",
    "ColumnStore",
    "Run",
    "RunFollower",
    "RunFormatError",
    "RunReader",
    "RunSummaryError",
    "RunWriter",
    "_dumps",
    "_fast_steps",
    "find_runs",
    "is_run_dir",
    "load_run",
    "logger",
    "one_row_per_step",
    "run_story",
    "table_story",
]
