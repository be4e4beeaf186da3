"""Labelled synthetic GRPO runs (dataset generators with their ground truth): the new public name.

``from lld_monitor.datasets import make_run, make_suite, write_run`` is the name to use. The
generators still live in ``lld_monitor.testing`` for this release (so that work on them merges
as plain edits); a later commit moves them here and leaves ``testing`` as a deprecated alias.
Every name of ``lld_monitor.testing`` is reachable from here.
"""

from __future__ import annotations

from typing import Any

from lld_monitor import testing as _generators
from lld_monitor.testing import (
    CLASSIC_KINDS,
    COLLAPSE_KINDS,
    FAILURE_KINDS,
    HEALTHY_KINDS,
    KINDS,
    NOISE_LEVELS,
    STANDARD_COLLAPSE_KINDS,
    STANDARD_HEALTHY_KINDS,
    STANDARD_KINDS,
    LabelledRun,
    make_run,
    make_standard_run,
    make_standard_suite,
    make_suite,
    make_wide_suite,
    probe_rows,
    wide_knobs,
    write_run,
    write_suite,
)

__all__ = [
    "CLASSIC_KINDS",
    "COLLAPSE_KINDS",
    "FAILURE_KINDS",
    "HEALTHY_KINDS",
    "KINDS",
    "NOISE_LEVELS",
    "STANDARD_COLLAPSE_KINDS",
    "STANDARD_HEALTHY_KINDS",
    "STANDARD_KINDS",
    "LabelledRun",
    "make_run",
    "make_standard_run",
    "make_standard_suite",
    "make_suite",
    "make_wide_suite",
    "probe_rows",
    "wide_knobs",
    "write_run",
    "write_suite",
]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return getattr(_generators, name)
    except AttributeError:
        raise AttributeError(f"module 'lld_monitor.datasets' has no attribute {name!r}") from None
