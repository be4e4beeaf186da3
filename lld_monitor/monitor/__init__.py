"""The live monitor: ``LLDMonitor`` (``core``) and the parts it wires together.

``config`` (validated settings), ``rollout`` and ``step_metrics`` (the sums of one step, reduced
across ranks by ``distributed``), ``token_sampling`` (the most displaced tokens),
``correctness`` (which responses count as correct), ``llds_switch`` and ``llds_checks`` (the
regularizer in force and its warnings), ``actions`` (the detector's alerts and what they do),
``dispatch`` (rows, events and alerts to the run log and the sinks), ``failure`` (never harm the
run), ``resume`` (state carried across a restart). Only ``core`` and the tensor parts import
torch, and only when ``LLDMonitor`` is first used: ``from lld_monitor.monitor import
AUTO_LLDS_KINDS`` costs no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from lld_monitor.monitor.actions import (
    AUTO_LLDS_ACCEPTED,
    AUTO_LLDS_KINDS,
    AUTO_LLDS_LAMBDA,
    CHECKPOINT,
    COLLAPSE_KINDS,
    STOP,
    ActionPolicy,
)

# names defined in a torch-importing part -> that part (imported on first use)
_LAZY: dict[str, str] = {
    "LLDMonitor": "lld_monitor.monitor.core",
    "MonitorConfig": "lld_monitor.monitor.config",
    "ZERO_STD_WARN": "lld_monitor.monitor.llds_checks",
    "OnceNotes": "lld_monitor.monitor.llds_checks",
    "LLDSSwitch": "lld_monitor.monitor.llds_switch",
    "SAMPLE_RESPONSE": "lld_monitor.monitor.token_sampling",
    "SAMPLE_TOP_TOKEN": "lld_monitor.monitor.token_sampling",
    "ProbeRecord": "lld_monitor.monitor.token_sampling",
    "TokenSampler": "lld_monitor.monitor.token_sampling",
    "TokenSource": "lld_monitor.monitor.token_sampling",
}

__all__ = [
    "AUTO_LLDS_ACCEPTED",
    "AUTO_LLDS_KINDS",
    "AUTO_LLDS_LAMBDA",
    "CHECKPOINT",
    "COLLAPSE_KINDS",
    "STOP",
    "ActionPolicy",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lld_monitor.monitor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
