"""``llds_inert`` by hand (issue 51, item 1): LLDS on and its loss exactly 0 on 20 rows in a
row, with the reason the row gives; the authors' fork's keys alone (coefficient and weighted
loss) are enough; a row with a loss re-arms it."""

from __future__ import annotations

from lld_monitor import columns as C
from lld_monitor.analysis import PhaseDetector


def _alerts(rows):
    det = PhaseDetector()
    return [a for r in rows for a in det.update(r) if a.kind == "llds_inert"]


def _on(step, loss=0.0, **kw):
    return {
        C.STEP: step,
        C.REWARD_MEAN: 0.3,
        C.LLDS_ENABLED: 1,
        C.LLDS_LAMBDA: 0.2,
        C.LLDS_LOSS: loss,
        **kw,
    }


def test_twenty_rows_of_zero_loss_with_llds_on():
    rows = [_on(s, **{C.FRAC_ZERO_STD_GROUPS: 0.2, C.LLDS_FRAC_GATED: 0.0}) for s in range(1, 26)]
    (a,) = _alerts(rows)
    assert (a.step, a.severity) == (20, "warning")
    assert a.evidence["reason"] == "gate_never_fires" and a.evidence["since_step"] == 1
    assert "either the generation batch is not reused" in a.message


def test_reasons_and_rearming():
    tied = [_on(s, **{C.FRAC_ZERO_STD_GROUPS: 0.9}) for s in range(1, 21)]
    assert _alerts(tied)[0].evidence["reason"] == "zero_variance"
    plain = [_on(s) for s in range(1, 21)]
    assert _alerts(plain)[0].evidence["reason"] == "no_reuse"
    # a loss on every 8th row (the first update of each reused batch is 0): never 20 in a row
    reused = [_on(s, loss=0.0 if s % 8 == 1 else 0.01) for s in range(1, 200)]
    assert _alerts(reused) == []
    # LLDS off: nothing to say; on again after a loss: a new episode
    off = [
        {C.STEP: s, C.REWARD_MEAN: 0.3, C.LLDS_ENABLED: 0, C.LLDS_LOSS: 0.0} for s in range(1, 40)
    ]
    assert _alerts(off) == []
    two = [_on(s) for s in range(1, 21)] + [_on(21, loss=0.3)] + [_on(s) for s in range(22, 42)]
    assert [a.step for a in _alerts(two)] == [20, 41]


def test_the_authors_fork_keys_alone():
    rows = [
        {C.STEP: s, C.REWARD_MEAN: 0.3, C.LLDS_LAMBDA: 0.05, C.LLDS_LOSS_WEIGHTED: 0.0}
        for s in range(1, 21)
    ]
    (a,) = _alerts(rows)
    assert a.step == 20 and "(lambda 0.05)" in a.message
