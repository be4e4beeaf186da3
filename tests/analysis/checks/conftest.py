"""Helpers of the check tests: feed hand-made rows through ``Signals`` into one check."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.checks.base import Check
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.signals import INPUT_COLUMNS, Signals
from lld_monitor.events import Alert


def feed_rows(
    check: Check, rows: Iterable[Mapping[str, Any]], phase: str = "healthy"
) -> tuple[list[tuple[int, list[Alert]]], Signals]:
    """[(step, alerts of that row)] for every accepted row, and the Signals after the last."""
    s = Signals(check.config)
    out = []
    for row in rows:
        values = tuple(float(row.get(c, math.nan)) for c in INPUT_COLUMNS)
        marks = row.get(C.NONFINITE)
        if s.update(float(row[C.STEP]), values, marks.split(",") if marks else None):
            s.phase = phase
            out.append((int(row[C.STEP]), list(check.update(s))))
    return out, s


@pytest.fixture
def feed() -> Callable[..., tuple[list[tuple[int, list[Alert]]], Signals]]:
    return feed_rows


@pytest.fixture
def cfg() -> DetectorConfig:
    """The shipped defaults: warm after 20 steps and 5 rows, failures held 10 steps."""
    return DetectorConfig()
