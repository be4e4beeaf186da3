"""The analyzer: online phase detection, offline analysis, baselines and evaluation (no torch)."""

from __future__ import annotations

from lld_monitor.analysis.baselines import GradSpikeDetector, RewardDropDetector
from lld_monitor.analysis.detector import DetectorConfig, PhaseDetector
from lld_monitor.analysis.evaluation import Evaluation, evaluate
from lld_monitor.analysis.offline import Analysis, PhaseSegment, analyze_run, replay

__all__ = [
    "Analysis",
    "DetectorConfig",
    "Evaluation",
    "GradSpikeDetector",
    "PhaseDetector",
    "PhaseSegment",
    "RewardDropDetector",
    "analyze_run",
    "evaluate",
    "replay",
]
