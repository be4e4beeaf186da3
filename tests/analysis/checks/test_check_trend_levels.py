"""``TrendLevels``: stagnation / decay confirmed on a trend level, as the phase machine's rank."""

from __future__ import annotations

import math

from lld_monitor import columns as C
from lld_monitor.analysis.checks import TrendLevels
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.signals import INPUT_COLUMNS, Signals


def _ranks(check: TrendLevels, rows: list[dict]) -> list[tuple[int, int, int]]:
    """(step, rank, level) after each row."""
    s = Signals(check.config)
    out = []
    for r in rows:
        s.update(float(r[C.STEP]), tuple(float(r.get(c, math.nan)) for c in INPUT_COLUMNS))
        assert check.update(s) == []  # ranks only, never an alert
        out.append((int(r[C.STEP]), check.rank, check.level))
    return out


def _first(ranks: list[tuple[int, int, int]], rank: int) -> int | None:
    return next((s for s, r, _ in ranks if r == rank), None)


def _decay_rows(n: int = 200) -> list[dict]:
    # logp_correct falls 0.001 per step (+-0.002 alternating), the reward holds at 0.5
    return [
        {C.STEP: s, C.REWARD_MEAN: 0.5, C.LOGP_CORRECT: -0.3 - 0.001 * s + 0.002 * (-1) ** s}
        for s in range(n)
    ]


def test_decay_confirmed_on_the_finest_level(cfg):
    # level 0: bins of 3 steps, 10 of them. A fitted drop of 0.025 at 0.001 per step needs a
    # span of 25 steps: 10 closed bins (span 27), first at step 30 (bin 9 closes); confirmed
    # after 3 tests (30, 33, 36) spanning 3 bins (9 steps): step 39
    ranks = _ranks(TrendLevels(cfg), _decay_rows())
    assert _first(ranks, 2) == 39
    assert all(r == 0 for s, r, _ in ranks if s < 39) and ranks[-1][1:] == (2, 0)


def test_recover_span_is_three_windows_of_the_level(cfg):
    check = TrendLevels(cfg)
    _ranks(check, _decay_rows())
    assert check.recover_after == 3 * 30.0  # level 0: 10 bins of 3 steps


def test_no_rank_before_the_warm_up():
    check = TrendLevels(DetectorConfig(warmup_steps=60))
    ranks = _ranks(check, _decay_rows())
    assert _first(ranks, 2) == 60  # confirmed at 39, shown once warm


def test_flat_logp_and_flat_reward_is_nothing(cfg):
    rows = [
        {C.STEP: s, C.REWARD_MEAN: 0.5, C.LOGP_CORRECT: -0.3 + 0.002 * (-1) ** s}
        for s in range(200)
    ]
    assert {r for _, r, _ in _ranks(TrendLevels(cfg), rows)} == {0}


def test_stagnation_flat_logp_while_the_reward_rises(cfg):
    # reward +0.002 per step, logp_correct flat (a hair down): 6 level-0 bins (the fewest a fit
    # takes) at step 18; tests at 18, 21, 24, the span of 3 bins reached at 27 (warm since 20)
    rows = [
        {
            C.STEP: s,
            C.REWARD_MEAN: 0.2 + 0.002 * s + 0.01 * (-1) ** s,
            C.LOGP_CORRECT: -0.3 - 0.00002 * s + 0.002 * (-1) ** s,
        }
        for s in range(300)
    ]
    ranks = _ranks(TrendLevels(cfg), rows)
    assert _first(ranks, 1) == 27 and _first(ranks, 2) is None


class _DecayOnLevel4From100(TrendLevels):
    """Every test of level 4 from step 100 on says decay; every other test says nothing."""

    __slots__ = ()

    def _level_rank(self, s: Signals, level: int) -> int:
        return 2 if level == 4 and s.step >= 100 else 0


def test_persistence_of_dense_bins_counts_tests_not_the_steps_between_them(cfg):
    # logged every 10 steps; level 4 has bins of 48 steps, built from the closed bins of the level
    # below, so each closes later than its last row: bin 0 [0, 48) at step 110, bin 1 [48, 96)
    # at 160, bin 2 at 200, bin 3 [144, 192) at 250, each of 5 rows (4 for bin 4, at 300).
    # The 4 tests of bins 0-3 span 3 new bins but only 140 steps (< 3 x 48): counted in steps
    # the decay waited for a fifth test (step 300); 4 tests of bins of several rows confirm it
    # at step 250
    rows = [
        {C.STEP: s, C.REWARD_MEAN: 0.5, C.LOGP_CORRECT: -0.3 + 0.001 * (-1) ** (s // 10)}
        for s in range(0, 400, 10)
    ]
    check = _DecayOnLevel4From100(cfg)
    ranks = _ranks(check, rows)
    assert _first(ranks, 2) == 250
    assert next(lv for s, r, lv in ranks if r == 2) == 4
    assert check.hold2[4] == 6  # the tests of bins 0-5 (bin 5 closes at step 350)
