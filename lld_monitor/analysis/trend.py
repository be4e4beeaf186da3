"""Trend tests at every time scale at once, O(1) amortized per row.

A signal (``logp_correct``, the reward) is averaged into bins of ``base_steps * 2**j`` steps for
levels ``j = 0, 1, ...``: a dyadic pyramid, each level built from the closed bins of the level
below, so one row costs O(1) amortized whatever the number of levels. The trend at level ``j`` is
a least-squares line through the means of that level's last ``n_bins`` closed bins, i.e. over a
window of about ``n_bins * base_steps * 2**j`` steps: 30 steps at level 0 with the defaults, then
60, 120, ... up to several thousand.

Why bins: real rows are not independent. Consecutive optimizer steps of one rollout batch repeat
its reward and confidence (a value equal to the previous one is not a new observation and is
dropped), probe columns come once per rollout batch, logs skip steps, and the noise is
autocorrelated. Bin means make the sample size the number of bins, not the number of rows, and
the test's t statistic then uses the effective sample size of an AR(1) residual (Santer et al.
2000, "Statistical significance of trends and trend differences in layer-average atmospheric
temperature time series": ``n_eff = n (1 - r1) / (1 + r1)`` with ``r1`` the lag-1
autocorrelation of the residuals), with Student's t critical values
(``stats.t_upper_quantile``, scipy's ``stdtrit`` without scipy) at ``n_eff - 2`` degrees of
freedom.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, NamedTuple

from lld_monitor.analysis.stats import from_json_float, json_float, t_upper_quantile

_NAN = float("nan")
_RHO_MEMORY = 0.005  # EMA weight of the noise-autocorrelation estimate (~200 observations)
_RHO_WARM = int(1.0 / _RHO_MEMORY)  # before this many, a plain running mean
_NONE_CLOSED: list[int] = []  # shared, never mutated: no level closed
_SLOPE_MEMORY = 0.2  # EMA weight of the local slope removed from the differences


class TrendFit(NamedTuple):
    """A line through one level's bin means."""

    level: int
    slope: float  # per step
    t: float  # slope / its standard error (AR(1)-corrected)
    t_crit: float  # one-sided critical value at the effective degrees of freedom
    change: float  # fitted last minus fitted first (over span)
    se_change: float  # standard error of change
    span: float  # steps between the first and last bin centre
    start: float  # first bin centre (step)
    end: float  # last bin centre (step)
    first: float  # fitted value at start
    last: float  # fitted value at end
    n_bins: int
    df: float  # effective degrees of freedom of the t test
    r1: float  # lag-1 autocorrelation of the residuals (clipped at [0, 0.9])


@lru_cache(maxsize=512)
def t_critical(df10: int, alpha_micro: int) -> float:
    """One-sided Student t critical value at level ``alpha_micro`` * 1e-6 for ``df10 / 10``
    degrees of freedom."""
    p = 1.0 - alpha_micro * 1e-6  # (the tail 1 - p, exact in floats: as scipy's stdtrit takes it)
    return t_upper_quantile(max(df10 / 10.0, 1.0), 1.0 - p)


