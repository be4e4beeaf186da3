"""``MultiScaleTrend`` against a batch computation of its bins and fits at several prefixes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lld_monitor.analysis.trend import MultiScaleTrend

BASE, N_BINS, LEVELS = 3.0, 10, 5


def _batch_bins(obs: list[tuple[float, float]]) -> list[list[tuple[float, float, float]]]:
    """Closed bins per level, (centre step, mean value, observations), from scratch: level 0
    groups the observations by (step - first step) // BASE, all but the open (last) group;
    level j + 1 groups level j's closed bins by index // 2, all but the last group. A value
    equal to the one before it is not an observation (a rollout batch's repeat)."""
    kept, last = [], None
    for x, y in obs:
        if y != last:
            kept.append((x, y))
        last = y
    origin = kept[0][0]
    groups: list[list[float]] = []  # [index, n, sum x, sum y]
    for x, y in kept:
        idx = (x - origin) // BASE
        if groups and groups[-1][0] == idx:
            g = groups[-1]
            g[1], g[2], g[3] = g[1] + 1, g[2] + x, g[3] + y
        else:
            groups.append([idx, 1.0, x, y])
    out = []
    closed = groups[:-1]
    for _ in range(LEVELS):
        out.append([(sx / n, sy / n, n) for _, n, sx, sy in closed][-N_BINS:])
        up: list[list[float]] = []
        for idx, n, sx, sy in closed:
            j = idx // 2
            if up and up[-1][0] == j:
                g = up[-1]
                g[1], g[2], g[3] = g[1] + n, g[2] + sx, g[3] + sy
            else:
                up.append([j, n, sx, sy])
        closed = up[:-1]
    return out


def _observations(n: int, seed: int) -> list[tuple[float, float]]:
    # irregular steps (1-3 apart), a trend, noise, and each value repeated on 1-3 rows
    rng = np.random.default_rng(seed)
    steps = np.cumsum(rng.integers(1, 4, size=n)).astype(float)
    out = []
    y = 0.0
    for i, x in enumerate(steps):
        if i % int(rng.integers(1, 4)) == 0:
            y = -0.3 - 1e-3 * x + float(rng.normal(0, 0.02))
        out.append((float(x), y))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_bins_and_fits_match_the_batch_computation_at_every_prefix(seed: int) -> None:
    obs = _observations(900, seed)
    ms = MultiScaleTrend(BASE, N_BINS, LEVELS)
    checked = 0
    for i, (x, y) in enumerate(obs, start=1):
        ms.push(x, y)
        if i % 37 and i != len(obs):
            continue
        batch = _batch_bins(obs[:i])
        for level in range(LEVELS):
            got = list(ms._closed[level])
            want = batch[level]
            assert len(got) == len(want), (i, level)
            assert np.allclose(got, want, rtol=0, atol=1e-9), (i, level)
            fit = ms.fit(level)
            if len(want) < 6:
                assert fit is None
                continue
            bx = np.array([b[0] for b in want])
            by = np.array([b[1] for b in want])
            slope, intercept = np.polyfit(bx, by, 1)
            assert fit.slope == pytest.approx(slope, rel=1e-9, abs=1e-12)
            assert fit.first == pytest.approx(intercept + slope * bx[0], abs=1e-9)
            assert fit.last == pytest.approx(intercept + slope * bx[-1], abs=1e-9)
            assert fit.span == pytest.approx(bx[-1] - bx[0]) and fit.n_bins == len(want)
            checked += 1
    assert checked > 50  # fits of several levels were compared


def test_levels_that_close_are_ascending_and_state_round_trips() -> None:
    obs = _observations(400, 2)
    a, b = MultiScaleTrend(BASE, N_BINS, LEVELS), MultiScaleTrend(BASE, N_BINS, LEVELS)
    for x, y in obs:
        closed = a.push(x, y)
        assert closed == sorted(closed)
        assert closed == b.push(x, y)
        # fits (with the noise estimate of when they were made) are cached in the state
        for level in range(LEVELS):
            assert a.fit(level) == b.fit(level)
        state = json.loads(json.dumps(b.state(), allow_nan=False))
        b = MultiScaleTrend(BASE, N_BINS, LEVELS)
        b.load(state)
        assert b.state() == state


def test_last_count_is_the_rows_of_the_newest_closed_bin():
    # bins of 3 steps at level 0, 6 at level 1; a bin closes when a row of a later bin comes
    ms = MultiScaleTrend(base_steps=3.0, n_bins=10, levels=2)
    assert ms.last_count(0) == 0.0 and ms.last_count(1) == 0.0
    for step, value in ((0, 0.1), (1, 0.2), (2, 0.2), (3, 0.4)):
        ms.push(step, value)  # the repeat at step 2 is dropped; step 3 closes bin 0
    assert ms.last_count(0) == 2.0 and ms.last_count(1) == 0.0
    ms.push(10, 0.5)  # closes bin 1 (step 3 alone)
    assert ms.last_count(0) == 1.0
    ms.push(13, 0.6)  # closes bin 3 (step 10); level 1's bin 0 (steps 0-5: 3 rows) closes
    assert ms.last_count(0) == 1.0 and ms.last_count(1) == 3.0
