"""MultiScaleTrend, the analyzer's core statistic, on its own: hand-derived bins and lines, and
the incremental fit checked against a batch fit at every prefix of the data (as river does)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lld_monitor.analysis.trend import MultiScaleTrend


def test_parameters_are_checked_and_windows_double_per_level() -> None:
    with pytest.raises(ValueError, match="n_bins >= 4"):
        MultiScaleTrend(n_bins=3)
    with pytest.raises(ValueError, match="base_steps > 0"):
        MultiScaleTrend(base_steps=0)
    t = MultiScaleTrend()  # 10 bins of 3 steps at level 0: 30, 60, 120 steps
    assert [t.window_steps(j) for j in range(3)] == [30.0, 60.0, 120.0]


def test_bins_close_up_the_pyramid_and_a_line_is_fitted_exactly() -> None:
    # bins of 1 step at level 0, 2 at level 1; y = 2 * step (no repeated value)
    t = MultiScaleTrend(base_steps=1.0, n_bins=4, levels=2)
    closed = [t.push(float(s), 2.0 * s) for s in range(8)]
    # step 0 opens the first bin; each later step closes the previous level-0 bin; a level-1 bin
    # (steps 2k, 2k+1) closes when the level-0 bin of step 2k+2 closes, i.e. at steps 3, 5, 7
    assert closed == [[], [0], [0], [0, 1], [0], [0, 1], [0], [0, 1]]
    # level 0 keeps its last 4 closed bins: steps 3..6, means 6..12, a line of slope 2
    f = t.fit(0, min_bins=4)
    assert f is not None and f.n_bins == 4
    assert (f.start, f.end, f.span) == (3.0, 6.0, 3.0)
    assert f.slope == pytest.approx(2.0) and f.change == pytest.approx(6.0)
    assert (f.first, f.last) == (pytest.approx(6.0), pytest.approx(12.0))
    assert f.t == math.inf  # no residual at all
    # level 1: bins (0, 1), (2, 3), (4, 5) closed: centres 0.5, 2.5, 4.5, means 1, 5, 9
    assert t.fit(1, min_bins=4) is None  # only 3 bins
    t.push(8.0, 16.0)
    t.push(9.0, 18.0)  # closes the level-0 bin of step 8: level-1 bin (6, 7) closes
    f1 = t.fit(1, min_bins=4)
    assert f1 is not None and (f1.start, f1.end) == (0.5, 6.5)
    assert f1.slope == pytest.approx(2.0) and f1.first == pytest.approx(1.0)


def test_a_repeated_or_missing_value_is_not_an_observation() -> None:
    t = MultiScaleTrend(base_steps=1.0, n_bins=4, levels=1)
    assert t.push(0.0, 1.0) == []
    assert t.push(1.0, 1.0) == []  # a rollout batch's value repeated on its next row: dropped
    assert t.push(2.0, float("nan")) == []
    assert t.push(3.0, 2.0) == [0]  # closes the bin of step 0 alone
    same = MultiScaleTrend(base_steps=1.0, n_bins=4, levels=1)
    same.push(0.0, 1.0)
    same.push(3.0, 2.0)
    assert t.state() == same.state()  # as if the dropped rows had never come


def _batch_bins(steps: list[float], values: list[float], base: float, level: int, n_bins: int):
    """Closed bins of ``level`` computed from scratch: (centre, mean) of the last ``n_bins``."""
    kept_s, kept_v = [], []
    for s, v in zip(steps, values, strict=True):
        if v != v or (kept_v and v == kept_v[-1]):
            continue
        kept_s.append(s)
        kept_v.append(v)
    if not kept_s:
        return []
    origin = kept_s[0]
    bins = {}  # level-0 index -> observations
    for s, v in zip(kept_s, kept_v, strict=True):
        bins.setdefault(int((s - origin) // base), []).append((s, v))
    groups = [bins[k] for k in sorted(bins)][:-1]  # the last level-0 bin is still open
    keys = sorted(bins)[:-1]
    for _ in range(level):  # each level: pairs of the level below, the last one still open
        merged: dict[int, list] = {}
        for k, g in zip(keys, groups, strict=True):
            merged.setdefault(k // 2, []).extend(g)
        keys = sorted(merged)[:-1]
        groups = [merged[k] for k in keys]
    out = [(float(np.mean([s for s, _ in g])), float(np.mean([v for _, v in g]))) for g in groups]
    return out[-n_bins:]


def test_the_incremental_fit_equals_a_batch_fit_at_every_prefix() -> None:
    rng = np.random.default_rng(19)
    steps, values = [], []
    t = MultiScaleTrend(base_steps=2.0, n_bins=8, levels=3)
    step = 0.0
    compared = [0, 0, 0]
    for i in range(400):
        step += float(rng.integers(1, 4))  # logs skip steps
        v = float(-0.002 * step + 0.05 * rng.standard_normal())
        if i % 7 == 3:
            v = values[-1]  # a repeated row
        if i % 31 == 5:
            v = math.nan
        steps.append(step)
        values.append(v)
        t.push(step, v)
        for level in range(3):
            bins = _batch_bins(steps, values, 2.0, level, 8)
            f = t.fit(level)  # min_bins=6: the cached path, invalidated when a bin closes
            if len(bins) < 6:
                assert f is None
                continue
            x = np.array([b[0] for b in bins])
            y = np.array([b[1] for b in bins])
            slope = np.polyfit(x, y, 1)[0]
            assert f is not None and f.n_bins == len(bins)
            assert (f.start, f.end) == pytest.approx((x[0], x[-1]), rel=1e-12)
            assert f.slope == pytest.approx(slope, rel=1e-9, abs=1e-12)
            assert f.change == pytest.approx(slope * (x[-1] - x[0]), rel=1e-9, abs=1e-12)
            compared[level] += 1
    assert min(compared) > 50, compared  # every level was checked on many windows


def test_state_round_trips_and_reset_replays() -> None:
    rng = np.random.default_rng(3)
    rows = [(float(s), float(rng.standard_normal())) for s in range(200)]
    a = MultiScaleTrend()
    for s, v in rows[:120]:
        a.push(s, v)
    b = MultiScaleTrend()
    b.load(json.loads(json.dumps(a.state())))  # plain JSON
    for s, v in rows[120:]:
        assert a.push(s, v) == b.push(s, v)
    assert a.fit(0) == b.fit(0) and a.state() == b.state()
    a.reset()
    c = MultiScaleTrend()
    assert a.state() == c.state()
