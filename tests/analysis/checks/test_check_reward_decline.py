"""``RewardDecline``: a significant slow reward decline (``Signals.rw_decline``), outside a
collapse, held 10 steps and a quarter of the window it was seen in."""

from __future__ import annotations

from types import SimpleNamespace

from lld_monitor import columns as C
from lld_monitor.analysis.checks import RewardDecline
from lld_monitor.analysis.trend import TrendFit

# a 200-step window whose fitted reward goes 0.6 -> 0.3 (slope -0.0015/step, t = -8)
FIT = TrendFit(2, -0.0015, -8.0, 3.5, -0.3, 0.03, 200.0, 100.0, 300.0, 0.6, 0.3, 10, 8.0, 0.1)


def _rows(phase: str, decline_from: int = 30) -> list[SimpleNamespace]:
    # the check reads only warm, phase, step and rw_decline of the Signals
    return [
        SimpleNamespace(
            warm=s >= 20, phase=phase, step=float(s), rw_decline=FIT if s >= decline_from else None
        )
        for s in range(120)
    ]


def test_fires_after_a_quarter_of_its_window_with_the_fit_in_words(cfg):
    check = RewardDecline(cfg)
    fired = [(int(s.step), a) for s in _rows("healthy") for a in check.update(s)]
    # declining from step 30, seen over a 200-step window: held 200 / 4 = 50 steps -> 80
    assert [st for st, _ in fired] == [80]
    a = fired[0][1]
    # (0.3 - 0.6) / 0.6 = -50%
    assert a.message == (
        "reward declining: 0.6 -> 0.3 (-50%) over 200 steps, t=-8.0, with no collapse seen "
        "(for 50 steps); not specific to LLD"
    )
    assert a.evidence == {
        "reward_start": 0.6,
        "reward_end": 0.3,
        "reward_t": -8.0,
        "window_steps": 200.0,
        "held_steps": 50.0,
    }


def test_silent_in_a_collapse_and_before_the_warm_up(cfg):
    check = RewardDecline(cfg)
    assert not [a for s in _rows("collapse") for a in check.update(s)]
    check = RewardDecline(cfg)  # declining from step 0: the streak starts when warm (20) -> 70
    assert [int(s.step) for s in _rows("healthy", 0) if check.update(s)] == [70]


def test_a_dip_that_recovers_within_a_quarter_of_its_window_is_not_a_decline(cfg):
    # the decline holds steps 30-69 (40 steps < 200 / 4), then the reward is back: no alert
    rows = _rows("healthy")
    for r in rows[70:]:
        r.rw_decline = None
    check = RewardDecline(cfg)
    assert not [a for s in rows for a in check.update(s)]


def test_a_real_decline_through_signals(cfg, feed):
    # reward 0.60 -> 0.30 linearly over steps 100..300 (+-0.02 alternating): a 50% decline,
    # significant at the 120- and 240-step scales; a flat noisy reward is not one
    rows = [
        {C.STEP: s, C.REWARD_MEAN: 0.6 - 0.0015 * max(0, s - 100) + 0.02 * (-1) ** s}
        for s in range(300)
    ]
    fed, _ = feed(RewardDecline(cfg), rows)
    steps = [s for s, alerts in fed if alerts]
    assert len(steps) == 1 and 150 < steps[0] < 300
    flat = [{C.STEP: s, C.REWARD_MEAN: 0.6 + 0.02 * (-1) ** s} for s in range(300)]
    fed, _ = feed(RewardDecline(cfg), flat)
    assert not any(alerts for _, alerts in fed)
