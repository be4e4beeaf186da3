"""``no_update`` and ``zero_grad`` (issue 51, item 3) by hand: exact-zero streaks, rows without
the column neither count nor break them, one alert per episode, re-armed by a normal row."""

from __future__ import annotations

import math

from lld_monitor import columns as C
from lld_monitor.analysis import PhaseDetector

NAN = math.nan


def _kinds(rows: list[dict]) -> list[tuple[int, str, str]]:
    det = PhaseDetector()
    return [(a.step, a.kind, a.severity) for r in rows for a in det.update(r)]


def _row(step: int, **kw: float) -> dict:
    return {C.STEP: step, C.REWARD_MEAN: 0.3, C.LOSS: 0.05, C.GRAD_NORM: 0.8, **kw}


def test_no_update_after_three_probed_rows_that_did_not_move():
    rows = [_row(1, **{C.PROBE_STILL: 0.0})]
    rows += [_row(2, **{C.PROBE_STILL: 1.0}), _row(3), _row(4, **{C.PROBE_STILL: 1.0})]
    rows += [_row(5), _row(6, **{C.PROBE_STILL: 1.0}), _row(7, **{C.PROBE_STILL: 1.0})]
    got = _kinds(rows)
    assert got == [(6, "no_update", "critical")]  # the 3rd probed row; unprobed rows skipped
    det = PhaseDetector()
    alert = next(a for r in rows for a in det.update(r))
    assert alert.evidence["since_step"] == 2 and alert.evidence["rows"] == 3
    assert "the update did nothing at step 6" in alert.message


def test_no_update_needs_a_loss_or_a_gradient_and_rearms():
    # nothing asked of the update (loss 0, grad 0): a dead run, not a broken optimizer
    still = {C.PROBE_STILL: 1.0, C.LOSS: 0.0, C.GRAD_NORM: 0.0}
    assert _kinds([_row(s, **still) for s in range(1, 6)]) == []
    # one episode, a moving probe, a second episode
    rows = [_row(s, **{C.PROBE_STILL: 1.0}) for s in range(1, 5)]
    rows += [_row(5, **{C.PROBE_STILL: 0.5})]
    rows += [_row(s, **{C.PROBE_STILL: 1.0}) for s in range(6, 9)]
    assert _kinds(rows) == [(3, "no_update", "critical"), (8, "no_update", "critical")]


def test_zero_grad_while_groups_differ():
    rows = [_row(s, **{C.GRAD_NORM: 0.0, C.FRAC_ZERO_STD_GROUPS: 0.5}) for s in range(1, 5)]
    assert _kinds(rows) == [(3, "zero_grad", "warning")]
    # every group one reward: zero advantages explain the zero gradient (dead_signal's case)
    dead = [_row(s, **{C.GRAD_NORM: 0.0, C.FRAC_ZERO_STD_GROUPS: 1.0}) for s in range(1, 5)]
    assert [k for k in _kinds(dead) if k[1] == "zero_grad"] == []
    # the share not logged: the batch's reward spread is no evidence (groups that each got
    # one reward spread it too), so nothing says whether there was a signal: silent
    rows = [_row(s, **{C.GRAD_NORM: 0.0, C.REWARD_STD: 0.2}) for s in range(1, 4)]
    assert _kinds(rows) == []
    assert _kinds([_row(s, **{C.GRAD_NORM: 0.0}) for s in range(1, 6)]) == []
