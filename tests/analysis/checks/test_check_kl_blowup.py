"""``KlBlowup``: KL (fast EMA) at 100x its settled level, the settled level at least 0.01."""

from __future__ import annotations

from lld_monitor import columns as C
from lld_monitor.analysis.checks import KlBlowup


def test_fires_at_100x_the_floor(cfg, feed):
    # KL 0.001 until step 29 (settled level: lowest slow EMA once warm = 0.001, floored at
    # kl_floor 0.01), 5.0 from step 30: after k rows the fast EMA is 5 - 4.999 exp(-k / 5)
    # >= 100 * 0.01 = 1 from k >= 5 ln(4.999 / 4) = 1.11, i.e. k = 2 at step 31; fires at 41
    rows = [{C.STEP: s, C.KL: 0.001 if s < 30 else 5.0} for s in range(60)]
    fed, s = feed(KlBlowup(cfg), rows)
    assert s.kl_ref == 0.001
    assert [st for st, alerts in fed if alerts] == [41]
    a = fed[41][1][0]
    assert a.evidence["kl_settled"] == 0.01
    assert "its settled level 0.01" in a.message and a.message.endswith("not specific to LLD")


def test_50x_is_not_a_blowup(cfg, feed):
    rows = [{C.STEP: s, C.KL: 0.001 if s < 30 else 0.5} for s in range(80)]
    fed, _ = feed(KlBlowup(cfg), rows)
    assert not any(alerts for _, alerts in fed)
