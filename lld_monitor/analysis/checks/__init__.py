"""The detector's checks: one small incremental class per kind (``base.Check`` is the contract).

``default_checks(config)`` gives the detector's list in its order (the order of the alerts within
a row); ``CHECK_CLASSES`` lists every check class (the contract tests run over all of them).
"""

from __future__ import annotations

from lld_monitor.analysis.checks.base import NO_ALERTS, Check
from lld_monitor.analysis.checks.collapse import SharpDropCollapse
from lld_monitor.analysis.checks.displacement import Displacement
from lld_monitor.analysis.checks.failures import (
    DeadSignal,
    EntropyCollapse,
    KlBlowup,
    LengthBlowup,
    PersistentCheck,
    RewardDecline,
    Truncation,
)
from lld_monitor.analysis.checks.level_shift import LevelShiftCollapse, ModeCollapse
from lld_monitor.analysis.checks.llds import LldsInert
from lld_monitor.analysis.checks.no_update import NoUpdate, ZeroGrad
from lld_monitor.analysis.checks.nonfinite import Nonfinite
from lld_monitor.analysis.checks.sampler import SamplerMismatch
from lld_monitor.analysis.checks.spike import GradSpike, KlSpike
from lld_monitor.analysis.checks.trends import TrendLevels
from lld_monitor.analysis.config import DetectorConfig

#: Every check class, in the default detector's order.
CHECK_CLASSES: tuple[type[Check], ...] = (
    Displacement,
    Nonfinite,
    NoUpdate,
    ZeroGrad,
    SamplerMismatch,
    LldsInert,
    KlSpike,
    GradSpike,
    DeadSignal,
    EntropyCollapse,
    LengthBlowup,
    RewardDecline,
    KlBlowup,
    Truncation,
    TrendLevels,
    SharpDropCollapse,
    ModeCollapse,
    LevelShiftCollapse,
)


def default_checks(config: DetectorConfig) -> list[Check]:
    """A fresh instance of every check, in the default order."""
    return [cls(config) for cls in CHECK_CLASSES]


__all__ = [
    "CHECK_CLASSES",
    "NO_ALERTS",
    "Check",
    "DeadSignal",
    "Displacement",
    "EntropyCollapse",
    "GradSpike",
    "KlBlowup",
    "KlSpike",
    "LengthBlowup",
    "LevelShiftCollapse",
    "LldsInert",
    "ModeCollapse",
    "NoUpdate",
    "Nonfinite",
    "PersistentCheck",
    "RewardDecline",
    "SamplerMismatch",
    "SharpDropCollapse",
    "TrendLevels",
    "Truncation",
    "ZeroGrad",
    "default_checks",
]
