"""``LengthBlowup``: completion length (fast EMA) at 3x its warm-up level, held 10 steps."""

from __future__ import annotations

from lld_monitor import columns as C
from lld_monitor.analysis.checks import LengthBlowup


def test_fires_when_the_ema_reaches_three_times_the_early_level(cfg, feed):
    # length 100 over the warm-up, 400 from step 30: after k rows the fast EMA is
    # 400 - 300 exp(-k / 5) >= 300 from k >= 5 ln 3 = 5.5, i.e. k = 6 at step 35; fires at 45
    rows = [{C.STEP: s, C.COMPLETION_LENGTH: 100.0 if s < 30 else 400.0} for s in range(60)]
    fed, _ = feed(LengthBlowup(cfg), rows)
    assert [s for s, alerts in fed if alerts] == [45]
    a = fed[45][1][0]
    assert a.evidence["completion_length_early"] == 100.0
    # at step 45: 16 rows of 400 -> 400 - 300 exp(-16 / 5) = 387.8, x3.9 the early level
    assert a.message.startswith("completion length 388 is x3.9 its early level 100 (for 10 ")


def test_double_length_is_not_a_blowup(cfg, feed):
    rows = [{C.STEP: s, C.COMPLETION_LENGTH: 100.0 if s < 30 else 200.0} for s in range(90)]
    fed, _ = feed(LengthBlowup(cfg), rows)
    assert not any(alerts for _, alerts in fed)
