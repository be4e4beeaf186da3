"""``Displacement``: the paper's >50% indicator as a pooled one-sided test, probe and in-batch."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.checks import Displacement


def _probe(step: int, share: float, n: float = 40, lr: float = 1e-4) -> dict:
    return {
        C.STEP: step,
        C.FRAC_CORRECT_DISPLACED: share,
        C.N_CORRECT: n,
        C.LEARNING_RATE: lr,
    }


def test_probe_fires_rearms_and_fires_again_by_hand(cfg, feed):
    # step 1: 0.9 of 40 -> k 36, n 40, sum w^2 n = 40; z = (36 - 20) / sqrt(0.25 * 40) = 5.06
    #   >= 2.326 with n >= 12: fires.
    # step 2: lr 0 (the optimizer did not step): no evidence. step 3: the same probe as step 1
    #   repeated (a rollout batch's value on its next row): not counted again.
    # step 4: 0.1 of 40 -> k = 0.5 * 36 + 4 = 22, n = 0.5 * 40 + 40 = 60: 22 < 30, re-armed.
    # step 5: 0.9 of 40 -> k = 11 + 36 = 47, n = 30 + 40 = 70, s2 = 0.25 * 50 + 40 = 52.5;
    #   z = (47 - 35) / sqrt(0.25 * 52.5) = 3.31: fires again.
    rows = [_probe(1, 0.9), _probe(2, 0.95, lr=0.0), _probe(3, 0.9), _probe(4, 0.1), _probe(5, 0.9)]
    check = Displacement(cfg)
    fed, _ = feed(check, rows)
    assert [s for s, alerts in fed if alerts] == [1, 5]
    first = fed[0][1][0]
    assert (first.kind, first.severity) == ("displacement", "warning")
    assert first.evidence["displaced_z"] == pytest.approx(16 / math.sqrt(10))
    assert first.evidence["displaced_source"] == "probe"
    assert "90% in the latest probe" in first.message
    assert check.probe.k == pytest.approx(47) and check.probe.n == pytest.approx(70)
    assert fed[-1][1][0].evidence["displaced_z"] == pytest.approx(12 / math.sqrt(0.25 * 52.5))


def test_probe_below_half_never_fires(cfg, feed):
    # 0.45 of 400 every step: the share is below 0.5, however many responses back it
    fed, _ = feed(Displacement(cfg), [_probe(s, 0.45 + 0.001 * (s % 2), 400) for s in range(50)])
    assert not any(alerts for _, alerts in fed)


def test_in_batch_counts_fire_once_pooled_n_reaches_12(cfg, feed):
    # 2 of 2 correct responses displaced per row, pooled with weight m = 0.5 ** (2 / 24) per
    # row: n after r rows = 2 (1 - m^r) / (1 - m): 11.85 at r = 7, 13.18 at r = 8 (>= 12);
    # s2 = 2 (1 - m^16) / (1 - m^2) = 11.06 -> z = 13.18 / sqrt(11.06) = 3.96 >= 2.326
    rows = [
        {C.STEP: s, C.INBATCH_N_CORRECT: 2, C.INBATCH_N_CORRECT_DISPLACED: 2} for s in range(1, 12)
    ]
    check = Displacement(cfg)
    fed, _ = feed(check, rows)
    assert [s for s, alerts in fed if alerts] == [8]
    assert fed[7][1][0].evidence["displaced_source"] == "in_batch"
    assert fed[7][1][0].evidence["displaced_pooled_n"] == pytest.approx(13.18, abs=0.01)


def test_one_alert_for_one_displacement(cfg, feed):
    # the probe fires first; the in-batch evidence that follows is the same displacement
    rows = [_probe(1, 0.9)] + [
        {C.STEP: s, C.INBATCH_N_CORRECT: 2, C.INBATCH_N_CORRECT_DISPLACED: 2} for s in range(2, 14)
    ]
    fed, _ = feed(Displacement(cfg), rows)
    assert [s for s, alerts in fed if alerts] == [1]


def test_a_share_of_0_6_fires_over_the_last_probes_together(cfg, feed):
    # 12 of 20 and 6 of 10 displaced, alternating (0.6 every probe). The pool that keeps half
    # per probe never gets there: its z settles at 4/3 (< 2.326). The last probes together do:
    # 12 probes: 108 of 180, z = (108 - 90) / sqrt(0.25 * 180) = 2.68 < 2.807;
    # 13 probes: 120 of 200, z = 20 / sqrt(50) = 2.83 >= 2.807 (1% over 4 windows): fires
    rows = [_probe(s, 0.6, 20.0 if s % 2 else 10.0) for s in range(1, 41)]
    fed, _ = feed(Displacement(cfg), rows)
    fired = [(s, alerts[0]) for s, alerts in fed if alerts]
    assert [s for s, _ in fired] == [13]
    ev = fired[0][1].evidence
    assert ev["displaced_window_probes"] == 13 and ev["displaced_pooled_n"] == pytest.approx(200)
    assert ev["displaced_z"] == pytest.approx(20 / math.sqrt(50))
    assert "the last 13 probes together 60% of 200" in fired[0][1].message
    # without the windows (1 probe: none to pool) the same probes never fire
    fed, _ = feed(Displacement(replace(cfg, displaced_windows=1)), rows)
    assert not any(alerts for _, alerts in fed)
    # nor do probes of 0.45 and 0.4, windows or not
    low = [_probe(s, 0.45 if s % 2 else 0.4, 20.0) for s in range(1, 201)]
    fed, _ = feed(Displacement(cfg), low)
    assert not any(alerts for _, alerts in fed)


def test_window_counts_survive_a_state_round_trip(cfg, feed):
    rows = [_probe(s, 0.6, 20.0 if s % 2 else 10.0) for s in range(1, 41)]
    check = Displacement(cfg)
    feed(check, rows[:7])
    again = Displacement(cfg)
    again.load_state_dict(json.loads(json.dumps(check.state_dict())))
    assert list(again.probe.recent) == list(check.probe.recent) and len(check.probe.recent) == 7
