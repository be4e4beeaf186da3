"""lld_monitor: diagnose and prevent the Lazy Likelihood Displacement death spiral in GRPO.

The public API is flat and lazily imported, so that the analyzer, the readers and the dashboard
never pay for importing torch or a trainer:

    from lld_monitor import likelihood_displacement, llds_loss, RunWriter, load_run, analyze_run
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (one place; keep sorted by module)
_EXPORTS: dict[str, str] = {
    # pure metrics (torch)
    "likelihood_displacement": "lld_monitor.metrics",
    "LLDStats": "lld_monitor.metrics",
    "action_ids": "lld_monitor.metrics",
    "masked_mean": "lld_monitor.metrics",
    "top_displaced_tokens": "lld_monitor.metrics",
    "correct_mask": "lld_monitor.metrics",
    "per_response_delta": "lld_monitor.metrics",
    "displacement_sums": "lld_monitor.metrics",
    "stats_from_sums": "lld_monitor.metrics",
    "SUM_FIELDS": "lld_monitor.metrics",
    # LLDS regularizer (torch)
    "llds_loss": "lld_monitor.llds",
    "LLDSOutput": "lld_monitor.llds",
    "LLDSConfig": "lld_monitor.llds",
    "answer_weight_paper": "lld_monitor.llds",
    "answer_weight_code": "lld_monitor.llds",
    # run log (no torch)
    "RunWriter": "lld_monitor.runlog",
    "RunReader": "lld_monitor.runlog",
    "Run": "lld_monitor.runlog",
    "load_run": "lld_monitor.runlog",
    "RunFormatError": "lld_monitor.runlog",
    "find_runs": "lld_monitor.runlog",
    "is_run_dir": "lld_monitor.runlog",
    # alert sinks (no torch; wandb imported only when used)
    "ConsoleSink": "lld_monitor.sinks",
    "RunLogSink": "lld_monitor.sinks",
    "WandbSink": "lld_monitor.sinks",
    "WebhookSink": "lld_monitor.sinks",
    # events
    "Alert": "lld_monitor.events",
    "make_event": "lld_monitor.events",
    # analyzer (no torch)
    "PhaseDetector": "lld_monitor.analysis",
    "analyze_run": "lld_monitor.analysis",
    "Analysis": "lld_monitor.analysis",
    "PhaseSegment": "lld_monitor.analysis",
    "DetectorConfig": "lld_monitor.analysis",
    "GradSpikeDetector": "lld_monitor.analysis",
    "RewardDropDetector": "lld_monitor.analysis",
    "evaluate": "lld_monitor.analysis",
    # foreign logs (no torch)
    "load_table": "lld_monitor.importers",
    "detect_format": "lld_monitor.importers",
    "ImportFormatError": "lld_monitor.importers",
    # monitor (torch; trainers imported only on attach)
    "LLDMonitor": "lld_monitor.monitor",
    "MonitorConfig": "lld_monitor.monitor",
}

__all__ = [*sorted(_EXPORTS), "__version__"]

#: The training stack a log-analysis install leaves out, and the extra that brings each.
TRAINING_EXTRAS: dict[str, str] = {
    "torch": "torch",
    "transformers": "transformers",
    "accelerate": "transformers",
    "trl": "trl",
}


def missing_extra_hint(exc: ImportError, extra: str | None = None) -> str | None:
    """For an ImportError of the training stack: what to install ("pip install
    'lld_monitor[torch]'", or ``extra`` where the caller knows it needs more); None for any
    other ImportError."""
    top = (getattr(exc, "name", None) or "").split(".")[0]
    if top not in TRAINING_EXTRAS:
        return None
    extra = extra or TRAINING_EXTRAS[top]
    return (
        f"{top} is not installed: this part of lld_monitor trains or hooks a model; install it "
        f"with pip install 'lld_monitor[{extra}]' (log analysis, reports and the dashboard "
        "need none of it)"
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lld_monitor' has no attribute {name!r}")
    try:  # (a subpackage may import lazily too: the getattr is inside)
        value = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        hint = missing_extra_hint(exc)
        if hint is None:
            raise
        raise ModuleNotFoundError(f"lld_monitor.{name}: {hint}", name=exc.name) from exc
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
