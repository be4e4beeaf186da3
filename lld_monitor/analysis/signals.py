"""``Signals``: the per-row features every check reads, computed once per row.

``Signals.update(step, values, marks)`` takes one row (values ordered as ``INPUT_COLUMNS``) and
refreshes the raw values (attributes named like the columns), the EMAs in step time, the rolling
and multi-scale fits of ``logp_correct`` and the reward, the reward's peak and trough, the early
levels of entropy and length and the warm-up flag. The checks (``analysis/checks``) only read it.

All windows are in *steps* (the ``step`` column), never in rows, so sparse logging works.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lld_monitor import columns as C
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.stats import Ema, RollingOLS, ema_weight
from lld_monitor.analysis.trend import (
    MultiScaleTrend,
    TrendFit,
    from_json_float,
    json_float,
    t_critical,
)

_NAN = float("nan")
_NONE_CLOSED: list[int] = []  # shared, never mutated: no trend level closed this row
_enc = json_float
_dec = from_json_float

#: Columns the detector reads, in the order of its value tuple (``Signals.update``).
INPUT_COLUMNS: tuple[str, ...] = (
    C.REWARD_MEAN,
    C.LOGP_CORRECT,
    C.FRAC_CORRECT_DISPLACED,
    C.DELTA_CORRECT,
    C.GRAD_NORM,
    C.ENTROPY,
    C.KL,
    C.COMPLETION_LENGTH,
    C.LOSS,
    C.FRAC_ZERO_STD_GROUPS,
    C.REWARD_STD,
    C.N_CORRECT,
    C.LEARNING_RATE,
    C.INBATCH_N_CORRECT,
    C.INBATCH_N_CORRECT_DISPLACED,
    C.FRAC_TRUNCATED,
    C.PROBE_STILL,
    C.IS_RATIO_MEAN,
    C.SAMPLER_LOGP_DIFF,
    C.SAMPLER_PROB_DIFF,
    C.LLDS_ENABLED,
    C.LLDS_LAMBDA,
    C.LLDS_LOSS,
    C.LLDS_FRAC_GATED,
    C.LLDS_LOSS_WEIGHTED,
)

#: The signals with EMAs (``stats.Ema``: fast, slow, window and dev, steps as time), each an
#: attribute of ``Signals`` named ``<signal>_ema``, and the key of the step of its last value in
#: the state (``ema_last``). Grad norm EMAs are of log(grad_norm).
EMA_SIGNALS: dict[str, str] = {
    "reward": "rw",
    "displaced": "fd",
    "delta_correct": "dc",
    "log_grad": "g",
    "entropy": "h",
    "kl": "kl",
    "length": "len",
    "truncated": "tr",
}
#: The EMA values in the state (``ema``): ``<signal>_<field>``.
EMA_NAMES: tuple[str, ...] = tuple(f"{g}_{f}" for g in EMA_SIGNALS for f in Ema.FIELDS)
# TrendFit fields that are ints (the rest are floats)
_FIT_INTS = frozenset((0, 11))


def as_float(v: Any) -> float:
    """A row value as a float; NaN when missing or not a number."""
    if v is None:
        return _NAN
    try:
        return float(v)
    except (TypeError, ValueError):
        return _NAN


_f = as_float


def fit_state(f: TrendFit | None) -> list[Any] | None:
    """A ``TrendFit`` as plain JSON (None stays None)."""
    return None if f is None else [_enc(v) if isinstance(v, float) else v for v in f]


def fit_from_state(d: list[Any] | None) -> TrendFit | None:
    """Inverse of ``fit_state``."""
    if d is None:
        return None
    return TrendFit(*(int(v) if i in _FIT_INTS else _dec(v) for i, v in enumerate(d)))


_MAX_LOG_RATIO = 700.0  # log of the largest grad-norm ratio reported (exp(709.8) overflows)


def _others(rw: float, h: float, kl: float, ln: float) -> bool:
    """The row carries another training value (reward, entropy, KL or length is finite): a NaN
    loss or grad norm beside it is non-finite, not missing. Asked only of a NaN row."""
    return rw - rw == 0.0 or h - h == 0.0 or kl - kl == 0.0 or ln - ln == 0.0


def warm_rows(steps: Any, config: DetectorConfig) -> Any:
    """[n] ``Signals.warm`` after each row of a replay whose every row is accepted (steps
    strictly increasing): ``warmup_steps`` steps since the first row and ``warmup_rows`` rows,
    the rule ``Signals.update`` applies row by row, in the same float arithmetic (for the
    replay's second process, ``analysis/parallel.py``, whose checks read ``warm``)."""
    import numpy as np

    n = len(steps)
    if not n:
        return np.zeros(0, dtype=bool)
    since = steps.astype(float) - float(steps[0])
    return (since >= config.warmup_steps) & (np.arange(1, n + 1) >= config.warmup_rows)


class Signals:
    """The features of the rows seen so far, refreshed once per row by ``update``.

    Read by every check after ``update``: ``step``, ``prev_step``, ``first_step``, ``n_rows``
    (rows accepted so far, this one included), ``warm``; the row's raw values under the column
    names (``reward_mean``, ``logp_correct``, ... NaN when missing); ``bad_loss`` / ``bad_grad``
    / ``bad_reward`` (a non-finite loss / grad norm / reward this row); the EMAs
    (``<signal>_ema``, a ``stats.Ema`` of each of ``EMA_SIGNALS``: ``entropy_ema.fast``,
    ``log_grad_ema.slow``, ...); ``reward_peak``
    (highest fast reward EMA), ``reward_min``, ``reward_trough`` (lowest before the peak);
    ``kl_ref`` (lowest slow KL EMA once warm); ``entropy_early`` / ``length_early`` (means over
    the warm-up rows); ``trunc_rows``; ``lp_short`` (``stats.RollingOLS`` of logp_correct over
    ``short_steps``), ``lp_trend`` / ``rw_trend`` (``MultiScaleTrend`` of logp_correct / the
    reward) and ``lp_closed`` / ``rw_closed`` (their levels that closed a bin this row);
    ``rw_decline``; ``seen`` (columns seen finite); ``phase`` (the detector's phase before this
    row's decision).
    """

    __slots__ = (
        "_alpha",
        "_damp",
        "bad_grad",
        "bad_loss",
        "bad_reward",
        "config",
        "early_n",
        "first_step",
        "kl_ref",
        "length_early",
        "lp_closed",
        "lp_short",
        "lp_trend",
        "n_rows",
        "phase",
        "prev_step",
        "reward_min",
        "reward_peak",
        "reward_trough",
        "rw_closed",
        "rw_decline",
        "rw_declining",
        "rw_trend",
        "seen",
        "step",
        "trunc_rows",
        "w_fast",
        "warm",
        "entropy_early",
        *(f"{g}_ema" for g in EMA_SIGNALS),
        *INPUT_COLUMNS,
    )

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.reset()

    def reset(self) -> None:
        """Forget every row; keep the config."""
        cfg = self.config
        self.step = _NAN
        self.prev_step = _NAN
        self.first_step = _NAN
        self.n_rows = 0
        self.warm = False
        self.phase = "unknown"
        self.seen: set[str] = set()
        for name in INPUT_COLUMNS:
            setattr(self, name, _NAN)
        self.bad_loss = False
        self.bad_grad = False
        self.bad_reward = False
        for g in EMA_SIGNALS:
            setattr(self, f"{g}_ema", Ema())
        self.lp_short = RollingOLS(cfg.short_steps, cfg.min_short_rows)
        self.lp_trend = MultiScaleTrend(
            cfg.trend_base_steps, cfg.trend_bins, cfg.trend_levels, cfg.trend_alpha
        )
        self.rw_trend = MultiScaleTrend(
            cfg.trend_base_steps, cfg.trend_bins, cfg.trend_levels, cfg.trend_alpha
        )
        self.lp_closed = _NONE_CLOSED
        self.rw_closed = _NONE_CLOSED
        self.rw_decline: TrendFit | None = None  # the reward_decline trend, when there is one
        self.rw_declining: bool | None = None  # cached reward_declining() (None: stale)
        self._alpha: dict[float, tuple[float, float, float]] = {}  # dt -> weights (a cache)
        self._damp: dict[float, float] = {}  # fast-EMA weight -> its noise factor (a cache)
        self.reward_peak = _NAN
        self.reward_min = _NAN  # lowest fast reward EMA so far
        self.reward_trough = _NAN  # lowest fast reward EMA before the peak
        self.w_fast = _NAN  # fast-EMA weight of the last row's gap (noise of the fast EMAs)
        self.kl_ref = _NAN  # lowest slow KL EMA after the warm-up (the settled level)
        self.entropy_early = _NAN  # entropy level over the warm-up rows
        self.length_early = _NAN
        self.early_n = 0
        self.trunc_rows = 0  # consecutive rows with frac_truncated whose fast EMA is high

    def weights(self, dt: float) -> tuple[float, float, float]:
        """EMA weights (fast, slow, half-window) for a gap of ``dt`` steps; cached by dt."""
        w = self._alpha.get(dt)
        if w is None:
            cfg = self.config
            if len(self._alpha) > 256:
                self._alpha.clear()
            w = (
                ema_weight(dt, cfg.fast_tau),
                ema_weight(dt, cfg.slow_tau),
                ema_weight(dt, cfg.window_steps / 2),
            )
            self._alpha[dt] = w
        return w

    def update(self, step: float, v: tuple[float, ...], marks: list[str] | None = None) -> bool:
        """Take one row (``v`` ordered as ``INPUT_COLUMNS``); False (nothing changed) when its
        step is not after the last one. ``marks``: the columns the row says were non-finite
        when logged (``C.NONFINITE``; None: the row does not say, and a NaN counts when the
        column was finite before and the row has other values)."""
        if step <= self.step:
            return False
        # (``x - x == 0.0``: x is finite, inline; a call of math.isfinite per column costs more)
        cfg = self.config
        (
            self.reward_mean,
            self.logp_correct,
            self.frac_correct_displaced,
            self.delta_correct,
            self.grad_norm,
            self.entropy,
            self.kl,
            self.completion_length,
            self.loss,
            self.frac_zero_std_groups,
            self.reward_std,
            self.n_correct,
            self.learning_rate,
            self.inbatch_n_correct,
            self.inbatch_n_correct_displaced,
            self.frac_truncated,
            self.probe_still,
            self.is_ratio_mean,
            self.sampler_logp_diff,
            self.sampler_prob_diff,
            self.llds_enabled,
            self.llds_lambda,
            self.llds_loss,
            self.llds_frac_gated,
            self.llds_loss_weighted,
        ) = v
        rw, lp, fd, dc, g, h, kl, ln, loss, zstd, rstd, nc, lr, inc, ink, tr, still = v[:17]
        seen = self.seen
        if self.first_step != self.first_step:
            self.first_step = step
        self.prev_step = prev = self.step
        self.step = step
        self.n_rows += 1
        w_row = self.weights(step - prev) if prev == prev else (0.0, 0.0, 0.0)
        if prev == prev:
            self.w_fast = w_row[0]  # sets the noise of the fast EMAs (see ratios)

        self._nonfinite(loss, g, marks, rw, h, kl, ln)
        self.rw_closed = self.lp_closed = _NONE_CLOSED
        weights = self.weights  # (an EMA whose last value is older than the last row's)
        if rw - rw == 0.0:
            seen.add(C.REWARD_MEAN)
            self._reward(rw, step, prev, w_row)
        if lp - lp == 0.0:
            seen.add(C.LOGP_CORRECT)
            if lp != self.lp_trend._last_value:  # a rollout batch's repeat is not new data
                self.lp_short.push(step, lp)
            self.lp_closed = self.lp_trend.push(step, lp)
        if fd - fd == 0.0:
            seen.add(C.FRAC_CORRECT_DISPLACED)
            self.displaced_ema.push(fd, step, prev, w_row, weights)
        if inc - inc == 0.0 and ink - ink == 0.0:
            seen.update((C.INBATCH_N_CORRECT, C.INBATCH_N_CORRECT_DISPLACED))
        if dc - dc == 0.0:
            seen.add(C.DELTA_CORRECT)
            self.delta_correct_ema.push(dc, step, prev, w_row, weights)
        if g - g == 0.0:
            seen.add(C.GRAD_NORM)  # 0 is a logged value (no gradient), not a missing one
            if g > 0.0:  # the EMAs are geometric: log(0) is left out
                self.log_grad_ema.push(math.log(g), step, prev, w_row, weights)
        if h - h == 0.0:
            seen.add(C.ENTROPY)
            self.entropy_ema.push(h, step, prev, w_row, weights)
        if kl - kl == 0.0 and kl >= 0.0:
            seen.add(C.KL)
            self.kl_ema.push(kl, step, prev, w_row, weights)
        if ln - ln == 0.0:
            seen.add(C.COMPLETION_LENGTH)
            self.length_ema.push(ln, step, prev, w_row, weights)
        if tr - tr == 0.0:
            seen.add(C.FRAC_TRUNCATED)
            self.truncated_ema.push(tr, step, prev, w_row, weights)
            fast = self.truncated_ema.fast
            self.trunc_rows = self.trunc_rows + 1 if fast >= cfg.truncation_frac else 0
        if nc - nc == 0.0:
            seen.add(C.N_CORRECT)
        if still - still == 0.0:
            seen.add(C.PROBE_STILL)
        for col, x in zip(INPUT_COLUMNS[17:], v[17:], strict=True):
            if x - x == 0.0:
                seen.add(col)
        if lr - lr == 0.0:
            seen.add(C.LEARNING_RATE)
        if zstd - zstd == 0.0:
            seen.add(C.FRAC_ZERO_STD_GROUPS)
        if rstd - rstd == 0.0:
            seen.add(C.REWARD_STD)

        self.warm = warm = (
            step - self.first_step >= cfg.warmup_steps and self.n_rows >= cfg.warmup_rows
        )
        if not warm:
            self._early(h, ln)
        else:
            ks = self.kl_ema.slow
            if ks == ks and not ks >= self.kl_ref:
                self.kl_ref = ks
        return True

    def _reward(
        self, rw: float, step: float, prev: float, w_row: tuple[float, float, float]
    ) -> None:
        """A finite reward: its trends (and the decline tests when a bin closed), its EMAs,
        the peak, minimum and trough of the fast one."""
        self.rw_closed = closed = self.rw_trend.push(step, rw)  # ascending levels
        if closed:
            self.rw_declining = None  # stale: re-tested when next asked
        if closed and closed[-1] >= 2:
            self.rw_decline = self.reward_decline()  # re-tested as its bins close
        self.reward_ema.push(rw, step, prev, w_row, self.weights)
        ef = self.reward_ema.fast
        if not ef >= self.reward_min:
            self.reward_min = ef
        if not ef <= self.reward_peak:
            self.reward_peak = ef
            self.reward_trough = self.reward_min

    def _nonfinite(
        self,
        loss: float,
        g: float,
        marks: list[str] | None,
        rw: float,
        h: float,
        kl: float,
        ln: float,
    ) -> None:
        """``bad_loss`` / ``bad_grad`` / ``bad_reward`` of this row: a NaN counts only when the
        column was seen finite and the row carries other training values (``rw``, ``h``,
        ``kl``, ``ln``; else it
        is a missing value, e.g. an eval row), or when ``marks`` names it."""
        seen = self.seen
        if loss - loss == 0.0:
            seen.add(C.LOSS)
            self.bad_loss = False
        elif marks is not None:  # the row names its non-finite values: a blank is missing
            self.bad_loss = loss == loss or C.LOSS in marks
        else:
            self.bad_loss = loss == loss or (C.LOSS in seen and _others(rw, h, kl, ln))
        if g - g == 0.0:
            self.bad_grad = False
        elif marks is not None:
            self.bad_grad = g == g or C.GRAD_NORM in marks
        else:
            self.bad_grad = g == g or (C.GRAD_NORM in seen and _others(rw, h, kl, ln))
        # a reward is +-inf, or a NaN the row names as non-finite (the live monitor's input
        # check raises the same: a blank reward cell is a missing value, not a failure)
        self.bad_reward = rw - rw != 0.0 and (
            rw == rw or (marks is not None and C.REWARD_MEAN in marks)
        )

    def _early(self, h: float, ln: float) -> None:
        """A warm-up row: the early levels of the entropy and the completion length (entropy
        collapse, length blow-up) are the means over the warm-up rows."""
        k = self.early_n
        if h - h == 0.0:
            he = self.entropy_early
            self.entropy_early = h if he != he else he + (h - he) / (k + 1)
        if ln - ln == 0.0:
            le = self.length_early
            self.length_early = ln if le != le else le + (ln - le) / (k + 1)
        self.early_n = k + 1

    # --- derived on demand --------------------------------------------------------------------
    def ratios(self) -> tuple[float, float, float, float]:
        """(grad fast/slow, entropy fast/slow, KL fast/slow, reward fall from its peak as a
        share of max(|peak|, peak - trough)); a ratio whose move is within ``noise_k`` times
        the noise of its fast EMA is reported as 1 (fall 0): noisy logs must not fire."""
        k = self.config.noise_k
        a = self.w_fast
        # sd of a fast EMA of white noise = sd * sqrt(a / (2 - a)); sd ~ 1.25 * mean abs dev
        damp = self._damp.get(a)
        if damp is None:
            damp = 1.25 * math.sqrt(a / (2.0 - a)) if a == a and 0.0 < a < 2.0 else 1.25
            if len(self._damp) > 256:
                self._damp.clear()
            self._damp[a] = damp
        lg, he, ke = self.log_grad_ema, self.entropy_ema, self.kl_ema
        gs, hs, ks = lg.slow, he.slow, ke.slow
        g_ratio = _NAN
        if gs == gs:
            # (capped: grad norms ~1e287 apart overflow exp; every threshold is far below e^700)
            up = min(lg.fast - gs, _MAX_LOG_RATIO)
            g_ratio = math.exp(up) if up > k * damp * lg.dev else min(1.0, math.exp(up))
        h_ratio = _NAN
        if hs == hs and hs > 0.0:
            hf = he.fast
            up = hf - hs
            h_ratio = hf / hs if up > k * damp * he.dev else min(1.0, hf / hs)
        kl_ratio = ke.fast / ks if ks == ks and ks > 1e-6 else _NAN
        peak, trough = self.reward_peak, self.reward_trough
        fall = _NAN
        if peak == peak:
            scale = max(abs(peak), peak - trough if trough == trough else 0.0)
            re = self.reward_ema
            drop = peak - re.fast
            # the peak of a noisy EMA is itself an extreme: over n independent stretches of
            # fast_tau steps it sits about sqrt(2 ln n) noise sd above the level
            if scale > 0.0:
                gate = k * damp * re.dev
                if drop > gate:  # (the extreme is only needed past the plain gate)
                    n_ind = (self.step - self.first_step) / self.config.fast_tau
                    extreme = math.sqrt(2.0 * math.log(n_ind)) if n_ind > 1.0 else 0.0
                    gate += extreme * damp * re.dev
                fall = drop / scale if drop > gate else 0.0
        return g_ratio, h_ratio, kl_ratio, fall

    def t_crit(self, f: TrendFit) -> float:
        """Critical t of a level's test, stricter the more windows of that level the run has
        already had: a long run gives a short window many chances to look like a trend
        (level ``trend_alpha`` * (window / elapsed steps) ** ``trend_alpha_decay``)."""
        elapsed = self.step - self.first_step
        w = self.lp_trend.window_steps(f.level)
        a = self.config.trend_alpha * min(1.0, w / elapsed) ** self.config.trend_alpha_decay
        return t_critical(int(f.df * 10), max(1, round(a * 1e6)))

    def reward_decline(self) -> TrendFit | None:
        """The finest reward trend with a window of 120 steps or more that falls significantly
        (the trend test of the phases) by at least ``reward_decline_frac`` of its fitted start:
        a slow decline with no explosion, which a warning names (not LLD-specific)."""
        cfg = self.config
        for level in range(2, cfg.trend_levels):
            r = self.rw_trend.fit(level, need_t=2.0)
            if r is None or r.change >= 0.0:
                continue
            if -r.change < cfg.reward_decline_frac * max(abs(r.first), abs(r.last)):
                continue
            if r.t <= -self.t_crit(r):
                return r
        return None

    def reward_declining(self) -> bool:
        """A significant downward reward trend at some scale (a low, noisy reward that merely
        sits below an early noisy peak is not a fall); re-tested only after a reward bin has
        closed since the last test (the collapse rule asks on every row of a collapse)."""
        if self.rw_declining is None:
            self.rw_declining = False
            for level in range(self.config.trend_levels):
                r = self.rw_trend.fit(level, need_t=2.0)
                if r is not None and r.t <= -self.t_crit(r):
                    self.rw_declining = True
                    break
        return self.rw_declining

    # --- plain-JSON state ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The running state as plain JSON (no NaN)."""
        return {
            "n_rows": self.n_rows,
            "first_step": _enc(self.first_step),
            "last_step": _enc(self.step),
            "seen": sorted(self.seen),
            "ols": {"_lp_short": self.lp_short.state()},
            "ema": {
                f"{g}_{f}": _enc(getattr(getattr(self, f"{g}_ema"), f))
                for g in EMA_SIGNALS
                for f in Ema.FIELDS
            },
            "ema_last": {k: _enc(getattr(self, f"{g}_ema").last) for g, k in EMA_SIGNALS.items()},
            "rw_peak": _enc(self.reward_peak),
            "rw_min": _enc(self.reward_min),
            "rw_trough": _enc(self.reward_trough),
            "w_fast": _enc(self.w_fast),
            "h_early": _enc(self.entropy_early),
            "kl_ref": _enc(self.kl_ref),
            "len_early": _enc(self.length_early),
            "early_n": self.early_n,
            "trunc_rows": self.trunc_rows,
            "lp_ms": self.lp_trend.state(),
            "rw_ms": self.rw_trend.state(),
            "rw_declining": self.rw_declining,
            "rw_decline": fit_state(self.rw_decline),
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``; slots added since it was saved start afresh. A state
        without ``rw_decline`` (version 1) re-tests it now, as version 1 did on loading."""
        self.reset()
        self.n_rows = int(d["n_rows"])
        self.first_step = _dec(d["first_step"])
        self.step = _dec(d["last_step"])
        self.seen = set(d["seen"])
        self.lp_short.load(d["ols"]["_lp_short"])
        # (a state saved before every field was kept lacks the ones no check read: NaN)
        ema, ema_last = d["ema"], d["ema_last"]
        for g, k in EMA_SIGNALS.items():
            e = getattr(self, f"{g}_ema")
            for f in Ema.FIELDS:
                setattr(e, f, _dec(ema.get(f"{g}_{f}")))
            e.last = _dec(ema_last.get(k))
        self.reward_peak = _dec(d["rw_peak"])
        self.reward_min = _dec(d["rw_min"])
        self.reward_trough = _dec(d["rw_trough"])
        self.w_fast = _dec(d["w_fast"])
        self.entropy_early = _dec(d["h_early"])
        self.kl_ref = _dec(d["kl_ref"])
        self.length_early = _dec(d["len_early"])
        self.early_n = int(d["early_n"])
        self.trunc_rows = int(d.get("trunc_rows", 0))
        self.lp_trend.load(d["lp_ms"])
        self.rw_trend.load(d["rw_ms"])
        self.rw_declining = d["rw_declining"]
        if "rw_decline" in d:
            self.rw_decline = fit_from_state(d["rw_decline"])
        else:
            self.rw_decline = self.reward_decline()
