"""``EntropyCollapse``: entropy (fast EMA) below 10% of its level over the warm-up rows."""

from __future__ import annotations

import math

from lld_monitor import columns as C
from lld_monitor.analysis.checks import EntropyCollapse


def test_fires_ten_steps_after_the_ema_crosses_the_floor(cfg, feed):
    # entropy 2.0 over the warm-up (steps 0-19: early level 2.0), 0.1 from step 30. After k rows
    # of 0.1 the fast EMA (tau 5, one step apart) is 0.1 + 1.9 exp(-k / 5) <= 0.2 from
    # k >= 5 ln 19 = 14.7, i.e. k = 15 at step 44; held 10 steps at 54.
    rows = [{C.STEP: s, C.ENTROPY: 2.0 if s < 30 else 0.1} for s in range(70)]
    fed, s = feed(EntropyCollapse(cfg), rows)
    assert s.entropy_early == 2.0
    assert [st for st, alerts in fed if alerts] == [54]
    a = fed[54][1][0]
    ema = 0.1 + 1.9 * math.exp(-25 / 5)  # 25 rows of 0.1 at step 54
    assert abs(a.evidence["entropy"] - ema) < 1e-9 and a.evidence["entropy_early"] == 2.0
    assert "of its early level 2:" in a.message


def test_half_the_early_level_is_not_a_collapse(cfg, feed):
    rows = [{C.STEP: s, C.ENTROPY: 2.0 if s < 30 else 1.0} for s in range(90)]
    fed, _ = feed(EntropyCollapse(cfg), rows)
    assert not any(alerts for _, alerts in fed)
