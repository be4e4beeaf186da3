"""``Nonfinite``: a NaN loss fires at once; NaN grad norms after 3 rows in a row; re-arms."""

from __future__ import annotations

import math

from lld_monitor import columns as C
from lld_monitor.analysis.checks import Nonfinite

NAN = math.nan


def _fired(fed):
    return [(step, a.kind, a.severity) for step, alerts in fed for a in alerts]


def test_nan_loss_fires_at_once_and_rearms(cfg, feed):
    # loss 1.0 at steps 0-1, NaN at 2 (the row also has a reward: a training row), NaN at 3
    # (same episode: no second alert), finite at 4 (re-arms: the grad norm is not bad either),
    # NaN at 5 -> a second alert. No warm-up: a numerical failure is one whenever it comes.
    rows = [
        {C.STEP: s, C.LOSS: v, C.REWARD_MEAN: 0.5}
        for s, v in enumerate([1.0, 1.0, NAN, NAN, 1.0, NAN])
    ]
    fed, _ = feed(Nonfinite(cfg), rows)
    assert _fired(fed) == [(2, "nonfinite", "critical"), (5, "nonfinite", "critical")]
    alert = fed[2][1][0]
    assert "loss=nan" in alert.message and alert.evidence["loss"] is None


def test_missing_loss_is_not_nonfinite(cfg, feed):
    # a row with only a step (an eval row) carries no training value: a blank, not a NaN
    rows = [{C.STEP: 0, C.LOSS: 1.0, C.REWARD_MEAN: 0.5}, {C.STEP: 1}, {C.STEP: 2}]
    fed, _ = feed(Nonfinite(cfg), rows)
    assert _fired(fed) == []


def test_grad_norm_needs_three_rows_in_a_row(cfg, feed):
    # grad norm inf at steps 1, 2 (2 rows), finite at 3 (the count restarts), inf at 4, 5, 6:
    # nonfinite_grad_rows = 3 is reached at step 6
    grads = [1.0, math.inf, math.inf, 1.0, math.inf, math.inf, math.inf]
    rows = [{C.STEP: s, C.GRAD_NORM: g} for s, g in enumerate(grads)]
    fed, _ = feed(Nonfinite(cfg), rows)
    assert _fired(fed) == [(6, "nonfinite", "critical")]
    assert "grad_norm=inf (3 rows in a row)" in fed[6][1][0].message
    assert fed[6][1][0].evidence == {"loss": None, "grad_norm": "inf", "rows": 3}


def test_marked_nonfinite_counts_even_when_blank(cfg, feed):
    # the row names its non-finite loss (C.NONFINITE): a blank loss is then a NaN loss
    rows = [{C.STEP: 0}, {C.STEP: 1, C.NONFINITE: "loss"}]
    fed, _ = feed(Nonfinite(cfg), rows)
    assert _fired(fed) == [(1, "nonfinite", "critical")]
