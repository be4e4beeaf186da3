"""The shared statistics (analysis/stats.py): the noise estimates and the change-in-level test,
on hand-made series with the expected values derived in the comments, and its calibration
checked against a fresh simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lld_monitor.analysis.stats import (
    GLR_CAL_ROWS,
    GLR_CALIBRATION,
    GLR_MIN_REF,
    LevelDrop,
    ema_weight,
    glr_ref_rows,
    glr_rows_per_false_alarm,
    glr_scan,
    glr_threshold,
    median,
    robust_sd,
    series_noise_sd,
    trimmed_sd,
)


def test_median_and_ema_weight() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0]) == 2.5
    assert math.isnan(median([]))
    assert ema_weight(1.0, 1.0) == pytest.approx(1.0 - math.exp(-1.0))


def test_trimmed_sd_by_hand_and_on_gaussian_noise() -> None:
    # 31 differences of 1: nothing trimmed (31 // 32 = 0): sqrt(1 / 2)
    assert trimmed_sd([1.0] * 31) == pytest.approx(math.sqrt(0.5))
    # one difference of 100 among 32 is trimmed; the rest rescaled by 1 / 0.8256
    assert trimmed_sd([1.0] * 31 + [100.0]) == pytest.approx(math.sqrt(0.5 / 0.8256))
    # zeros count (discrete rows): half the differences 0, half 1 -> sqrt(0.5 * 0.5)
    assert trimmed_sd([0.0, 1.0] * 10) == pytest.approx(0.5)
    x = np.random.default_rng(0).normal(0.0, 2.0, 20_000)
    assert trimmed_sd(np.abs(np.diff(x)).tolist()) == pytest.approx(2.0, rel=0.03)
    assert robust_sd(np.abs(np.diff(x)).tolist()) == pytest.approx(2.0, rel=0.03)


def test_glr_scan_by_hand() -> None:
    # 8 rows at 1, then 0, 0, sd 1. Row 10: L = 2 against the R = min(16, 10 - 2) = 8 rows
    # before: z = (1 - 0) / sqrt(1/2 + 1/8) = 1.2649; L = 3 has 7 rows before it (< 8): out
    x = [1.0] * 8 + [0.0, 0.0]
    z, length = glr_scan(x, 1.0)
    assert z[9] == pytest.approx(1.0 / math.sqrt(0.625)) and length[9] == 2
    assert np.isnan(z[:9]).all()  # fewer than 8 rows before any 2-row window
    # the noise scales z
    assert glr_scan(x, 0.5)[0][9] == pytest.approx(2.0 / math.sqrt(0.625))


def test_the_reference_is_the_mean_of_the_segment_before_the_change_not_its_best_window() -> None:
    # 16 rows alternating 1, 0 (mean 0.5, best 2-row mean 1), then 0, 0: at row 18, L = 2 is
    # compared with all R = 16 rows before: z = 0.5 / sqrt(1/2 + 1/16) = 0.667 (a reference at
    # the best window's 1.0 would give 1.33)
    x = [1.0, 0.0] * 8 + [0.0, 0.0]
    z, _ = glr_scan(x, 1.0, lengths=[2])
    assert z[17] == pytest.approx(0.5 / math.sqrt(0.5625))
    assert glr_ref_rows(2) == 16 and glr_ref_rows(10) == 40 and glr_ref_rows(256) == 256


def test_the_threshold_is_the_calibration_table_and_states_its_rate() -> None:
    for c, p in GLR_CALIBRATION:
        assert glr_threshold(p) == pytest.approx(c)
        assert glr_rows_per_false_alarm(c) == pytest.approx(GLR_CAL_ROWS / p)
    assert glr_threshold(0.002) < glr_threshold(0.001) < glr_threshold(0.0001)
    assert glr_rows_per_false_alarm(glr_threshold(0.002)) == pytest.approx(1_500_000)
    with pytest.raises(ValueError, match="p_run"):
        glr_threshold(0.0)


def test_the_calibration_holds_on_fresh_noise() -> None:
    """200 fresh runs of 3000 rows of white noise, noise estimated as the check does: the share
    that crosses c = 4.0 is the table's (0.218; binomial sd 0.03 at 200 runs), and at the
    default threshold (p = 0.002) at most 2 of 200 cross."""
    rng = np.random.default_rng(2026)
    c_default = glr_threshold(0.002)
    peaks = []
    for _ in range(200):
        x = rng.normal(0.0, 1.0, GLR_CAL_ROWS)
        z, _ = glr_scan(x, series_noise_sd(x))
        peaks.append(np.nanmax(z))
    share = float(np.mean(np.array(peaks) >= 4.0))
    assert abs(share - 0.218) <= 0.1, share
    assert sum(p >= c_default for p in peaks) <= 2


def test_t_upper_quantile_hand_values_and_scipy() -> None:
    """Student t quantiles without scipy: closed forms by hand, textbook table values, and
    scipy's stdtrit over the degrees of freedom and levels the trend test uses."""
    from scipy.special import stdtrit

    from lld_monitor.analysis.stats import t_upper_quantile, t_upper_tail

    # 1 df (Cauchy): P(T > 1) = 1/4; 2 df: t = (1 - 2a) / sqrt(2a(1 - a)), at a = 0.1: 1.8856...
    assert t_upper_quantile(1.0, 0.25) == pytest.approx(1.0, rel=1e-14)
    assert t_upper_quantile(2.0, 0.1) == pytest.approx(0.8 / math.sqrt(0.18), rel=1e-14)
    # printed tables: t(0.05; 10) = 1.812, t(0.01; 30) = 2.457, t(0.001; 5) = 5.893
    assert t_upper_quantile(10.0, 0.05) == pytest.approx(1.812, abs=5e-4)
    assert t_upper_quantile(30.0, 0.01) == pytest.approx(2.457, abs=5e-4)
    assert t_upper_quantile(5.0, 0.001) == pytest.approx(5.893, abs=5e-4)
    assert abs(t_upper_quantile(7.0, 0.5)) < 1e-12
    assert t_upper_quantile(7.0, 0.9) == pytest.approx(-t_upper_quantile(7.0, 0.1), rel=1e-12)
    for df in (1.0, 1.1, 1.5, 2.0, 2.3, 3.0, 4.7, 7.3, 10.0, 17.9, 64.2, 333.3, 1000.0, 5000.0):
        for alpha in (0.4, 0.1, 0.05, 0.01, 3.7e-3, 1e-3, 1e-4, 1e-5, 1e-6):
            p = 1.0 - alpha
            t = t_upper_quantile(df, 1.0 - p)  # as trend.t_critical asks
            assert t == pytest.approx(float(stdtrit(df, p)), rel=1e-10), (df, alpha)
            assert t_upper_tail(t, df) == pytest.approx(1.0 - p, rel=1e-9)
    for bad in ((0.0, 0.1), (-1.0, 0.1), (5.0, 0.0), (5.0, 1.0), (math.nan, 0.1)):
        with pytest.raises(ValueError):
            t_upper_quantile(*bad)


