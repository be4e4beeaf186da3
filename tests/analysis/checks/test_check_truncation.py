"""``Truncation``: most completions cut at the cap, held 10 steps over at least 3 logged rows."""

from __future__ import annotations

from lld_monitor import columns as C
from lld_monitor.analysis.checks import Truncation


def test_sparse_log_fires_after_ten_steps(cfg, feed):
    # a row every 10 steps, frac_truncated 0.9 on each: warm at step 40 (20 steps and 5 rows);
    # the condition holds from 40, 10 steps at 50 with 6 rows >= 0.5 in a row
    rows = [{C.STEP: s, C.FRAC_TRUNCATED: 0.9} for s in range(0, 100, 10)]
    fed, _ = feed(Truncation(cfg), rows)
    assert [s for s, alerts in fed if alerts] == [50]
    a = fed[5][1][0]
    assert a.evidence == {"frac_truncated": 0.9, "rows": 6, "held_steps": 10.0}
    assert a.message.startswith("90% of completions cut at the length cap")


def test_needs_three_logged_rows(cfg, feed):
    # 0 on steps 0-29, then 1.0 at steps 40, 60, 70: the fast EMA jumps past 0.5 at 40
    # (weight 1 - exp(-11 / 5) = 0.89); at 60 the condition has held 20 steps but over 2 rows
    # only; at 70 (3 rows): fires
    rows = [{C.STEP: s, C.FRAC_TRUNCATED: 0.0} for s in range(30)]
    rows += [{C.STEP: s, C.FRAC_TRUNCATED: 1.0} for s in (40, 60, 70)]
    fed, _ = feed(Truncation(cfg), rows)
    assert [s for s, alerts in fed if alerts] == [70]
