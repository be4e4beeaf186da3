"""``SharpDropCollapse``: a sharp logp_correct drop with a corroborating signal, or a standard-
metric collapse (two corroborating signals and a reward trend down): rank 3."""

from __future__ import annotations

import math

from lld_monitor import columns as C
from lld_monitor.analysis.checks import SharpDropCollapse
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.signals import INPUT_COLUMNS, Signals


def _ranks(check: SharpDropCollapse, rows: list[dict]) -> list[tuple[int, int]]:
    s = Signals(check.config)
    out = []
    for r in rows:
        s.update(float(r[C.STEP]), tuple(float(r.get(c, math.nan)) for c in INPUT_COLUMNS))
        assert check.update(s) == []
        out.append((int(r[C.STEP]), check.rank))
    return out


def _lp(s: int, drop: bool) -> float:
    # -0.3 +- 0.002, falling 0.02 per step from step 100 when ``drop``
    return -0.3 + 0.002 * (-1) ** s - (0.02 * (s - 100) if drop and s >= 100 else 0.0)


def _rows(drop: bool, surge: bool) -> list[dict]:
    return [
        {
            C.STEP: s,
            C.LOGP_CORRECT: _lp(s, drop),
            C.GRAD_NORM: 10.0 if surge and s >= 100 else 1.0,
            C.REWARD_MEAN: 0.5,
        }
        for s in range(130)
    ]


def test_sharp_drop_with_a_grad_surge(cfg):
    # from step 100: grad norm x10 (fast vs slow geometric EMA past x2 within 3 steps) and
    # logp_correct -0.02 per step (past collapse_drop 0.05 over the 10-step window at 103)
    ranks = _ranks(SharpDropCollapse(cfg), _rows(drop=True, surge=True))
    first = next(s for s, r in ranks if r == 3)
    assert first == 103 and all(r == 0 for s, r in ranks if s < 100)


def test_needs_both_the_drop_and_a_corroborating_signal(cfg):
    assert {r for _, r in _ranks(SharpDropCollapse(cfg), _rows(drop=True, surge=False))} == {0}
    assert {r for _, r in _ranks(SharpDropCollapse(cfg), _rows(drop=False, surge=True))} == {0}


def test_no_rank_before_the_warm_up():
    check = SharpDropCollapse(DetectorConfig(warmup_steps=200))
    assert {r for _, r in _ranks(check, _rows(drop=True, surge=True))} == {0}


def test_standard_metrics_alone(cfg):
    # no logp_correct: the reward falls 0.01 per step from step 150 and the grad norm jumps
    # x10: two corroborating signals and a significant downward reward trend
    rows = [
        {
            C.STEP: s,
            C.REWARD_MEAN: max(0.6 + 0.01 * (-1) ** s - (0.01 * (s - 150) if s >= 150 else 0), 0),
            C.GRAD_NORM: 1.0 if s < 150 else 10.0,
        }
        for s in range(260)
    ]
    ranks = _ranks(SharpDropCollapse(cfg), rows)
    first = next(s for s, r in ranks if r == 3)
    assert 150 < first < 200 and all(r == 0 for s, r in ranks if s < 150)
