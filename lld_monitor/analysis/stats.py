"""Shared running statistics of the analyzer: EMA weights, robust noise, the change-in-level test.

One home for the statistics the checks compose (river's ``stats/``): ``ema_weight``; the robust
noise of a row from its consecutive differences (``robust_sd``); and the test for a downward
change in a level, ``glr_scan`` (a whole series at once) with its calibrated threshold
(``glr_threshold`` / ``glr_rows_per_false_alarm``), which ``checks/level_shift.py`` runs one row
at a time.

The change-in-level test (a windowed GLR for a shift in the mean of Gaussian noise, Lorden 1971):
at row n, for every post-change length L in ``GLR_LENGTHS`` (the change point n - L), the mean of
the L rows since is compared with the mean of the R(L) rows before it (the pre-change segment,
``glr_ref_rows``), in units of its own standard error::

    z(n, L) = (mean(x[n-L-R : n-L]) - mean(x[n-L : n])) / (sigma * sqrt(1/L + 1/R))

and the statistic is max_L z(n, L). Testing 15 lengths at every row is testing many hypotheses:
the threshold ``c`` is set by simulation (white Gaussian noise, noise estimated as the check
estimates it: ``trimmed_sd`` of the differences, ``robust_sd`` of block means;
``scripts/calibrate_level_shift.py``) so that a run of ``GLR_CAL_ROWS`` rows of pure
noise crosses it with a stated probability; ``glr_rows_per_false_alarm(c)`` states the implied
rate. The best possible delay for a shift of delta noise sd is about 2 ln(ARL0) / delta^2 rows
(Lorden); this test reaches about c^2 / delta^2 (1 + L/R) rows, 2 rows at the least.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Sequence

import numpy as np

#: Post-change lengths (rows) tested at every row: a geometric grid, 2 rows at the least (one row
#: is never a level).
GLR_LENGTHS: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
#: The least rows of the pre-change segment behind a test.
GLR_MIN_REF = 8
#: The most rows of the pre-change segment.
GLR_MAX_REF = 256
#: Rows per simulated run in the calibration table.
GLR_CAL_ROWS = 3000

#: (threshold c, probability that a run of GLR_CAL_ROWS rows of white Gaussian noise crosses it),
#: from ``scripts/calibrate_level_shift.py --runs 40000`` (noise estimated from each run as the
#: check does). Between the points the log-probability is
#: interpolated linearly in c, beyond them extrapolated (an overstatement: Gaussian tails fall
#: faster).
GLR_CALIBRATION: tuple[tuple[float, float], ...] = (
    (3.5, 0.56842),
    (4.0, 0.21625),
    (4.5, 0.04918),
    (5.0, 0.00792),
    (5.5, 0.00108),
    (6.0, 0.00013),
    (6.5, 0.00003),
)

_MAD_TO_SD_DIFF = 0.9539  # median |d| of d = e1 - e2, e ~ N(0, s^2): 0.6745 * sqrt(2) * s


def ema_weight(dt: float, tau: float) -> float:
    """Weight of a new value in an EMA with time constant ``tau`` steps, ``dt`` steps later."""
    return 1.0 - math.exp(-dt / tau)


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (NaN when empty)."""
    return sorted_median(sorted(values))


def sorted_median(srt: Sequence[float]) -> float:
    """The median of values already sorted (NaN when empty)."""
    n = len(srt)
    if not n:
        return math.nan
    h = n >> 1
    return srt[h] if n & 1 else 0.5 * (srt[h - 1] + srt[h])


#: sd of one value from a trimmed mean square of consecutive differences: the largest 1/32 of
#: |d| are left out (a fall, a spike) and the rest rescaled: Gaussian d cut at their 96.9th
#: percentile of |d| keep 0.8256 of their mean square per kept value (truncated normal)
_TRIM = 1.0 / 32.0
_TRIM_KEEP = 0.8256


def trimmed_sd(abs_diffs: Sequence[float]) -> float:
    """The sd of one value of a noisy series from the absolute differences of consecutive values,
    zeros included: sqrt(mean d^2 / 2) over all but the largest 1/32 of them, rescaled to be
    exact for Gaussian noise. Unlike a median it is right for discrete rows (the mean of a few
    0/1 rewards, where most differences are exactly 0 or one value); the change itself and
    single-row spikes are trimmed. NaN when empty."""
    n = len(abs_diffs)
    if not n:
        return math.nan
    keep = n - int(n * _TRIM)
    srt = sorted(abs_diffs)[:keep]
    ms = sum(map(operator.mul, srt, srt)) / keep  # (d * d, summed in order)
    if keep < n:
        ms /= _TRIM_KEEP
    return math.sqrt(0.5 * ms)


