"""``DeadSignal``: every group with one reward, held 10 steps once warm; re-arms after 10 clear."""

from __future__ import annotations

from lld_monitor import columns as C
from lld_monitor.analysis.checks import DeadSignal


def test_fires_after_ten_steps_and_rearms(cfg, feed):
    # frac_zero_std_groups 1.0 from step 25 (warm since step 20): held 10 steps at 35.
    # Clear from 40: re-armed at 50 (10 steps clear); dead again from 60: fires at 70.
    def zstd(s: int) -> float:
        return 1.0 if 25 <= s < 40 or s >= 60 else 0.2

    fed, _ = feed(
        DeadSignal(cfg), [{C.STEP: s, C.FRAC_ZERO_STD_GROUPS: zstd(s)} for s in range(80)]
    )
    assert [s for s, alerts in fed if alerts] == [35, 70]
    a = fed[35][1][0]
    assert (a.kind, a.severity) == ("dead_signal", "warning")
    assert a.message.endswith("(for 10 steps); not a sign of LLD")
    assert a.evidence == {"frac_zero_std_groups": 1.0, "reward_std": None, "held_steps": 10.0}


def test_dead_from_the_start_counts_from_the_warm_up(cfg, feed):
    # reward_std 0 on every row: the streak starts at the first warm row (step 20) -> 30
    fed, _ = feed(DeadSignal(cfg), [{C.STEP: s, C.REWARD_STD: 0.0} for s in range(40)])
    assert [s for s, alerts in fed if alerts] == [30]
    assert "reward_std=0" in fed[30][1][0].message


def test_short_episode_does_not_fire(cfg, feed):
    # dead for 9 steps only (25-33)
    rows = [{C.STEP: s, C.FRAC_ZERO_STD_GROUPS: 1.0 if 25 <= s < 34 else 0.0} for s in range(60)]
    fed, _ = feed(DeadSignal(cfg), rows)
    assert not any(alerts for _, alerts in fed)
