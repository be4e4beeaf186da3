"""The monitor's settings: ``MonitorConfig``, the checks with a clear error, and meta.json's record.

Each check returns the value the monitor keeps or raises an error that tells the user what to
do; :func:`config_meta` is the ``config`` object of the run's meta.json.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from lld_monitor import columns as C
from lld_monitor.monitor import distributed
from lld_monitor.monitor.actions import AUTO_LLDS_KINDS

logger = logging.getLogger("lld_monitor")


@dataclass(frozen=True)
class MonitorConfig:
    """Every setting of ``LLDMonitor`` but the run folder, with the monitor's defaults.

    ``LLDMonitor(run_dir, MonitorConfig(auto_llds=True))`` is the same monitor as
    ``LLDMonitor(run_dir, auto_llds=True)``; the keyword form stays accepted. The values are
    checked when the monitor is built (docs/monitor.md describes each).
    """

    llds: Any | None = None  # an LLDSConfig, or None: LLDS off (switchable later)
    probe_fraction: float = 0.25
    correct_fn: Callable[..., Any] | None = None
    correct_threshold: float = 1.0
    correct_reward: str | None = None
    sinks: Sequence[Any] = ()
    detector: Any = True
    auto_llds: bool = False
    auto_llds_on: Sequence[str] = AUTO_LLDS_KINDS
    stop_on_collapse: bool = False
    checkpoint_on_collapse: bool = False
    token_samples_per_step: int = 4
    response_samples_per_step: int = 4
    strict: bool = False
    meta: Mapping[str, Any] | None = None
    llds_with_dropout: bool = False
    resume: bool = False
    # the LLDS watchdog (llds_watchdog.py): off by default, auto_llds or not; it did worse
    # than a fixed lambda on the testbed (sample_runs/README.md, "The LLDS watchdog")
    llds_watchdog: bool = False

    def __post_init__(self) -> None:
        """Check the settings that can be checked without a run (one definition each)."""
        object.__setattr__(self, "probe_fraction", check_probe_fraction(self.probe_fraction))
        check_llds(self.llds)
        for name in ("token_samples_per_step", "response_samples_per_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be >= 0 (an int), got {value!r}")

    def with_overrides(self, **overrides: Any) -> MonitorConfig:
        """This config with some settings replaced by name; an unknown name raises and names
        the valid ones (as ``DetectorConfig.with_overrides``)."""
        known = [f.name for f in fields(self)]
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise TypeError(
                f"unknown LLDMonitor setting(s) {unknown}; the settings are {known} "
                "(MonitorConfig's fields)"
            )
        return replace(self, **overrides) if overrides else self


def check_probe_fraction(probe_fraction: float) -> float:
    """``probe_fraction`` as a float in [0, 1] (0 turns the post-update probe off)."""
    if not 0.0 <= float(probe_fraction) <= 1.0:
        raise ValueError(
            f"probe_fraction must be in [0, 1] (0 turns the post-update probe off), "
            f"got {probe_fraction!r}"
        )
    return float(probe_fraction)


def check_llds(llds: Any | None) -> Any:
    """The ``LLDSConfig`` in force at the start: ``llds``, or LLDS off when None."""
    from lld_monitor.llds import LLDSConfig

    if llds is None:
        return LLDSConfig(enabled=False)
    if not isinstance(llds, LLDSConfig):
        raise ValueError("llds must be an lld_monitor.LLDSConfig or None")
    return llds


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """FileExistsError when ``run_dir`` already holds a run and ``resume`` is False.

    Checked by the launched rank 0 only (``RANK`` is set by torchrun/accelerate before the
    process group exists), at construction: at the first step the error would be swallowed.
    """
    launched_rank = os.environ.get("RANK", "0")
    if distributed.rank() != 0 or launched_rank != "0" or resume:
        return
    if (run_dir / "steps.jsonl").exists() or (run_dir / "meta.json").exists():
        raise FileExistsError(
            f"{run_dir} already holds a run; give the monitor a new folder (or delete that one), "
            "or pass resume=True to continue it (training resumed from a checkpoint)"
        )


def make_detector(detector: Any) -> Any | None:
    """``True``: a ``PhaseDetector``; ``None``/``False``: none; else an object with ``update``."""
    if detector is None or detector is False:
        return None
    if detector is True:
        try:
            from lld_monitor.analysis import PhaseDetector
        except ImportError as err:
            logger.warning("lld_monitor: no online phase detector (%s); rows are still logged", err)
            return None
        return PhaseDetector()
    if not hasattr(detector, "update"):
        raise ValueError("detector must be True, None, or an object with update(row) -> alerts")
    return detector


def _detector_config(detector: Any | None) -> dict[str, Any] | None:
    """The detector's settings as plain JSON (``DetectorConfig.to_dict``); None for a detector
    without a ``DetectorConfig`` (a user's own)."""
    from lld_monitor.analysis.config import DetectorConfig

    cfg = getattr(detector, "config", None)
    return cfg.to_dict() if isinstance(cfg, DetectorConfig) else None


def config_meta(
    *,
    probe_fraction: float,
    correctness: Any,
    actions: Any,
    tokens: Any,
    llds_with_dropout: bool,
    detector: Any | None,
    llds: Any,
    watchdog: Any | None = None,
) -> dict[str, Any]:
    """meta.json's ``config``: the monitor's settings (``llds`` is the ``LLDSConfig`` in force)."""
    return {
        "probe_fraction": probe_fraction,
        "correct_threshold": correctness.threshold,
        "correct_fn": getattr(correctness.correct_fn, "__name__", None),
        "correctness": correctness.describe(),
        "auto_llds": actions.auto_llds,
        "auto_llds_on": list(actions.auto_llds_on),
        "stop_on_collapse": actions.stop_on_collapse,
        "checkpoint_on_collapse": actions.checkpoint_on_collapse,
        "token_samples_per_step": tokens.token_samples,
        "llds_with_dropout": llds_with_dropout,
        "llds_watchdog": None if watchdog is None else dict(vars(watchdog.config)),
        "response_samples_per_step": tokens.response_samples,
        "detector": type(detector).__name__ if detector is not None else None,
        # every setting of the detector (``DetectorConfig.to_dict``: the level-shift and
        # mode-collapse sections too), so a run says what judged it
        "detector_config": _detector_config(detector),
        "llds": {
            "enabled": llds.enabled,
            "lam": llds.lam,
            "gate": llds.gate,
            "normalize": llds.normalize,
            "answer_weighting": llds.answer_weighting,
        },
    }


def run_meta(
    trainer: str,
    lld_columns: bool,
    config: dict[str, Any],
    meta: Mapping[str, Any],
    user_meta: Mapping[str, Any],
) -> dict[str, Any]:
    """meta.json: the trainer, the monitor's ``config``, the adapter's ``meta``, the user's.

    The user's ``meta`` (the monitor's ``meta=`` argument) wins over the adapter's. Without LLD
    columns (a trainer that exposes no log-probs) ``lld_columns_absent`` lists them.
    """
    full = {"trainer": trainer, "lld_columns": bool(lld_columns), "config": config}
    full.update({**meta, **user_meta})
    if not lld_columns:
        full["lld_columns_absent"] = list(C.LLD_COLUMNS)
    return full