def robust_sd(abs_diffs: Iterable[float]) -> float:
    """The sd of one value of a noisy series from the absolute differences of consecutive values:
    median |d| / (0.6745 sqrt 2). A few large differences (the change itself, a spike) do not
    move it; NaN when empty."""
    return median(abs_diffs) / _MAD_TO_SD_DIFF


_MAD_TO_SD_D2 = 0.6745 * math.sqrt(6.0)  # median |d2| of d2 = e1 - 2 e2 + e3, e ~ N(0, 1)


def block_sd(abs_second_diffs: Iterable[float], b: int) -> float:
    """The long-run sd of one value from the absolute second differences of consecutive means
    of ``b``-value blocks (m[i+1] - 2 m[i] + m[i-1]: a linear trend cancels, a learning rise does
    not pass for noise): median |d2| / (0.6745 sqrt 6) x sqrt(b). For correlated values (a
    rollout batch logged on several rows) it exceeds the sd of the values themselves."""
    return median(abs_second_diffs) / _MAD_TO_SD_D2 * math.sqrt(b)


def series_noise_sd(
    x: Sequence[float] | np.ndarray, n_diffs: int = 128, blocks: Sequence[int] = (8,)
) -> float:
    """The noise of a whole series as ``LevelShiftCollapse`` estimates it online, from its first
    rows (the calibration's twin): the trimmed sd of the first ``n_diffs`` consecutive
    differences, and the long-run sd from the first 34 means of ``b``-row blocks (``block_sd``
    of their 32 second differences) for each b in ``blocks`` (the check uses its longest blocks
    once they have 8 differences: 8 rows in a run of 3000); the largest."""
    x = np.asarray(x, dtype=float)  # [n]
    s = trimmed_sd(np.abs(np.diff(x[: n_diffs + 1])).tolist())
    for b in blocks:
        means = x[: 34 * b]
        means = means[: len(means) // b * b].reshape(-1, b).mean(axis=1)
        if len(means) >= 10:
            d2 = np.abs(means[2:] - 2.0 * means[1:-1] + means[:-2])
            s = max(s, block_sd(d2.tolist(), b))
    return s


def glr_ref_rows(length: int) -> int:
    """Rows of the pre-change segment that a post-change length is compared with: four times
    as many, 16 at the least, ``GLR_MAX_REF`` at the most."""
    return min(max(4 * length, 16), GLR_MAX_REF)


def glr_threshold(p_run: float) -> float:
    """The threshold c at which a run of ``GLR_CAL_ROWS`` rows of noise crosses with
    probability ``p_run`` (interpolated in the calibration table)."""
    if not 0.0 < p_run < 1.0:
        raise ValueError(f"p_run must be in (0, 1), got {p_run!r}")
    cal = GLR_CALIBRATION
    lp = math.log(p_run)
    for (c0, p0), (c1, p1) in itertools.pairwise(cal):
        if p_run >= p1:
            f = (lp - math.log(p0)) / (math.log(p1) - math.log(p0))
            return c0 + max(f, 0.0) * (c1 - c0)
    (c0, p0), (c1, p1) = cal[-2], cal[-1]  # beyond the table: extrapolated
    return c1 + (lp - math.log(p1)) / (math.log(p1) - math.log(p0)) * (c1 - c0)


def glr_rows_per_false_alarm(c: float) -> float:
    """About how many rows of noise pass per false crossing of threshold ``c``
    (``GLR_CAL_ROWS`` / the probability that a run of that length crosses)."""
    cal = GLR_CALIBRATION
    for (c0, p0), (c1, p1) in itertools.pairwise(cal):
        if c <= c1 or (c1, p1) == cal[-1]:
            f = (c - c0) / (c1 - c0)
            lp = math.log(p0) + f * (math.log(p1) - math.log(p0))
            return GLR_CAL_ROWS / min(math.exp(lp), 1.0)
    return math.inf  # (unreachable: the loop ends at the table's last pair)


def glr_scan(
    x: Sequence[float] | np.ndarray, sigma: float, lengths: Sequence[int] = GLR_LENGTHS
) -> tuple[np.ndarray, np.ndarray]:
    """The change-in-level statistic of a whole series at once (the batch twin of the online
    check): for every row n, max over the post-change lengths L of z(n, L) (see the module
    docstring) and the L that gave it; NaN / 0 where no length has ``GLR_MIN_REF`` rows before
    it. ``x``: [n] values; ``sigma``: the sd of one value. Returns ([n] z, [n] L)."""
    x = np.asarray(x, dtype=float)  # [n]
    n = len(x)
    cum = np.concatenate([[0.0], np.cumsum(x)])  # [n + 1]
    best = np.full(n, -np.inf)
    best_len = np.zeros(n, dtype=int)
    idx = np.arange(1, n + 1)  # rows counted from 1: row i ends at cum[i]
    for length in lengths:
        r_max = glr_ref_rows(length)
        r = np.minimum(idx - length, r_max)  # [n] pre-change rows available
        ok = r >= GLR_MIN_REF
        if not ok.any():
            continue
        i = idx[ok]
        rr = r[ok]
        post = (cum[i] - cum[i - length]) / length
        ref = (cum[i - length] - cum[i - length - rr]) / rr
        z = (ref - post) / (sigma * np.sqrt(1.0 / length + 1.0 / rr))
        sel = np.zeros(n, dtype=bool)
        sel[ok] = z > best[ok]
        best[sel] = z[sel[ok]]
        best_len[sel] = length
    best[np.isinf(best)] = np.nan
    return best, best_len


# --- Student t tail ---------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta (modified Lentz; Numerical Recipes
    ``betacf``), converged to 1e-15 relative."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` > 0 degrees of freedom."""
    x = df / (df + t * t)
    half = 0.5 * _betainc(0.5 * df, 0.5, x)  # P(|T| > |t|) / 2
    return half if t >= 0.0 else 1.0 - half


