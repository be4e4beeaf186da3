"""``GradSpike`` / ``KlSpike``: one row far above the median of the last 25 logged values."""

from __future__ import annotations

from lld_monitor import columns as C
from lld_monitor.analysis.checks import GradSpike, KlSpike


def _grad_rows(extra: dict[int, float]) -> list[dict]:
    # grad norm 1.0, 1.1, 0.9, 1.0, ...; ``extra`` replaces some steps' values. Over steps
    # 0-24: 9 x 1.0, 8 x 1.1, 8 x 0.9 -> median 1.0; deviations 9 x 0, 16 x 0.1 -> MAD 0.1
    cycle = (1.0, 1.1, 0.9)
    return [{C.STEP: s, C.GRAD_NORM: extra.get(s, cycle[s % 3])} for s in range(40)]


def test_grad_spike_by_hand(cfg, feed):
    # at step 25 the window holds steps 0-24: median 1.0, MAD 0.1, baseline (highest median
    # so far) 1.0; 100 is x100 >= spike_grad_ratio 50 and > 1.0 + 10 * 1.4826 * 0.1 = 2.48
    fed, _ = feed(GradSpike(cfg), _grad_rows({25: 100.0}))
    hits = [(s, a) for s, alerts in fed for a in alerts]
    assert [s for s, _ in hits] == [25]
    a = hits[0][1]
    assert (a.kind, a.severity) == ("spike", "info")
    assert a.evidence["median"] == 1.0 and abs(a.evidence["mad"] - 0.1) < 1e-12
    assert a.evidence["baseline"] == 1.0 and a.evidence["window_rows"] == 25
    # (100 - 1.0) / (1.4826 * 0.1) = 668 MADs
    assert "x100 its baseline 1 " in a.message and "668 MADs above it" in a.message


def test_grad_spike_below_ratio_warmup_and_cooldown(cfg, feed):
    # x40 < 50: no spike; a x100 value at step 12 comes before the warm-up (20 steps): none;
    # at 25 a spike, at 30 a second one within the cooldown (10 values): none; 37 is past it
    fed, _ = feed(
        GradSpike(cfg), _grad_rows({12: 100.0, 22: 40.0, 25: 100.0, 30: 100.0, 37: 100.0})
    )
    assert [s for s, alerts in fed if alerts] == [25, 37]


def test_kl_spike_uses_the_kl_floor(cfg, feed):
    # KL steady at 0.001 (MAD 0): the baseline is kl_floor 0.01, not 0.001; 0.15 is x15 the
    # floor (< spike_ratio 20): none; 0.5 is x50: a spike ("MAD 0")
    rows = [{C.STEP: s, C.KL: {24: 0.15, 30: 0.5}.get(s, 0.001)} for s in range(35)]
    fed, _ = feed(KlSpike(cfg), rows)
    hits = [a for _, alerts in fed for a in alerts]
    assert [a.step for a in hits] == [30]
    assert hits[0].evidence["baseline"] == 0.01 and "MAD 0" in hits[0].message
    assert "KL to the reference" in hits[0].message
