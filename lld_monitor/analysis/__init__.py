"""The analyzer: online phase detection, offline analysis, baselines and evaluation (no torch)."""

from __future__ import annotations

from lld_monitor.analysis.detector import DetectorConfig, PhaseDetector

__all__ = ["DetectorConfig", "PhaseDetector"]