def t_upper_quantile(df: float, alpha: float) -> float:
    """The t with P(T > t) = ``alpha`` (0 < alpha < 1) for Student's t with ``df`` > 0 degrees of
    freedom: scipy's ``stdtrit(df, 1 - alpha)`` to about 1e-12 relative, without importing scipy
    (about 0.1 s of every command's start).

    Exact closed forms for 1 and 2 degrees of freedom; otherwise Newton's method on
    log P(T > t) from the Cornish-Fisher start (Abramowitz & Stegun 26.7.5), with the tail from
    the regularized incomplete beta."""
    if not (df > 0.0 and 0.0 < alpha < 1.0):
        raise ValueError(f"t_upper_quantile needs df > 0 and 0 < alpha < 1, got {df}, {alpha}")
    if alpha > 0.5:
        return -t_upper_quantile(df, 1.0 - alpha)
    if df == 1.0:  # Cauchy
        return 1.0 / math.tan(math.pi * alpha)
    if df == 2.0:
        return (1.0 - 2.0 * alpha) / math.sqrt(2.0 * alpha * (1.0 - alpha))
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1.0 - alpha) if alpha > 1e-300 else 37.5
    z2 = z * z
    t = z + (
        (z2 + 1.0) * z / 4.0 / df
        + ((5.0 * z2 + 16.0) * z2 + 3.0) * z / 96.0 / df**2
        + (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) * z / 384.0 / df**3
    )
    if not t > 0.0 or not math.isfinite(t):
        t = z
    log_alpha = math.log(alpha)
    # log density constant of Student's t
    log_c = math.lgamma(0.5 * (df + 1.0)) - math.lgamma(0.5 * df) - 0.5 * math.log(df * math.pi)
    for _ in range(100):
        tail = t_upper_tail(t, df)
        log_pdf = log_c - 0.5 * (df + 1.0) * math.log1p(t * t / df)
        # g(t) = log tail - log alpha; g'(t) = -pdf / tail
        step = (math.log(tail) - log_alpha) / math.exp(log_pdf - math.log(tail))
        t_new = t + step
        if t_new <= 0.0:
            t_new = 0.5 * t
        if abs(t_new - t) <= 1e-14 * abs(t_new):
            return t_new
        t = t_new
    return t