class MultiScaleTrend:
    """Binned multi-scale trend of one signal: ``push(step, value) -> levels that closed``.

    Parameters are stored under their names; running state is private and rebuilt in
    ``reset()``. ``fit(level)`` tests the current window of a level.
    """

    def __init__(
        self, base_steps: float = 3.0, n_bins: int = 10, levels: int = 9, alpha: float = 0.01
    ) -> None:
        if base_steps <= 0 or n_bins < 4 or levels < 1 or not 0.0 < alpha < 0.5:
            raise ValueError(
                "MultiScaleTrend needs base_steps > 0, n_bins >= 4, levels >= 1, 0 < alpha < 0.5"
            )
        self.base_steps = float(base_steps)
        self.n_bins = int(n_bins)
        self.levels = int(levels)
        self.alpha = float(alpha)
        self.reset()

    def reset(self) -> None:
        self._origin = _NAN
        self._last_value = _NAN
        # per level: open bin [index, n, sum_x, sum_y] and the closed bins (centre x, mean y)
        self._open: list[list[float]] = [[-1.0, 0.0, 0.0, 0.0] for _ in range(self.levels)]
        self._closed: list[deque[tuple[float, float, float]]] = [
            deque(maxlen=self.n_bins) for _ in range(self.levels)
        ]  # (centre step, mean value, observations)
        # noise autocorrelation of the observation series, from its first differences d:
        # for AR(1) noise (plus a slow trend) corr(d_i, d_i-1) = -(1 - rho) / 2
        self._last_diff = _NAN
        self._d1 = 0.0  # short EMA of the raw differences (the local slope, taken out of d)
        self._dd = 0.0  # EMA of d_i * d_i-1
        self._d2 = 0.0  # EMA of d_i^2
        self._n_obs = 0
        self._cache: dict[int, TrendFit | None] = {}  # level -> fit of its current bins
        self._short: dict[int, float] = {}  # level -> need_t its current bins fell short of

    def window_steps(self, level: int) -> float:
        """Nominal window of ``level`` in steps."""
        return self.n_bins * self.base_steps * 2.0**level

    def push(self, step: float, value: float) -> list[int]:
        """Add one observation; a value equal to the previous one (a rollout batch's value on
        each of its rows) is dropped. Returns the levels whose bins closed (ascending)."""
        last = self._last_value
        if value == last or value != value:
            return _NONE_CLOSED
        n = self._n_obs
        if last == last:
            # d centred on a short causal mean of d: a trend's slope (and its slow changes)
            # would otherwise read as autocorrelated noise
            raw = value - last
            if n == 1:
                self._d1 = raw
            d = raw - self._d1
            self._d1 += _SLOPE_MEMORY * (raw - self._d1)
            w = _RHO_MEMORY if n >= _RHO_WARM else 1.0 / (n + 1)
            ld = self._last_diff
            if ld == ld:
                self._dd += w * (d * ld - self._dd)
            self._d2 += w * (d * d - self._d2)
            self._last_diff = d
        self._n_obs = n + 1
        self._last_value = value
        origin = self._origin
        if origin != origin:
            self._origin = origin = step
        idx = (step - origin) // self.base_steps
        op = self._open[0]
        if op[0] == idx:  # the common case: the finest open bin takes it, nothing closes
            op[1] += 1.0
            op[2] += step
            op[3] += value
            return _NONE_CLOSED
        closed: list[int] = []
        self._add(0, idx, 1.0, step, value, closed)
        return closed

    def _add(self, level: int, idx: float, n: float, sx: float, sy: float, closed: list) -> None:
        op = self._open[level]
        if op[0] != idx:
            if op[1] > 0:
                # close the open bin: its mean goes into this level's window and up a level
                self._closed[level].append((op[2] / op[1], op[3] / op[1], op[1]))
                self._cache.pop(level, None)
                self._short.pop(level, None)
                closed.append(level)
                if level + 1 < self.levels:
                    self._add(level + 1, float(int(op[0]) // 2), op[1], op[2], op[3], closed)
            op[0], op[1], op[2], op[3] = idx, 0.0, 0.0, 0.0
        op[1] += n
        op[2] += sx
        op[3] += sy

    def fit(self, level: int, min_bins: int = 6, need_t: float = 0.0) -> TrendFit | None:
        """The trend test over the last closed bins of ``level``; None with too few bins.

        ``need_t`` > 0 is a shortcut for callers that only want a trend with ``|t|`` at least
        that large: the plain OLS t (before the AR(1) correction, which only shrinks it) is
        checked first and None may be returned below it. Fits are cached until the level's
        next bin closes.
        """
        if min_bins == 6:
            if level in self._cache:
                return self._cache[level]
            if need_t > 0.0 and need_t >= self._short.get(level, math.inf):
                return None  # this window already failed a shortcut at least as loose
        f = self._fit(level, min_bins, need_t)
        if min_bins == 6:
            if f is None and need_t > 0.0:
                self._short[level] = need_t
            else:
                self._cache[level] = f
        return f

    def _fit(self, level: int, min_bins: int, need_t: float) -> TrendFit | None:
        bins = self._closed[level]
        m = len(bins)
        if m < min_bins:
            return None
        x0 = bins[0][0]
        sx = sy = sxx = sxy = syy = cnt = 0.0
        for x, y, c in bins:  # one pass, anchored at the first bin (no cancellation far out)
            dx = x - x0
            sx += dx
            sy += y
            sxx += dx * dx
            sxy += dx * y
            syy += y * y
            cnt += c
        mx, my = sx / m + x0, sy / m
        sxx -= sx * sx / m
        sxy -= sx * sy / m
        syy -= sy * sy / m
        if sxx <= 0.0:
            return None
        slope = sxy / sxx
        rss = max(syy - slope * sxy, 0.0)
        if need_t > 0.0 and rss > 0.0 and abs(slope) < need_t * math.sqrt(rss / (m - 2) / sxx):
            return None
        r1 = 0.0
        if rss > 0.0:
            prev = None
            acc = 0.0
            for x, y, _ in bins:
                e = y - my - slope * (x - mx)
                if prev is not None:
                    acc += e * prev
                prev = e
            r1 = acc / rss
        # the window's own lag-1 estimate is noisy with ~10 bins: never below what the noise's
        # autocorrelation implies for bins of this many observations
        r1 = min(max(0.0, r1, self.bin_correlation(cnt / m)), 0.9)
        n_eff = m * (1.0 - r1) / (1.0 + r1)
        df = max(n_eff - 2.0, 4.0)  # (with ~10 bins a smaller df would be all noise)
        se = math.sqrt(rss / df / sxx)
        if se > 0.0:
            t = slope / se
        else:
            t = math.copysign(math.inf, slope) if slope else 0.0
        x0, x1 = bins[0][0], bins[-1][0]
        span = x1 - x0
        return TrendFit(
            level,
            slope,
            t,
            t_critical(int(df * 10), round(self.alpha * 1e6)),
            slope * span,
            se * span,
            span,
            x0,
            x1,
            my + slope * (x0 - mx),
            my + slope * (x1 - mx),
            m,
            df,
            r1,
        )

    @property
    def noise_autocorrelation(self) -> float:
        """Lag-1 autocorrelation of the observations' noise (0.3 until 10 are seen)."""
        if self._n_obs < 10 or self._d2 <= 0.0:
            return 0.3
        return min(max(1.0 + 2.0 * self._dd / self._d2, 0.0), 0.95)

    @property
    def noise_sd(self) -> float:
        """Standard deviation of one observation's noise (AR(1): Var(d) = 2 s^2 (1 - rho));
        0 until 10 observations are seen."""
        if self._n_obs < 10 or self._d2 <= 0.0:
            return 0.0
        return math.sqrt(self._d2 / (2.0 * max(1.0 - self.noise_autocorrelation, 0.05)))

    def bin_correlation(self, b: float) -> float:
        """Correlation of adjacent means of ``b`` consecutive AR(1) observations:
        rho (1 - rho^b)^2 / (b (1 + rho)(1 - rho) - 2 rho (1 - rho^b))."""
        rho = self.noise_autocorrelation
        if rho <= 0.0:
            return 0.0
        b = max(b, 1.0)
        rb = rho**b
        den = b * (1.0 + rho) * (1.0 - rho) - 2.0 * rho * (1.0 - rb)
        return rho * (1.0 - rb) ** 2 / den if den > 0.0 else rho

    def last_count(self, level: int) -> float:
        """Observations in ``level``'s newest closed bin (0: none closed)."""
        bins = self._closed[level]
        return bins[-1][2] if bins else 0.0

    def end_change(self, level: int) -> float:
        """Mean of the last 3 bins minus mean of the first 3: a cheap pre-check of a move (NaN
        with fewer than 6 bins)."""
        bins = self._closed[level]
        if len(bins) < 6:
            return _NAN
        return (bins[-1][1] + bins[-2][1] + bins[-3][1] - bins[0][1] - bins[1][1] - bins[2][1]) / 3

    def late_slope(self, level: int) -> float:
        """OLS slope over the newer half of ``level``'s closed bins (is it still going?)."""
        bins = list(self._closed[level])
        late = bins[len(bins) // 2 :]
        if len(late) < 2:
            return _NAN
        mx = sum(b[0] for b in late) / len(late)
        my = sum(b[1] for b in late) / len(late)
        sxx = sum((b[0] - mx) ** 2 for b in late)
        return sum((b[0] - mx) * (b[1] - my) for b in late) / sxx if sxx > 0 else _NAN

    # --- plain-JSON state ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        j = json_float
        return {
            "origin": j(self._origin),
            "last_value": j(self._last_value),
            "open": [[j(v) for v in o] for o in self._open],
            "noise": [j(v) for v in (self._last_diff, self._d1, self._dd, self._d2)]
            + [self._n_obs],
            "closed": [[[j(v) for v in b] for b in c] for c in self._closed],
            # the fits cached until their level's next bin closes: a fit also reads the noise
            # estimate of when it was made, so a resumed run must reuse it to give the same t
            "cache": {
                str(lv): None if f is None else [j(v) if isinstance(v, float) else v for v in f]
                for lv, f in self._cache.items()
            },
            "short": {str(lv): t for lv, t in self._short.items()},
        }

    def load(self, d: Mapping[str, Any]) -> None:
        f = from_json_float
        self.reset()
        self._origin = f(d["origin"])
        self._last_value = f(d["last_value"])
        self._open = [[f(v) for v in o] for o in d["open"]]
        for c, saved in zip(self._closed, d["closed"]):
            c.extend((f(x), f(y), f(n)) for x, y, n in saved)
        *noise, n_obs = d["noise"]
        self._last_diff, self._d1, self._dd, self._d2 = (f(v) for v in noise)
        self._n_obs = int(n_obs)
        # (states saved before the caches were kept refit when asked)
        for lv, fit in d.get("cache", {}).items():
            self._cache[int(lv)] = (
                None
                if fit is None
                else TrendFit(*(int(v) if i in (0, 11) else f(v) for i, v in enumerate(fit)))
            )
        self._short.update({int(lv): float(t) for lv, t in d.get("short", {}).items()})