def test_trend_critical_values_import_no_scipy() -> None:
    """The trend test's critical values come without importing scipy (0.1 s of every start);
    t(0.01) at 9.5 df lies between the table's 2.821 (9 df) and 2.764 (10 df)."""
    import subprocess
    import sys

    code = (
        "import sys; from lld_monitor.analysis.trend import t_critical; "
        "v = t_critical(95, 10000); assert 2.764 < v < 2.821, v; "
        "print('scipy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "lengths", [(2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256), (2,), (5, 40)]
)
def test_level_drop_row_by_row_agrees_with_the_whole_series(lengths, monkeypatch) -> None:
    # river's contract: the update path and the batch path of one statistic agree at every row;
    # 1500 rows pass the buffer's trim (2 x 512 rows) and 3 batch blocks of 512 rows
    monkeypatch.setattr(LevelDrop, "_BLOCK", 512)
    rng = np.random.default_rng(11)
    x = np.concatenate(
        [0.6 + 0.05 * rng.standard_normal(900), 0.3 + 0.05 * rng.standard_normal(600)]
    )
    stat = LevelDrop(lengths)
    z_batch, len_batch = stat.scan(x, 0.05)
    bound_batch = stat.bounds(x, 0.05)
    z_rows, len_rows, bound_rows = [], [], []
    for i, v in enumerate(x.tolist()):
        stat.push(v, float(10 * i))
        z, length = stat.z_max(0.05)
        z_rows.append(z)
        len_rows.append(length)
        bound_rows.append(stat.drop_bound(0.05))
    np.testing.assert_array_equal(z_rows, z_batch)  # (the same sums in the same order)
    assert len_rows == len_batch.tolist()
    np.testing.assert_array_equal(bound_rows, bound_batch)
    # the rows before the shortest test has GLR_MIN_REF rows of reference: no statistic
    first = min(lengths) + GLR_MIN_REF
    assert np.isnan(z_batch[: first - 1]).all() and not np.isnan(z_batch[first - 1 :]).any()
    # the fall at row 900 is seen: large z just after it, none before it in this noise
    assert np.nanmax(z_batch[:900]) < 5.0 < np.nanmax(z_batch[900:])
    assert len(stat.steps) <= 2 * stat.keep and stat.steps[-1] == 10.0 * (len(x) - 1)


def test_level_drop_candidates_by_hand() -> None:
    # 20 rows of 1 then 2 rows of 0: at row 22 the length-2 test compares the 2 zeros with the
    # 16 rows before them (glr_ref_rows(2) = 16): ref 1, post 0; the length-3 test too compares
    # with 16 rows (glr_ref_rows(3) = max(4 x 3, 16)), all 1, its post (1 + 0 + 0) / 3
    stat = LevelDrop((2, 3))
    for v in [1.0] * 20 + [0.0, 0.0]:
        stat.push(v)
    got = {length: (r, ref, post) for length, r, _, ref, post in stat.candidates()}
    assert got[2] == (16, 1.0, 0.0)
    # length 3: the last 3 rows are 1, 0, 0 (post 1/3), the 16 before them all 1
    assert got[3][0] == 16 and got[3][1] == 1.0 and got[3][2] == pytest.approx(1.0 / 3.0)
    z, length = stat.z_max(1.0)
    assert length == 2 and z == pytest.approx(1.0 / math.sqrt(1.0 / 2.0 + 1.0 / 16.0))


