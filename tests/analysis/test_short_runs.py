"""Short runs (20-60 logged rows) get a verdict: the level-shift test's first 64 rows are held to
the threshold of a 64-row run (``stats.GLR_SHORT_CALIBRATION``, its false-alarm rate stated in
the alert), and a short run's fall is judged near the floor with a margin of
``floor_sd_short`` standard errors.

The figures of ``scripts/short_runs.py`` (its own simulator, seed 1 tuned, seed 2 reported) are
in docs/analyzer.md; here a smaller held-out seed guards them, and the 47-step verl shape of the
issue, built from its description, is flagged within 5 steps of its fall.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lld_monitor.analysis import analyze_run
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.stats import (
    GLR_CALIBRATION,
    GLR_SHORT_CALIBRATION,
    glr_run_rate,
    glr_threshold,
)

ROOT = Path(__file__).resolve().parents[2]


def _verl_47(seed: int) -> pd.DataFrame:
    """A 47-step verl run as the issue describes it: the score ~0.5 (noisy), from step 33 on
    0.03; the response length 351 -> 5 tokens, the KL loss 0 -> 7, the grad norm 1 -> 24."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, 48)
    late = steps >= 33
    score = np.where(late, 0.03, 0.5) + rng.normal(0, np.where(late, 0.02, 0.08))
    return pd.DataFrame(
        {
            "step": steps,
            "reward_mean": np.clip(score, 0, 1),
            "completion_length": np.where(late, 5.0, 351.0) + rng.normal(0, 3, 47),
            "kl": np.where(late, 7.0, 0.001 * steps),
            "grad_norm": np.where(late, 24.0, 1.0) + rng.normal(0, 0.1, 47),
        }
    )


@pytest.mark.parametrize("seed", range(5))
def test_the_47_step_verl_collapse_is_flagged_within_5_steps(seed):
    a = analyze_run(_verl_47(seed), jobs=1)
    hits = [x for x in a.alerts if x.kind == "collapse" and x.severity == "critical"]
    assert hits and 33 <= hits[0].step <= 38, [(x.kind, x.step) for x in a.alerts]
    ev = hits[0].evidence
    assert ev["threshold_for_rows"] == 64 and 0 < ev["p_false_run"] <= 0.05
    assert "of 64 rows of noise like this run's crosses it" in hits[0].message


def test_the_short_threshold_is_the_64_row_calibration():
    cfg = DetectorConfig().level_shift
    c = glr_threshold(cfg.p_false_short_run, short=True)
    assert glr_run_rate(c, short=True) == pytest.approx(cfg.p_false_short_run, rel=1e-9)
    # a higher rate a run than the long runs' one in 500, on a 64-row horizon: a lower bar
    assert 4.0 < c < glr_threshold(cfg.p_false_run)
    # the online noise of a short run gives heavier tails: at the same c, a 64-row run crosses
    # more often than 64/3000 of a 3000-row one
    c0, p_long = GLR_CALIBRATION[-3]
    assert dict(GLR_SHORT_CALIBRATION)[c0] > p_long * 64 / 3000


def test_a_long_run_is_held_to_the_long_threshold_after_64_rows():
    """A fall at row 200 of a flat run: the alert states the 3000-row rate, not the short one."""
    rng = np.random.default_rng(0)
    reward = np.r_[0.6 + rng.normal(0, 0.05, 200), 0.02 + rng.normal(0, 0.01, 40)]
    df = pd.DataFrame({"step": np.arange(1, 241), "reward_mean": np.clip(reward, 0, 1)})
    hits = [x for x in analyze_run(df, jobs=1).alerts if x.kind == "collapse"]
    assert hits and hits[0].evidence["threshold_for_rows"] == 3000
    assert "rows of noise like this run's (noise sd" in hits[0].message


def test_held_out_short_runs_are_called_and_healthy_ones_left_alone():
    """scripts/short_runs.py on seed 3 (not the tuning seed): 60 collapses, 60 healthy runs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import short_runs
    finally:
        sys.path.pop(0)
    rng = np.random.default_rng(3)
    runs = [short_runs.simulate(k, rng) for k in ("collapse", "healthy") for _ in range(60)]
    judged = [short_runs.judge(r) for r in runs]
    col = [j for j in judged if j["kind"] == "collapse"]
    big = [j for j in col if j["delta"] >= 3 and j["after"] >= 6]
    healthy = [j for j in judged if j["kind"] == "healthy"]
    assert sum(j["caught"] for j in big) >= 0.9 * len(big)
    assert sum(j["caught"] for j in col) >= 0.7 * len(col)  # (60 runs: sd about 0.06)
    assert sum(bool(j["alarm"]) for j in healthy) <= 1


@pytest.mark.parametrize("seed", range(5))
def test_a_run_that_falls_from_its_first_steps_is_flagged(seed):
    """A setup failure (a broken weight sync looks like this): 0.35 on the first 3 rows, then
    ~0.01 to the end; a short run's test compares with its first 3 rows."""
    rng = np.random.default_rng(seed)
    n = 30
    reward = np.r_[0.35 + rng.normal(0, 0.05, 3), np.clip(0.01 + rng.normal(0, 0.01, n - 3), 0, 1)]
    df = pd.DataFrame({"step": np.arange(1, n + 1), "reward_mean": reward})
    hits = [x for x in analyze_run(df, jobs=1).alerts if x.kind == "collapse"]
    assert hits and hits[0].step <= 12 and hits[0].evidence["reference_rows"] == 3


@pytest.mark.parametrize("seed", range(5))
def test_a_run_flat_at_its_floor_or_rising_from_a_low_start_is_left_alone(seed):
    rng = np.random.default_rng(seed)
    n = 30
    flat = np.clip(0.02 + rng.normal(0, 0.02, n), 0, 1)
    rising = np.clip(0.05 + 0.6 * (1 - np.exp(-np.arange(n) / 8)) + rng.normal(0, 0.05, n), 0, 1)
    for reward in (flat, rising):
        df = pd.DataFrame({"step": np.arange(1, n + 1), "reward_mean": reward})
        bad = [x for x in analyze_run(df, jobs=1).alerts if x.severity == "critical"]
        assert not bad, [(x.step, x.kind) for x in bad]


def test_the_short_calibration_holds_on_fresh_noise():
    """150 fresh runs of 64 rows of white noise, the noise of each row estimated from the rows
    before it and tests reaching back to 3 rows, as a short run's check does: the share that
    crosses c = 3.5 is the table's (binomial sd about 0.02 at 150 runs)."""
    from lld_monitor.analysis.stats import (
        GLR_MIN_REF,
        GLR_SHORT_MIN_REF,
        GLR_SHORT_ROWS,
        glr_scan,
        series_noise_sd,
    )

    rng = np.random.default_rng(2027)
    peaks = []
    for _ in range(150):
        x = rng.normal(0.0, 1.0, GLR_SHORT_ROWS)
        zs = [
            glr_scan(x[:n], series_noise_sd(x[:n], blocks=(2, 4)), min_ref=GLR_SHORT_MIN_REF)[0][-1]
            for n in range(GLR_MIN_REF + 1, GLR_SHORT_ROWS + 1)
        ]
        peaks.append(np.nanmax(zs))
    share = float(np.mean(np.array(peaks) >= 3.5))
    assert abs(share - dict(GLR_SHORT_CALIBRATION)[3.5]) <= 0.07, share
