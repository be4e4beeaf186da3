"""Fixes from a new-user pass over the finished parts (each test failed before its fix)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from lld_monitor import columns as C
from lld_monitor.analysis import PhaseDetector, analyze_run
from lld_monitor.report import write_report


def _analysis(collapse_step: int | None) -> SimpleNamespace:
    """A hand-made analysis: the report is under test, not the analyzer."""
    return SimpleNamespace(
        phases=[],
        alerts=[],
        collapse_step=collapse_step,
        signals_used=[C.REWARD_MEAN],
        signals_missing=[],
    )


def test_html_header_says_none_detected_not_python_none(tmp_path):
    df = pd.DataFrame({C.STEP: [1, 2, 3], C.REWARD_MEAN: [0.1, 0.2, 0.3]})
    page = write_report(df, _analysis(None), tmp_path / "r.html").read_text(encoding="utf-8")
    assert "collapse: none detected" in page
    assert ": None<" not in page
    page = write_report(df, _analysis(2), tmp_path / "r2.html").read_text(encoding="utf-8")
    assert "collapse: step 2" in page


def test_grad_norm_of_zero_counts_as_logged():
    # A run whose every update had a zero gradient (all advantages 0) logged grad_norm = 0.0:
    # the analyzer must not report the column as missing ("signals never seen with a finite value").
    det = PhaseDetector()
    for step in range(1, 31):
        det.update({C.STEP: step, C.REWARD_MEAN: 0.0, C.GRAD_NORM: 0.0})
    assert C.GRAD_NORM in det.signals_used
    assert C.GRAD_NORM not in det.signals_missing
    df = pd.DataFrame({C.STEP: range(1, 31), C.REWARD_MEAN: 0.0, C.GRAD_NORM: 0.0})
    assert C.GRAD_NORM in analyze_run(df).signals_used
