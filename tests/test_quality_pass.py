"""Fixes from a new-user pass over the finished parts (each test failed before its fix)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from lld_monitor import columns as C
from lld_monitor.analysis import PhaseDetector, analyze_run
from lld_monitor.report import write_report
from lld_monitor.testing import make_run, write_run


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


def _collapse_then(after: str) -> list[dict[str, float]]:
    """Rows: reward rises 0.1 -> 0.3 over steps 1-100 with logp_correct flat at -0.3, then a
    collapse over steps 101-130 (reward -> 0, logp_correct -> -1.5, grad norm x5, entropy x1.5).
    After 130, ``dead``: reward 0, a correct response (logp -1.5) only every 5th step, grad norm
    0.01, entropy 0.05, i.e. every signal but the reward goes quiet; ``recovered``: reward back at
    0.28 (peak 0.3), logp_correct flat at -1.5, grad norm and entropy at their old levels."""
    rng = np.random.default_rng(0)
    rows = []
    for s in range(1, 401):
        if s <= 100:
            rw, lp, g, h = 0.1 + 0.002 * s, -0.3, 1.0, 1.0
        elif s <= 130:
            f = (s - 100) / 30
            rw, lp, g, h = 0.3 * (1 - f), -0.3 - 1.2 * f, 1.0 + 4 * f, 1.0 + 0.5 * f
        elif after == "dead":
            rw, lp, g, h = 0.0, (-1.5 if s % 5 == 0 else math.nan), 0.01, 0.05
        else:
            rw, lp, g, h = 0.28, -1.5, 1.0, 1.0
        noise = rng.normal(0.0, 0.01) if s <= 130 or after != "dead" else 0.0
        rows.append(
            {
                C.STEP: s,
                C.REWARD_MEAN: rw + noise,
                C.LOGP_CORRECT: lp + rng.normal(0.0, 0.005),
                C.GRAD_NORM: g,
                C.ENTROPY: h,
            }
        )
    return rows


def test_a_dead_run_stays_in_collapse():
    # Before the fix: collapse -> decay at step 180 and -> healthy at 221, with the reward at 0.
    det = PhaseDetector()
    alerts = [a for row in _collapse_then("dead") for a in det.update(row)]
    assert [a.kind for a in alerts if a.kind in ("collapse", "phase")] == ["collapse"]
    assert det.phase == "collapse"
    last = analyze_run(pd.DataFrame(_collapse_then("dead"))).phases[-1]
    assert (last.phase, last.end_step) == ("collapse", 400)


def test_a_run_whose_reward_came_back_leaves_collapse():
    det = PhaseDetector()
    alerts = [a for row in _collapse_then("recovered") for a in det.update(row)]
    assert "collapse" in [a.kind for a in alerts]
    assert det.phase != "collapse"


@pytest.mark.verl
def test_verl_config_errors_name_the_verl_keys():
    # A verl user sets llds_gate=...; the message said only "gate must be one of ...".
    pytest.importorskip("verl")
    from lld_monitor.integrations import verl as lv

    with pytest.raises(ValueError, match=r"policy_loss: gate must be one of .*llds_gate"):
        lv.LLDSPolicyLossConfig(llds_gate="sentence")


def test_dashboard_drilldown_of_a_simulated_run_does_not_promise_samples(tmp_path, monkeypatch):
    write_run(make_run("healthy", 60, seed=1), tmp_path / "sim")
    monkeypatch.setattr(sys, "argv", ["app.py", str(tmp_path)])
    app = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
    at = AppTest.from_file(str(app), default_timeout=60).run()
    infos = [i.value for i in at.info]
    assert any("is a simulated run" in i and "no token samples" in i for i in infos), infos
    assert not any("no token samples yet" in i for i in infos)