def test_ema_row_by_row_agrees_with_the_whole_series() -> None:
    # irregular steps, missing values (held), a first value after NaNs: push with the weights
    # of each gap (as Signals gives them) equals Ema.series after every value
    from lld_monitor.analysis.stats import Ema

    rng = np.random.default_rng(3)
    steps = np.cumsum(rng.integers(1, 7, 600)).astype(float)
    x = 1.0 + 0.3 * rng.standard_normal(600)
    x[:3] = np.nan
    x[rng.random(600) < 0.2] = np.nan
    taus = (5.0, 50.0, 20.0)
    batch = Ema.series(x, steps, taus)
    e = Ema()
    rows = {f: [] for f in Ema.FIELDS}
    for v, t in zip(x.tolist(), steps.tolist()):
        if v == v:  # (no row cache here: every gap's weights from the function)
            e.push(v, t, math.nan, (), lambda dt: tuple(ema_weight(dt, tau) for tau in taus))
        for f in Ema.FIELDS:
            rows[f].append(getattr(e, f))
    for f in Ema.FIELDS:
        np.testing.assert_allclose(rows[f], batch[f], rtol=1e-12, atol=1e-15, equal_nan=True)
    first = int(np.flatnonzero(np.isfinite(x))[0])
    assert first >= 3 and np.isnan(batch["fast"][:first]).all() and batch["dev"][first] == 0.0
    # by hand: two values 1 then 0 one step apart, fast tau 1: 1 - (1 - e^-1) = e^-1
    two = Ema.series([1.0, 0.0], [0.0, 1.0], (1.0, 10.0, 2.0))
    assert two["fast"][1] == pytest.approx(math.exp(-1.0))
    assert two["dev"][1] == pytest.approx(1.0 - math.exp(-0.1))


def test_rolling_ols_row_by_row_agrees_with_the_whole_series() -> None:
    # irregular steps (some gaps wider than the window: min_rows keeps the window), a slope
    # change and noise; 1200 pairs pass many rebuilds of the running sums
    from lld_monitor.analysis.stats import RollingOLS

    rng = np.random.default_rng(8)
    x = np.cumsum(rng.choice([1.0, 1.0, 2.0, 3.0, 25.0], 1200))
    y = np.where(x < x[600], -0.3, -0.3 - 0.002 * (x - x[600])) + 0.01 * rng.standard_normal(1200)
    for steps, min_rows in ((10.0, 3), (40.0, 8)):
        batch = RollingOLS.series(x, y, steps, min_rows)
        ols = RollingOLS(steps, min_rows)
        rows = []
        for a, b in zip(x.tolist(), y.tolist()):
            ols.push(a, b)
            rows.append(ols.fit())
        got = np.array(rows)  # [n, 5]
        for j, key in enumerate(("slope", "t", "span", "first", "last")):
            # (t reads the residual sum of squares, a difference of near-equal sums: where the
            # line fits closely, t of a few hundred, the two paths' rounding shows at 1e-6)
            rtol = 1e-5 if key == "t" else 1e-7
            np.testing.assert_allclose(got[:, j], batch[key], rtol=rtol, atol=1e-9, err_msg=key)
        assert np.isnan(batch["slope"][:2]).all() and np.isfinite(batch["t"][min_rows:]).all()
    # by hand: three pairs on the line y = 2x + 1 plus one off it
    fit = RollingOLS.series([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 5.0, 8.0], 10.0, 3)
    # least squares through (0,1) (1,3) (2,5) (3,8): slope (sum dx dy) / (sum dx^2) = 11.5 / 5
    assert fit["slope"][3] == pytest.approx(2.3) and fit["span"][3] == 3.0


def test_block_noise_and_window_stats_row_by_row_agree_with_the_whole_series() -> None:
    from lld_monitor.analysis.stats import BlockNoise, WindowStats

    rng = np.random.default_rng(12)
    x = 0.5 + 0.1 * np.sin(np.arange(700) / 40.0) + 0.05 * rng.standard_normal(700)
    for b, n in ((2, 32), (8, 32), (4, 10)):
        noise = BlockNoise(b, n)
        rows = []
        for v in x.tolist():
            noise.push(v)
            rows.append(noise.sd())
        np.testing.assert_array_equal(rows, BlockNoise.series(x, b, n))
        first = (8 + 2) * b - 1  # the row that closes the block giving the 8th difference
        assert np.isnan(rows[first - 1]) and not np.isnan(rows[first])
    for n, every in ((32, 8), (5, 3)):
        w = WindowStats(n, every)
        rows = []
        for v in x[:200].tolist():
            w.push(v)
            rows.append(w.stats_)
        med, lo, hi = WindowStats.series(x[:200], n, every)
        np.testing.assert_array_equal(np.array(rows), np.column_stack([med, lo, hi]))
        assert np.isnan(med[1]) and med[2] == np.median(x[:3])
