"""The online phase detector: one row at a time, O(1) amortized, same alerts live and on replay.

Phases (PAPER.md, "The death spiral"): ``stagnation`` = likelihood of correct responses flat while
the reward rises; ``decay`` = that likelihood declines steadily; ``collapse`` = sharp drop with a
grad-norm surge, entropy rise, reward fall (and most correct responses displaced). Without the LLD
columns only ``collapse`` can be seen (from standard metrics); stagnation and decay cannot, and the
phase stays ``unknown`` until then. Non-LLD failures raise their own kinds.

All windows are in *steps* (the ``step`` column), never in rows, so sparse logging works (one
exception: the ``spike`` baseline is the median of a signal's last logged values, the reference
of a single value, not a time scale). The
stagnation and decay trends are tested at every time scale at once (``analysis/trend.py``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from statistics import NormalDist
from typing import Any

from lld_monitor import columns as C
from lld_monitor.analysis.trend import (
    MultiScaleTrend,
    TrendFit,
    from_json_float,
    json_float,
    t_critical,
)
from lld_monitor.events import Alert

_NAN = float("nan")
_RANK = {"unknown": 0, "healthy": 0, "stagnation": 1, "decay": 2, "collapse": 3}
_BY_RANK = {1: "stagnation", 2: "decay", 3: "collapse"}

#: Columns the detector reads, in the order of its internal value tuple.
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
)


@dataclass(frozen=True)
class DetectorConfig:
    """Hyperparameters of ``PhaseDetector`` (steps are optimizer steps, not rows)."""

    warmup_steps: int = 20  # no alert before this many steps after the first row
    warmup_rows: int = 5  # ... nor before this many rows
    window_steps: int = 40  # time constant x2 of the displaced-share / delta EMAs; refinement span
    short_steps: int = 10  # window of a sharp drop (collapse)
    min_short_rows: int = 3
    trend_base_steps: float = 3.0  # bin width of the finest trend level (steps)
    trend_bins: int = 10  # bins per trend window: level j spans trend_bins * base * 2**j steps
    trend_levels: int = 9  # levels: windows of 30, 60, ... 7680 steps with the defaults
    trend_alpha: float = 0.01  # one-sided level of each trend test (Student t, AR(1) n_eff)
    trend_persist: int = 4  # hold at (this - 1) consecutive tests spanning (this - 1) bins
    trend_alpha_decay: float = 0.75  # alpha shrinks as (window / elapsed) ** this in long runs
    collapse_persist_steps: int = 6  # collapse must hold this long
    recover_steps: int = 40  # an LLD phase is left after its conditions cleared this long
    trend_t: float = 3.0  # |t| of an OLS slope that counts as a trend
    reward_min_rise: float = 0.05  # relative reward rise over the window for "reward rises"
    flat_tol: float = 0.02  # nats/token: logp_correct change over the window counted as flat
    decay_min_drop: float = 0.025  # nats/token: minimum logp_correct drop over the window
    collapse_drop: float = 0.05  # nats/token: logp_correct drop over short_steps that is sharp
    displaced_frac: float = 0.5  # share of correct responses displaced (paper's > 50%)
    displaced_z: float = 2.326  # one-sided z (1%) of the pooled displaced share above the 0.5
    displaced_min_n: float = 12.0  # least pooled (weighted) correct responses behind the alert
    displaced_memory: float = 0.5  # weight kept per probe by the pooled displaced counts
    displaced_default_n: float = 8.0  # correct responses assumed per probe without n_correct
    # in-batch counts (distinct responses, a few per row): pooled with a half-life in responses
    inbatch_half_life: float = 24.0
    inbatch_alpha_decay: float = 0.5  # its level shrinks as (window / responses so far) ** this
    grad_surge_ratio: float = 2.0  # fast / slow grad norm (geometric EMAs)
    entropy_rise_ratio: float = 1.15  # fast / slow entropy
    reward_fall_frac: float = 0.15  # reward EMA below its peak by this share of max(|peak|, gain)
    noise_k: float = 3.0  # a surge / rise / fall must exceed this many noise sd of its fast EMA
    fast_tau: float = 5.0  # steps, time constant of the fast EMAs
    slow_tau: float = 50.0  # steps, time constant of the baselines
    nonfinite_grad_rows: int = 3  # consecutive non-finite grad norms before "nonfinite"
    dead_zero_std: float = 0.95  # frac_zero_std_groups at or above = dead signal
    dead_reward_std: float = 1e-6  # reward_std at or below = dead signal
    failure_persist_steps: int = 10  # dead_signal / entropy_collapse / length_blowup persistence
    entropy_floor_frac: float = 0.1  # entropy below this share of its early level = collapse
    length_blowup_ratio: float = 3.0  # completion length above this multiple of its early level
    reward_decline_frac: float = 0.3  # sustained reward decline from its peak (not LLD-specific)
    kl_blowup_ratio: float = 100.0  # KL above this multiple of its settled level ...
    kl_floor: float = 0.01  # ... taken as at least this (KL grows from 0 in every run)
    truncation_frac: float = 0.5  # share of completions cut at the length cap (fast EMA) ...
    truncation_min_rows: int = 3  # ... over at least this many logged rows in a row
    # single-row spikes of KL and grad norm (``spike``, info): a value above the median of the
    # signal's last spike_window logged values + spike_k * 1.4826 * their MAD, and at least
    # spike_ratio (KL) / spike_grad_ratio (grad norm) times its baseline: the larger of that
    # median and the highest such median so far (KL: at least kl_floor)
    spike_window: int = 25  # rows (a fixed window: O(1) per row)
    spike_min_rows: int = 10  # least values in the window before a spike can be named
    spike_k: float = 10.0
    spike_ratio: float = 20.0
    spike_grad_ratio: float = 50.0  # pre-clip grad norms jump x26 in a healthy toy run
    spike_cooldown_rows: int = 10  # values of that signal after a spike alert before the next

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"DetectorConfig.{f.name} must be a positive number, got {v!r}")
        if self.displaced_memory > 1.0 or self.displaced_frac >= 1.0:
            raise ValueError(
                "DetectorConfig.displaced_memory and displaced_frac must be <= 1 / < 1"
            )
        if self.short_steps > self.window_steps:
            raise ValueError("DetectorConfig.short_steps must not exceed window_steps")
        if self.spike_min_rows > self.spike_window:
            raise ValueError("DetectorConfig.spike_min_rows must not exceed spike_window")


class _RollingOLS:
    """Least-squares line through the (step, value) pairs of a trailing window of steps.

    Running sums make push and fit O(1); the sums are rebuilt from the window every
    ``len(window)`` pushes (amortized O(1)) so rounding cannot accumulate over long runs.
    """

    __slots__ = ("buf", "min_rows", "n_since", "s", "steps")

    def __init__(self, steps: float, min_rows: int) -> None:
        self.steps = steps
        self.min_rows = min_rows
        self.buf: deque[tuple[float, float]] = deque()
        self.s = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # anchor, n, sx, sy, sxx, sxy, syy
        self.n_since = 0

    def push(self, x: float, y: float) -> None:
        buf, s = self.buf, self.s
        buf.append((x, y))
        dx = x - s[0]
        s[1] += 1.0
        s[2] += dx
        s[3] += y
        s[4] += dx * dx
        s[5] += dx * y
        s[6] += y * y
        lim = x - self.steps
        keep = self.min_rows
        while buf[0][0] <= lim and len(buf) > keep:
            ox, oy = buf.popleft()
            dx = ox - s[0]
            s[1] -= 1.0
            s[2] -= dx
            s[3] -= oy
            s[4] -= dx * dx
            s[5] -= dx * oy
            s[6] -= oy * oy
        self.n_since += 1
        if self.n_since >= 16 and self.n_since >= len(buf):
            self._recompute()

    def _recompute(self) -> None:
        a = self.buf[0][0]
        n = sx = sy = sxx = sxy = syy = 0.0
        for x, y in self.buf:
            dx = x - a
            n += 1.0
            sx += dx
            sy += y
            sxx += dx * dx
            sxy += dx * y
            syy += y * y
        self.s = [a, n, sx, sy, sxx, sxy, syy]
        self.n_since = 0

    def fit(self) -> tuple[float, float, float, float, float]:
        """(slope per step, its t, span in steps, fitted first value, fitted last value)."""
        buf = self.buf
        n = len(buf)
        if n < 3:
            return _NAN, _NAN, 0.0, _NAN, _NAN
        a, _, sx, sy, sxx, sxy, syy = self.s
        mx, my = sx / n, sy / n
        vxx = sxx - sx * mx
        if vxx <= 0.0:
            return _NAN, _NAN, 0.0, _NAN, _NAN
        cxy = sxy - sx * my
        slope = cxy / vxx
        rss = max(syy - sy * my - slope * cxy, 0.0)
        se = math.sqrt(rss / (n - 2) / vxx)
        t = slope / se if se > 0.0 else (math.copysign(math.inf, slope) if slope else 0.0)
        x0, x1 = buf[0][0] - a, buf[-1][0] - a
        return slope, t, x1 - x0, my + slope * (x0 - mx), my + slope * (x1 - mx)

    def state(self) -> dict[str, Any]:
        return {
            "buf": [[_enc(x), _enc(y)] for x, y in self.buf],
            "s": [_enc(v) for v in self.s],
            "n_since": self.n_since,
        }

    def load(self, d: Mapping[str, Any]) -> None:
        self.buf = deque((_dec(x), _dec(y)) for x, y in d["buf"])
        self.s = [_dec(v) for v in d["s"]]
        self.n_since = int(d["n_since"])


class _Spikes:
    """Single-row spikes of one signal against the median / MAD of its last ``window`` values.

    The baseline of the ratio is the larger of the current window median and the highest window
    median so far (``peak``): in a run whose signal collapsed towards 0 (no gradient in most
    steps) an ordinary value is not a spike. ``peak`` is sampled every ``STRIDE`` values (a sort
    of the small window); a value past the ratio test gets the exact median of its window, then
    the MAD (another sort). So a row costs a deque append and a few comparisons.
    """

    STRIDE = 5
    __slots__ = ("buf", "cool", "cool_rows", "floor", "k_mad", "min_rows", "peak", "ratio", "tick")

    def __init__(self, cfg: DetectorConfig, ratio: float, floor: float) -> None:
        self.buf: deque[float] = deque(maxlen=cfg.spike_window)
        self.peak = _NAN  # highest window median so far (sampled every STRIDE values)
        self.tick = 0  # values since peak was last sampled
        self.cool = 0  # values left before the next alert may fire
        self.min_rows = cfg.spike_min_rows
        self.k_mad = cfg.spike_k * 1.4826  # MAD -> sd of normal noise
        self.cool_rows = cfg.spike_cooldown_rows
        self.ratio = ratio
        self.floor = floor

    def _median_of_window(self) -> tuple[float, list[float]]:
        srt = sorted(self.buf)
        n = len(srt)
        h = n >> 1
        m = srt[h] if n & 1 else 0.5 * (srt[h - 1] + srt[h])
        if not m <= self.peak:
            self.peak = m
        return m, srt

    def push(self, x: float, test: bool) -> tuple[float, float, float, int] | None:
        """Add ``x``; (median, MAD, baseline, values) of the window before it when it is a
        spike and ``test`` (the detector is warm), else None."""
        hit = None
        buf = self.buf
        n = len(buf)
        if self.cool > 0:
            self.cool -= 1
        if n >= self.min_rows:
            self.tick += 1
            if self.tick >= self.STRIDE or self.peak != self.peak:
                self.tick = 0
                self._median_of_window()
            peak, floor, ratio = self.peak, self.floor, self.ratio
            if test and self.cool == 0 and x >= ratio * (peak if peak > floor else floor):
                m, srt = self._median_of_window()  # exact, for the value at hand
                base = self.peak if self.peak > floor else floor
                if x >= ratio * base and base > 0.0:
                    h = n >> 1
                    mads = sorted([abs(v - m) for v in srt])
                    mad = mads[h] if n & 1 else 0.5 * (mads[h - 1] + mads[h])
                    if x > m + self.k_mad * mad:
                        hit = (m, mad, base, n)
                        self.cool = self.cool_rows
        buf.append(x)
        return hit

    def state(self) -> dict[str, Any]:
        buf, peak = list(self.buf), _enc(self.peak)
        return {"buf": buf, "peak": peak, "cool": self.cool, "tick": self.tick}

    def load(self, d: Mapping[str, Any]) -> None:
        self.buf.clear()
        self.buf.extend(float(v) for v in d["buf"])
        self.peak = _dec(d["peak"])
        self.cool = int(d["cool"])
        self.tick = int(d.get("tick", 0))


class _DisplacedShare:
    """The paper's indicator as a test: is the share of correct responses displaced above
    ``frac`` (0.5), with evidence in counts?

    Each probe gives ``k`` displaced out of ``n`` correct responses (``n`` from ``n_correct``,
    else ``default_n``). Counts are pooled with weight ``memory`` per earlier probe (half-life
    of about one probe at 0.5), so one large rollout batch or two consecutive small ones can
    carry the evidence; a probe that repeats the previous one exactly (a rollout batch's value
    logged on each of its rows) is not counted again. It fires when the latest probe and the
    pooled share are above ``frac`` and the pooled one-sided z (binomial variance at ``frac``,
    weights squared) reaches ``z``; it re-arms once the pooled share is back below ``frac``.
    """

    __slots__ = (
        "decay",
        "default_n",
        "fired",
        "frac",
        "half_life",
        "k",
        "last",
        "memory",
        "min_n",
        "n",
        "probes",
        "s2",
        "total",
        "z",
    )

    def __init__(
        self,
        frac: float,
        z: float,
        memory: float,
        default_n: float,
        min_n: float,
        half_life: float = _NAN,
        decay: float = 0.0,
    ) -> None:
        self.frac, self.z, self.memory, self.default_n = frac, z, memory, default_n
        self.min_n, self.half_life, self.decay = min_n, half_life, decay
        self.total = 0.0  # responses counted so far, unweighted (push_counts)
        self.k = self.n = self.s2 = 0.0  # weighted displaced, weighted correct, sum w^2 n
        self.last: tuple[float, float] = (_NAN, _NAN)
        self.probes: deque[tuple[float, float, float]] = deque(maxlen=4)  # (step, k, n)
        self.fired = False

    def push(self, step: float, share: float, n_correct: float) -> bool:
        """Add one probe; True when the test newly fires."""
        n = n_correct if n_correct == n_correct and n_correct > 0 else self.default_n
        if (share, n_correct) == self.last or not 0.0 <= share <= 1.0:
            return False
        self.last = (share, n_correct)
        k = share * n
        m = self.memory
        self.k = m * self.k + k
        self.n = m * self.n + n
        self.s2 = m * m * self.s2 + n
        self.probes.append((step, k, n))
        return self._decide(share > self.frac)

    def push_counts(self, step: float, k: float, n: float) -> bool:
        """Add ``k`` displaced of ``n`` correct responses not counted before (the in-batch
        measurement: distinct responses, a few per row). Earlier counts keep the weight
        0.5 ** (n / half_life), a half-life counted in responses, not rows; fires on the pooled
        share alone (one row holds too few responses for a share of its own)."""
        if not (n > 0 and 0.0 <= k <= n):
            return False
        m = 0.5 ** (n / self.half_life)
        self.k = m * self.k + k
        self.n = m * self.n + n
        self.s2 = m * m * self.s2 + n
        self.total += n
        self.probes.append((step, k, n))
        return self._decide(True)

    def _decide(self, latest_above: bool) -> bool:
        """Re-arm once the pooled share is back below ``frac``; else fire (True) when the
        latest evidence and the pooled share are above it with enough counts and z."""
        if self.fired:
            if self.k < self.frac * self.n:
                self.fired = False
            return False
        if (
            latest_above
            and self.k > self.frac * self.n
            and self.n >= self.min_n
            and self.stat() >= self.z_crit()
        ):
            self.fired = True
            return True
        return False

    def z_crit(self) -> float:
        """The z the pooled counts must reach. Tested on every row, the in-batch counts would
        almost surely cross a fixed level in a long run whose share sits near ``frac``; as the
        trend tests do, the level shrinks as (window / responses so far) ** ``decay`` once more
        responses than one window (half_life / ln 2) have been counted."""
        window = self.half_life / math.log(2.0)
        if not self.decay or not self.total > window:
            return self.z
        alpha = (1.0 - NormalDist().cdf(self.z)) * (window / self.total) ** self.decay
        return NormalDist().inv_cdf(1.0 - alpha)

    def stat(self) -> float:
        """One-sided z of the pooled share against ``frac``."""
        if self.s2 <= 0.0:
            return _NAN
        f = self.frac
        return (self.k - f * self.n) / math.sqrt(f * (1.0 - f) * self.s2)

    def evidence(self) -> dict[str, Any]:
        return {
            "displaced_share": self.probes[-1][1] / self.probes[-1][2] if self.probes else _NAN,
            "displaced_pooled_share": self.k / self.n if self.n > 0 else _NAN,
            "displaced_pooled_n": self.n,
            "displaced_z": self.stat(),
            "displaced_z_needed": self.z_crit(),
            "displaced_probes": [[int(s), round(k, 3), round(n, 3)] for s, k, n in self.probes],
        }

    def state(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "k": self.k,
            "n": self.n,
            "s2": self.s2,
            "last": [_enc(v) for v in self.last],
            "probes": [list(p) for p in self.probes],
            "fired": self.fired,
        }

    def load(self, d: Mapping[str, Any]) -> None:
        self.k, self.n, self.s2 = float(d["k"]), float(d["n"]), float(d["s2"])
        self.total = float(d.get("total", 0.0))
        a, b = (_dec(v) for v in d["last"])
        self.last = (a, b)
        self.probes = deque((tuple(map(float, p)) for p in d["probes"]), maxlen=4)
        self.fired = bool(d["fired"])


_enc = json_float
_dec = from_json_float


def _f(v: Any) -> float:
    """A row value as a float; NaN when missing or not a number."""
    if v is None:
        return _NAN
    try:
        return float(v)
    except (TypeError, ValueError):
        return _NAN


def ema_weight(dt: float, tau: float) -> float:
    """Weight of a new value in an EMA with time constant ``tau`` steps, ``dt`` steps later."""
    return 1.0 - math.exp(-dt / tau)


# EMA slots (values in self._ema) and the signal group whose last step gives their dt
_RW_F, _FD_F, _FD_S, _DC_S, _G_F, _G_S, _H_F, _H_S, _KL_F, _KL_S, _LEN_F = range(11)
_RW_D, _G_D, _H_D = range(11, 14)  # mean absolute deviation of the raw value from its fast EMA
_TR_F = 14  # share of truncated completions (fast EMA)
_EMA_NAMES = (
    "reward_fast",
    "displaced_fast",
    "displaced_window",
    "delta_correct_window",
    "log_grad_fast",
    "log_grad_slow",
    "entropy_fast",
    "entropy_slow",
    "kl_fast",
    "kl_slow",
    "length_fast",
    "reward_dev",
    "log_grad_dev",
    "entropy_dev",
    "truncated_fast",
)
_FAILURES = (
    "dead_signal",
    "entropy_collapse",
    "length_blowup",
    "reward_decline",
    "kl_blowup",
    "truncation",
)


class PhaseDetector:
    """Online LLD phase detector: ``update(row) -> list[Alert]``, ``.phase``, JSON state.

    Hyperparameters are those of ``DetectorConfig`` and are stored under their names.
    """

    def __init__(self, config: DetectorConfig | None = None, **hyperparameters: Any) -> None:
        try:
            cfg = replace(config or DetectorConfig(), **hyperparameters)
        except TypeError as exc:
            names = [f.name for f in fields(DetectorConfig)]
            raise ValueError(f"unknown PhaseDetector hyperparameter ({exc}); use {names}") from exc
        self.config = cfg
        for name, value in asdict(cfg).items():
            setattr(self, name, value)
        self.reset()

    # --- public API -------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every row seen; keep the hyperparameters."""
        cfg = self.config
        self._n_rows = 0
        self._first_step = _NAN
        self._last_step = _NAN
        self._last_step_prev = _NAN
        self._phase = "unknown"
        self._seen: set[str] = set()
        self._lp_short = _RollingOLS(cfg.short_steps, cfg.min_short_rows)
        self._lp_ms = MultiScaleTrend(
            cfg.trend_base_steps, cfg.trend_bins, cfg.trend_levels, cfg.trend_alpha
        )
        self._rw_ms = MultiScaleTrend(
            cfg.trend_base_steps, cfg.trend_bins, cfg.trend_levels, cfg.trend_alpha
        )
        # per trend level: consecutive tests that held stagnation-or-worse / decay
        self._hold1 = [0] * cfg.trend_levels
        self._hold2 = [0] * cfg.trend_levels
        self._since1 = [0.0] * cfg.trend_levels  # step of the first test of each streak
        self._since2 = [0.0] * cfg.trend_levels
        self._conf = [0] * cfg.trend_levels  # confirmed rank per level
        self._trend_rank = 0
        self._trend_level = -1  # the level behind the current trend rank
        self._recover = float(cfg.recover_steps)  # steps without support before leaving a phase
        self._rw_decline: TrendFit | None = None  # the reward_decline trend, when there is one
        self._rw_declining: bool | None = None  # cached _reward_declining() (None: stale)
        self._ema = [_NAN] * len(_EMA_NAMES)
        self._last = {k: _NAN for k in ("rw", "fd", "dc", "g", "h", "kl", "len", "tr")}
        self._alpha: dict[float, tuple[float, float, float]] = {}  # dt -> weights (a cache)
        self._log_surge = math.log(cfg.grad_surge_ratio)
        self._damp: dict[float, float] = {}  # fast-EMA weight -> its noise factor (a cache)
        self._rw_peak = _NAN
        self._rw_min = _NAN  # lowest fast reward EMA so far
        self._rw_trough = _NAN  # lowest fast reward EMA before the peak
        self._w_fast = _NAN  # fast-EMA weight of the last row's gap (noise of the fast EMAs)
        self._kl_ref = _NAN  # lowest slow KL EMA after the warm-up (the settled level)
        self._h_early = _NAN  # entropy level over the warm-up rows
        self._len_early = _NAN
        self._early_n = 0
        self._grad_bad = 0  # consecutive non-finite grad norms
        self._trunc_rows = 0  # consecutive rows with frac_truncated whose fast EMA is high
        self._spikes = {
            C.KL: _Spikes(cfg, cfg.spike_ratio, cfg.kl_floor),
            C.GRAD_NORM: _Spikes(cfg, cfg.spike_grad_ratio, 0.0),
        }
        # first step of the current streak of each condition (NaN: not holding)
        self._since: dict[str, float] = {
            k: _NAN
            for k in ("r1", "r2", "r3", "below", *_FAILURES, *(f + "_off" for f in _FAILURES))
        }
        self._below_rank = 0
        self._fired: dict[str, bool] = {k: False for k in ("nonfinite", *_FAILURES)}
        self._displaced = _DisplacedShare(
            cfg.displaced_frac,
            cfg.displaced_z,
            cfg.displaced_memory,
            cfg.displaced_default_n,
            cfg.displaced_min_n,
        )
        self._inbatch = _DisplacedShare(
            cfg.displaced_frac,
            cfg.displaced_z,
            1.0,
            cfg.displaced_default_n,
            cfg.displaced_min_n,
            cfg.inbatch_half_life,
            cfg.inbatch_alpha_decay,
        )

    @property
    def phase(self) -> str:
        """The current phase, one of ``columns.PHASES``."""
        return self._phase

    @property
    def signals_used(self) -> list[str]:
        """Input columns that have had a finite value so far."""
        return [c for c in INPUT_COLUMNS if c in self._seen]

    @property
    def signals_missing(self) -> list[str]:
        """Input columns never seen with a finite value."""
        return [c for c in INPUT_COLUMNS if c not in self._seen]

    def limitations(self) -> list[str]:
        """What the missing signals rule out, in words."""
        out: list[str] = []
        if C.LOGP_CORRECT not in self._seen:
            out.append(
                "no logp_correct: stagnation and decay cannot be detected; the phase stays "
                "'unknown' unless a collapse is seen in standard metrics"
            )
        if C.FRAC_CORRECT_DISPLACED not in self._seen:
            out.append("no frac_correct_displaced: the paper's >50% displaced indicator is unused")
        for col, what in (
            (C.REWARD_MEAN, "no reward_mean: stagnation and reward-fall evidence unavailable"),
            (C.GRAD_NORM, "no grad_norm: grad-norm surge and non-finite grad checks unavailable"),
            (C.ENTROPY, "no entropy: entropy rise and entropy collapse checks unavailable"),
            (C.COMPLETION_LENGTH, "no completion_length: length blow-up check unavailable"),
        ):
            if col not in self._seen:
                out.append(what)
        return out

    def update(self, row: Mapping[str, Any]) -> list[Alert]:
        """Feed one step row (keyed by ``columns`` names; missing/NaN allowed); return new alerts.

        Rows whose step is not greater than the last one seen are ignored (duplicates, replays).
        """
        step = _f(row.get(C.STEP))
        if not math.isfinite(step):
            raise ValueError(f"a row needs a numeric {C.STEP!r} value, got {row.get(C.STEP)!r}")
        marks = row.get(C.NONFINITE)
        return self._update(
            step,
            tuple([_f(row.get(c)) for c in INPUT_COLUMNS]),
            marks.split(",") if isinstance(marks, str) else None,
        )

    def state_dict(self) -> dict[str, Any]:
        """The full running state as plain JSON (no NaN: encoded as null)."""
        ols = ("_lp_short",)
        return {
            "version": 1,
            "params": asdict(self.config),
            "n_rows": self._n_rows,
            "first_step": _enc(self._first_step),
            "last_step": _enc(self._last_step),
            "phase": self._phase,
            "seen": sorted(self._seen),
            "ols": {k: getattr(self, k).state() for k in ols},
            "ema": {k: _enc(v) for k, v in zip(_EMA_NAMES, self._ema)},
            "ema_last": {k: _enc(v) for k, v in self._last.items()},
            "rw_peak": _enc(self._rw_peak),
            "rw_min": _enc(self._rw_min),
            "rw_trough": _enc(self._rw_trough),
            "w_fast": _enc(self._w_fast),
            "h_early": _enc(self._h_early),
            "kl_ref": _enc(self._kl_ref),
            "len_early": _enc(self._len_early),
            "early_n": self._early_n,
            "grad_bad": self._grad_bad,
            "trunc_rows": self._trunc_rows,
            "spikes": {k: v.state() for k, v in self._spikes.items()},
            "since": {k: _enc(v) for k, v in self._since.items()},
            "below_rank": self._below_rank,
            "fired": dict(self._fired),
            "displaced": self._displaced.state(),
            "inbatch": self._inbatch.state(),
            "lp_ms": self._lp_ms.state(),
            "rw_ms": self._rw_ms.state(),
            "hold1": list(self._hold1),
            "hold2": list(self._hold2),
            "since1": list(self._since1),
            "since2": list(self._since2),
            "conf": list(self._conf),
            "recover": self._recover,
            "rw_declining": self._rw_declining,
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> PhaseDetector:
        """A detector with the saved hyperparameters and running state."""
        det = cls(**dict(state["params"]))
        det.load_state_dict(state)
        return det

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``; the hyperparameters must be the ones it was saved with."""
        if state.get("version") != 1:
            raise ValueError(f"unsupported PhaseDetector state version {state.get('version')!r}")
        # hyperparameters added since the state was saved take their defaults
        if {**asdict(DetectorConfig()), **state["params"]} != asdict(self.config):
            raise ValueError(
                "state was saved with other hyperparameters; build the detector with "
                "PhaseDetector(**state['params']) before loading it"
            )
        self.reset()
        self._n_rows = int(state["n_rows"])
        self._first_step = _dec(state["first_step"])
        self._last_step = _dec(state["last_step"])
        self._phase = str(state["phase"])
        self._seen = set(state["seen"])
        for k, v in state["ols"].items():
            getattr(self, k).load(v)
        # slots, streaks and flags added since a state was saved start afresh (NaN, 0, False)
        self._ema = [_dec(state["ema"].get(k)) for k in _EMA_NAMES]
        self._last.update({k: _dec(v) for k, v in state["ema_last"].items()})
        self._rw_peak = _dec(state["rw_peak"])
        self._rw_min = _dec(state["rw_min"])
        self._rw_trough = _dec(state["rw_trough"])
        self._w_fast = _dec(state["w_fast"])
        self._h_early = _dec(state["h_early"])
        self._kl_ref = _dec(state["kl_ref"])
        self._len_early = _dec(state["len_early"])
        self._early_n = int(state["early_n"])
        self._grad_bad = int(state["grad_bad"])
        self._trunc_rows = int(state.get("trunc_rows", 0))
        for k, v in state.get("spikes", {}).items():  # saved before spikes: start afresh
            self._spikes[k].load(v)
        self._since.update({k: _dec(v) for k, v in state["since"].items()})
        self._below_rank = int(state["below_rank"])
        self._fired.update({k: bool(v) for k, v in state["fired"].items()})
        self._displaced.load(state["displaced"])
        if "inbatch" in state:  # saved before the in-batch counts existed: start afresh
            self._inbatch.load(state["inbatch"])
        self._lp_ms.load(state["lp_ms"])
        self._rw_ms.load(state["rw_ms"])
        self._hold1 = [int(v) for v in state["hold1"]]
        self._hold2 = [int(v) for v in state["hold2"]]
        self._since1 = [float(v) for v in state["since1"]]
        self._since2 = [float(v) for v in state["since2"]]
        self._conf = [int(v) for v in state["conf"]]
        self._recover = float(state["recover"])
        self._rw_decline = self._reward_decline()
        self._rw_declining = state["rw_declining"]
        self._trend_rank, self._trend_level = self._confirmed_trend()

    # --- the work -----------------------------------------------------------------------------
    def _weights(self, dt: float) -> tuple[float, float, float]:
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

    def _update(
        self, step: float, v: tuple[float, ...], marks: list[str] | None = None
    ) -> list[Alert]:
        """Core update on the value tuple ordered as ``INPUT_COLUMNS``; ``marks``: the columns
        the row says were non-finite when logged (``C.NONFINITE``; None: the row does not say,
        and a NaN counts when the column was finite before and the row has other values)."""
        if step <= self._last_step:
            return []
        cfg = self.config
        rw, lp, fd, dc, g, h, kl, ln, loss, zstd, rstd, nc, lr, inc, ink, tr = v
        seen = self._seen
        if self._first_step != self._first_step:
            self._first_step = step
        self._last_step_prev = self._last_step
        self._last_step = step
        self._n_rows += 1
        alerts: list[Alert] = []
        fin = math.isfinite
        E, L = self._ema, self._last
        prev = self._last_step_prev
        w_row = self._weights(step - prev) if prev == prev else (0.0, 0.0, 0.0)
        if prev == prev:
            self._w_fast = w_row[0]  # sets the noise of the fast EMAs (see _ratios)

        # --- non-finite loss / grad norm: NaN counts only when the column was seen finite and
        # the row carries other training values (else it is a missing value, e.g. an eval row)
        if fin(loss):
            seen.add(C.LOSS)
            bad_loss = False
        elif marks is not None:  # the row names its non-finite values: a blank is missing
            bad_loss = loss == loss or C.LOSS in marks
        else:
            bad_loss = loss == loss or (
                C.LOSS in seen and (fin(rw) or fin(h) or fin(kl) or fin(ln))
            )
        if fin(g):
            bad_grad = False
        elif marks is not None:
            bad_grad = g == g or C.GRAD_NORM in marks
        else:
            bad_grad = g == g or (C.GRAD_NORM in seen and (fin(rw) or fin(h) or fin(kl) or fin(ln)))
        self._grad_bad = self._grad_bad + 1 if bad_grad else 0

        # --- feed the statistics ---------------------------------------------------------------
        if fin(rw):
            seen.add(C.REWARD_MEAN)
            closed = self._rw_ms.push(step, rw)  # ascending levels
            if closed:
                self._rw_declining = None  # stale: re-tested when next asked
            if closed and closed[-1] >= 2:
                self._rw_decline = self._reward_decline()  # re-tested as its bins close
            last = L["rw"]
            if last != last:
                E[_RW_F] = rw
                E[_RW_D] = 0.0
            else:
                w = w_row if last == prev else self._weights(step - last)
                E[_RW_D] += w[1] * (abs(rw - E[_RW_F]) - E[_RW_D])
                E[_RW_F] += w[0] * (rw - E[_RW_F])
            L["rw"] = step
            ef = E[_RW_F]
            if not ef >= self._rw_min:
                self._rw_min = ef
            if not ef <= self._rw_peak:
                self._rw_peak = ef
                self._rw_trough = self._rw_min
        if fin(lp):
            seen.add(C.LOGP_CORRECT)
            if lp != self._lp_ms._last_value:  # a rollout batch's repeat is not new data
                self._lp_short.push(step, lp)
            closed = self._lp_ms.push(step, lp)
            if closed:
                self._trend_levels(step, closed)
        if fin(fd):
            seen.add(C.FRAC_CORRECT_DISPLACED)
            # the paper's indicator; a row whose optimizer did not step (lr 0 in warm-up, a
            # skipped non-finite step) displaced nothing and is no evidence either way
            if (
                not (lr == 0.0 or bad_grad)
                and self._displaced.push(step, fd, nc)
                and not self._inbatch.fired  # one alert for one displacement
            ):
                alerts.append(self._displacement_alert(int(step), self._displaced))
            last = L["fd"]
            if last != last:
                E[_FD_F] = E[_FD_S] = fd
            else:
                w = w_row if last == prev else self._weights(step - last)
                E[_FD_F] += w[0] * (fd - E[_FD_F])
                E[_FD_S] += w[2] * (fd - E[_FD_S])
            L["fd"] = step
        if fin(inc) and fin(ink):
            seen.update((C.INBATCH_N_CORRECT, C.INBATCH_N_CORRECT_DISPLACED))
            # measured inside a reused rollout batch after updates on it (the monitor skips
            # responses no update has touched); same indicator, earlier
            if (
                not bad_grad
                and self._inbatch.push_counts(step, ink, inc)
                and not self._displaced.fired
            ):
                alerts.append(self._displacement_alert(int(step), self._inbatch))
        if fin(dc):
            seen.add(C.DELTA_CORRECT)
            last = L["dc"]
            if last != last:
                E[_DC_S] = dc
            else:
                E[_DC_S] += (w_row if last == prev else self._weights(step - last))[2] * (
                    dc - E[_DC_S]
                )
            L["dc"] = step
        if fin(g):
            seen.add(C.GRAD_NORM)  # 0 is a logged value (no gradient), not a missing one
        if fin(g) and g > 0.0:  # the EMAs are geometric: log(0) is left out
            lg = math.log(g)
            last = L["g"]
            if last != last:
                E[_G_F] = E[_G_S] = lg
                E[_G_D] = 0.0
            else:
                w = w_row if last == prev else self._weights(step - last)
                E[_G_D] += w[1] * (abs(lg - E[_G_F]) - E[_G_D])
                E[_G_F] += w[0] * (lg - E[_G_F])
                E[_G_S] += w[1] * (lg - E[_G_S])
            L["g"] = step
        if fin(h):
            seen.add(C.ENTROPY)
            last = L["h"]
            if last != last:
                E[_H_F] = E[_H_S] = h
                E[_H_D] = 0.0
            else:
                w = w_row if last == prev else self._weights(step - last)
                E[_H_D] += w[1] * (abs(h - E[_H_F]) - E[_H_D])
                E[_H_F] += w[0] * (h - E[_H_F])
                E[_H_S] += w[1] * (h - E[_H_S])
            L["h"] = step
        if fin(kl) and kl >= 0.0:
            seen.add(C.KL)
            last = L["kl"]
            if last != last:
                E[_KL_F] = E[_KL_S] = kl
            else:
                w = w_row if last == prev else self._weights(step - last)
                E[_KL_F] += w[0] * (kl - E[_KL_F])
                E[_KL_S] += w[1] * (kl - E[_KL_S])
            L["kl"] = step
        if fin(ln):
            seen.add(C.COMPLETION_LENGTH)
            last = L["len"]
            if last != last:
                E[_LEN_F] = ln
            else:
                E[_LEN_F] += (w_row if last == prev else self._weights(step - last))[0] * (
                    ln - E[_LEN_F]
                )
            L["len"] = step
        if fin(tr):
            seen.add(C.FRAC_TRUNCATED)
            last = L["tr"]
            if last != last:
                E[_TR_F] = tr
            else:
                E[_TR_F] += (w_row if last == prev else self._weights(step - last))[0] * (
                    tr - E[_TR_F]
                )
            L["tr"] = step
            self._trunc_rows = self._trunc_rows + 1 if E[_TR_F] >= cfg.truncation_frac else 0
        if fin(nc):
            seen.add(C.N_CORRECT)
        if fin(lr):
            seen.add(C.LEARNING_RATE)
        if fin(zstd):
            seen.add(C.FRAC_ZERO_STD_GROUPS)
        if fin(rstd):
            seen.add(C.REWARD_STD)

        warm = step - self._first_step >= cfg.warmup_steps and self._n_rows >= cfg.warmup_rows
        if not warm:
            # early levels (entropy collapse, length blow-up): mean over the warm-up rows
            k = self._early_n
            if fin(h):
                he = self._h_early
                self._h_early = h if he != he else he + (h - he) / (k + 1)
            if fin(ln):
                le = self._len_early
                self._len_early = ln if le != le else le + (ln - le) / (k + 1)
            self._early_n = k + 1

        # --- non-LLD failures ---------------------------------------------------------------------
        istep = int(step)
        if bad_loss or self._grad_bad >= cfg.nonfinite_grad_rows:
            if not self._fired["nonfinite"]:
                self._fired["nonfinite"] = True
                alerts.append(self._nonfinite_alert(istep, loss, g, bad_loss, bad_grad))
        elif not bad_grad:
            self._fired["nonfinite"] = False
        # single-row spikes (every finite value enters the window; named only when warm)
        if fin(kl):
            hit = self._spikes[C.KL].push(kl, warm)
            if hit is not None:
                alerts.append(self._spike_alert(istep, C.KL, kl, *hit))
        if fin(g):
            hit = self._spikes[C.GRAD_NORM].push(g, warm)
            if hit is not None:
                alerts.append(self._spike_alert(istep, C.GRAD_NORM, g, *hit))
        if warm:
            ks = E[_KL_S]
            if ks == ks and not ks >= self._kl_ref:
                self._kl_ref = ks
            self._failures(step, istep, zstd, rstd, alerts)

        # --- LLD phase conditions ---------------------------------------------------------
        rank = tr = 0
        if warm:
            rank = self._rank(step)  # 3 when a collapse is seen, else 0
            if C.LOGP_CORRECT in seen:
                tr = self._trend_rank  # 1 / 2: confirmed by a trend level

        # --- phase machine: escalate after persistence, de-escalate after recover_steps --------
        cur = _RANK[self._phase]
        target = cur
        since = self._since
        for r, key, need, level in (
            (1, "r1", 0, tr),  # trend ranks are confirmed by their own level (trend_persist)
            (2, "r2", 0, tr),
            (3, "r3", cfg.collapse_persist_steps, rank),
        ):
            if level >= r:
                s = since[key]
                if s != s:
                    since[key] = s = step
                if step - s >= need and r > target:
                    target = r
            else:
                since[key] = _NAN
        if target > cur:
            new = _BY_RANK[target]
            alerts.append(self._phase_alert(istep, new, self._evidence()))
            self._phase = new
            since["below"] = _NAN
            # a trend phase is left after three windows of the scale that saw it without
            # support (a decline that becomes sure only later must not pass through healthy)
            lvl = self._trend_level if target < 3 else -1
            self._recover = max(
                float(cfg.recover_steps), 3.0 * self._lp_ms.window_steps(lvl) if lvl >= 0 else 0.0
            )
        elif max(rank, tr) < cur and not (cur == 3 and self._reward_still_fallen()):
            rank = max(rank, tr)
            s = since["below"]
            if s != s:
                since["below"] = step
                self._below_rank = rank
            else:
                self._below_rank = max(self._below_rank, rank)
                if step - s >= self._recover:
                    old = self._phase
                    self._phase = _BY_RANK.get(self._below_rank, self._base_phase())
                    since["below"] = _NAN
                    alerts.append(
                        Alert(
                            istep,
                            "phase",
                            "info",
                            f"phase {old} -> {self._phase} at step {istep}: the {old} conditions "
                            f"have not held for {step - s:.0f} steps",
                            {"phase_from": old, "phase_to": self._phase},
                        )
                    )
        else:
            since["below"] = _NAN
        if cur == 0 and warm and target == 0:
            self._phase = self._base_phase()
        return alerts

    def _reward_still_fallen(self) -> bool:
        """True while the reward (fast EMA) stays below half its peak (the collapse-step rule):
        a collapsed run whose reward never came back is not healthy once its signals go quiet."""
        fall = self._ratios()[3]
        return fall == fall and fall >= 0.5

    def _ratios(self) -> tuple[float, float, float, float]:
        """(grad fast/slow, entropy fast/slow, KL fast/slow, reward fall from its peak as a
        share of max(|peak|, peak - trough)); a ratio whose move is within ``noise_k`` times
        the noise of its fast EMA is reported as 1 (fall 0): noisy logs must not fire."""
        E = self._ema
        k = self.config.noise_k
        a = self._w_fast
        # sd of a fast EMA of white noise = sd * sqrt(a / (2 - a)); sd ~ 1.25 * mean abs dev
        damp = self._damp.get(a)
        if damp is None:
            damp = 1.25 * math.sqrt(a / (2.0 - a)) if a == a and 0.0 < a < 2.0 else 1.25
            if len(self._damp) > 256:
                self._damp.clear()
            self._damp[a] = damp
        gs, hs, ks = E[_G_S], E[_H_S], E[_KL_S]
        g_ratio = _NAN
        if gs == gs:
            up = E[_G_F] - gs
            g_ratio = math.exp(up) if up > k * damp * E[_G_D] else min(1.0, math.exp(up))
        h_ratio = _NAN
        if hs == hs and hs > 0.0:
            up = E[_H_F] - hs
            h_ratio = E[_H_F] / hs if up > k * damp * E[_H_D] else min(1.0, E[_H_F] / hs)
        kl_ratio = E[_KL_F] / ks if ks == ks and ks > 1e-6 else _NAN
        peak, trough = self._rw_peak, self._rw_trough
        fall = _NAN
        if peak == peak:
            scale = max(abs(peak), peak - trough if trough == trough else 0.0)
            drop = peak - E[_RW_F]
            # the peak of a noisy EMA is itself an extreme: over n independent stretches of
            # fast_tau steps it sits about sqrt(2 ln n) noise sd above the level
            if scale > 0.0:
                gate = k * damp * E[_RW_D]
                if drop > gate:  # (the extreme is only needed past the plain gate)
                    n_ind = (self._last_step - self._first_step) / self.config.fast_tau
                    extreme = math.sqrt(2.0 * math.log(n_ind)) if n_ind > 1.0 else 0.0
                    gate += extreme * damp * E[_RW_D]
                fall = drop / scale if drop > gate else 0.0
        return g_ratio, h_ratio, kl_ratio, fall

    def _reward_decline(self) -> TrendFit | None:
        """The finest reward trend with a window of 120 steps or more that falls significantly
        (the trend test of the phases) by at least ``reward_decline_frac`` of its fitted start:
        a slow decline with no explosion, which a warning names (not LLD-specific)."""
        cfg = self.config
        for level in range(2, cfg.trend_levels):
            r = self._rw_ms.fit(level, need_t=2.0)
            if r is None or r.change >= 0.0:
                continue
            if -r.change < cfg.reward_decline_frac * max(abs(r.first), abs(r.last)):
                continue
            if r.t <= -self._t_crit(r):
                return r
        return None

    def _reward_declining(self) -> bool:
        """A significant downward reward trend at some scale (a low, noisy reward that merely
        sits below an early noisy peak is not a fall); re-tested only after a reward bin has
        closed since the last test (the collapse rule asks on every row of a collapse)."""
        if self._rw_declining is None:
            self._rw_declining = False
            for level in range(self.config.trend_levels):
                r = self._rw_ms.fit(level, need_t=2.0)
                if r is not None and r.t <= -self._t_crit(r):
                    self._rw_declining = True
                    break
        return self._rw_declining

    def _t_crit(self, f: TrendFit) -> float:
        """Critical t of a level's test, stricter the more windows of that level the run has
        already had: a long run gives a short window many chances to look like a trend
        (level ``trend_alpha`` * (window / elapsed steps) ** ``trend_alpha_decay``)."""
        elapsed = self._last_step - self._first_step
        w = self._lp_ms.window_steps(f.level)
        a = self.config.trend_alpha * min(1.0, w / elapsed) ** self.config.trend_alpha_decay
        return t_critical(int(f.df * 10), max(1, round(a * 1e6)))

    def _level_rank(self, level: int) -> int:
        """What one trend level says now: 0 nothing, 1 stagnation, 2 decay."""
        cfg = self.config
        # cheap pre-checks (ends of the window) before the fits: most windows show no move
        lp_move = self._lp_ms.end_change(level)
        f = None
        if lp_move <= -0.5 * cfg.decay_min_drop:
            f = self._lp_ms.fit(level, need_t=2.0)  # None: no decline or rise of note
        if f is not None and -f.change >= cfg.decay_min_drop and f.t <= -self._t_crit(f):
            # declining steadily over the window, still going down, while the reward holds
            # (Phase II); with the reward fallen it is a dip or already the collapse
            if not self._lp_ms.late_slope(level) < 0.0:
                return 0
            return 0 if self._ratios()[3] >= cfg.reward_fall_frac else 2
        rw_move = self._rw_ms.end_change(level)
        if not (rw_move > 0.0 and abs(lp_move) <= 2.0 * cfg.flat_tol):
            return 0
        r = self._rw_ms.fit(level, need_t=2.0)
        if r is None or not (r.t >= self._t_crit(r)):
            return 0  # stagnation needs the reward rising at this scale
        rise = r.last - r.first
        if rise < cfg.reward_min_rise * max(abs(r.first), abs(r.last), 1e-12):
            return 0
        f = self._lp_ms.fit(level)
        if f is None or abs(f.change) > cfg.flat_tol or f.se_change > cfg.flat_tol:
            return 0  # not flat, or flatness not established at this noise
        if f.t >= 0.0:
            return 0  # any sign of a rise: in learning runs logp_correct rises with the reward
        if self._ratios()[3] > cfg.reward_fall_frac / 3:
            return 0  # recovering from a dip is not learning
        return 1

    def _trend_levels(self, step: float, closed: list[int]) -> None:
        """Re-test the levels whose bins just closed and update the confirmed trend rank.

        A level's condition is confirmed when it has held at ``trend_persist - 1`` (at least 2)
        consecutive tests (each test adds one closed bin: at least two new bins beyond the first
        test's window) spanning at least ``trend_persist - 1`` of its bins in steps. Dense logs
        need both: ``trend_persist`` tests. A sparse log (or a rollout batch repeated over more
        rows than a bin holds) closes one bin of one observation per test, so the count of tests,
        not the steps, says how much new data confirmed the condition (two tests, one new
        observation of ten, were enough before, and raised most false alarms of sparse logs).
        """
        need = self.config.trend_persist
        tests = max(need - 1, 2)
        h1, h2, s1, s2 = self._hold1, self._hold2, self._since1, self._since2
        changed = False
        for level in closed:
            r = self._level_rank(level)
            span = (need - 1) * self._lp_ms.base_steps * 2.0**level
            before = self._conf[level]
            if r >= 1:
                if h1[level] == 0:
                    s1[level] = step
                h1[level] += 1
            else:
                h1[level] = 0
            if r >= 2:
                if h2[level] == 0:
                    s2[level] = step
                h2[level] += 1
            else:
                h2[level] = 0
            self._conf[level] = (
                2
                if h2[level] >= tests and step - s2[level] >= span
                else (1 if h1[level] >= tests and step - s1[level] >= span else 0)
            )
            changed |= before != self._conf[level]
        if changed:
            self._trend_rank, self._trend_level = self._confirmed_trend()

    def _confirmed_trend(self) -> tuple[int, int]:
        """(rank, level) of the most severe confirmed level; among equals the finest (the
        earliest to see it); level -1 with rank 0."""
        best, lvl = 0, -1
        for j, r in enumerate(self._conf):
            if r > best:
                best, lvl = r, j
        return best, lvl

    def _rank(self, step: float) -> int:
        """3 when the current windows show a collapse, else 0 (trends: ``_trend_rank``)."""
        cfg = self.config
        E = self._ema
        # KL is reported, not used: it grows from 0 by design early in every run.
        # The ratios of _ratios() only count past their thresholds; the cheap necessary
        # conditions come first, so a quiet row never computes the noise gates.
        gs, hs, peak = E[_G_S], E[_H_S], self._rw_peak
        maybe = (
            (gs == gs and E[_G_F] - gs >= self._log_surge)
            or (hs == hs and hs > 0.0 and E[_H_F] >= cfg.entropy_rise_ratio * hs)
            or (peak == peak and peak - E[_RW_F] >= cfg.reward_fall_frac * abs(peak))
        )
        fall = 0.0
        n_corro = 0
        if maybe:
            g_ratio, h_ratio, _, fall = self._ratios()
            n_corro = (
                (g_ratio >= cfg.grad_surge_ratio)
                + (h_ratio >= cfg.entropy_rise_ratio)
                + (fall >= cfg.reward_fall_frac)
            )
        fd_high = E[_FD_F] >= cfg.displaced_frac
        if n_corro + fd_high == 0:
            return 0  # (the fits below are only needed with a corroborating signal)
        lp1 = self._lp_ms.fit(1) if C.LOGP_CORRECT in self._seen else None  # ~60-step window
        if lp1 is not None and lp1.slope < 0.0:
            if len(self._lp_short.buf) >= cfg.min_short_rows:
                _, st, _, s0, s1 = self._lp_short.fit()
                # sharp: t, at least collapse_drop, and noise_k standard errors of a fitted
                # change over these n points (equally spaced: sd * sqrt(12 (n-1) / (n (n+1))))
                n = len(self._lp_short.buf)
                se = self._lp_ms.noise_sd * math.sqrt(12.0 * (n - 1) / (n * (n + 1)))
                if st <= -cfg.trend_t and (s0 - s1) >= max(cfg.collapse_drop, cfg.noise_k * se):
                    return 3  # a sharp drop with a corroborating signal
        if n_corro >= 2:
            rw1 = self._rw_ms.fit(1)
            rt, r0, r1 = (rw1.t, rw1.first, rw1.last) if rw1 is not None else (_NAN,) * 3
            # rising to new highs (a recovery from a dip is not learning)
            reward_rising = (
                rt >= cfg.trend_t
                and not fall > cfg.reward_fall_frac / 3
                and (r1 - r0) >= cfg.reward_min_rise * max(abs(r0), abs(r1), 1e-12)
            )
            if not reward_rising and self._reward_declining():
                return 3  # collapse visible in the standard metrics alone
        return 0

    def _evidence(self) -> dict[str, Any]:
        """The numbers behind the current windows (computed only when an alert fires)."""
        cfg = self.config
        g_ratio, h_ratio, kl_ratio, fall = self._ratios()
        rw1 = self._rw_ms.fit(1)
        rt, r0, r1 = (rw1.t, rw1.first, rw1.last) if rw1 is not None else (_NAN,) * 3
        E = self._ema
        ev: dict[str, Any] = {
            "reward_start": r0,
            "reward_end": r1,
            "reward_t": rt,
            "reward_peak": self._rw_peak,
            "reward_fall_frac": fall,
            "grad_ratio": g_ratio,
            "entropy_ratio": h_ratio,
            "kl_ratio": kl_ratio,
            "frac_displaced": E[_FD_F],
            "frac_displaced_window": E[_FD_S],
            "delta_correct_window": E[_DC_S],
            "grad_surge": g_ratio >= cfg.grad_surge_ratio,
            "entropy_rise": h_ratio >= cfg.entropy_rise_ratio,
            "reward_fall": fall >= cfg.reward_fall_frac,
        }
        lp1 = self._lp_ms.fit(1) if C.LOGP_CORRECT in self._seen else None
        if lp1 is not None and len(self._lp_short.buf) >= 3:
            slope, t, span, l0, l1 = lp1.slope, lp1.t, lp1.span, lp1.first, lp1.last
            _, _, sspan, s0, s1 = self._lp_short.fit()
            ev.update(
                logp_change=l1 - l0,
                logp_slope=slope,
                logp_t=t,
                window_steps=span,
                logp_start=l0,
                logp_end=l1,
                short_drop=s0 - s1,
                short_steps=sspan,
            )
        lvl = self._trend_level
        f = self._lp_ms.fit(lvl) if lvl >= 0 else None
        r = self._rw_ms.fit(lvl) if lvl >= 0 else None
        if f is not None:  # the trend level behind a stagnation / decay rank
            ev.update(
                logp_change=f.change,
                logp_slope=f.slope,
                logp_t=f.t,
                logp_t_crit=self._t_crit(f),
                logp_se_change=f.se_change,
                window_steps=f.span,
                window_start=f.start,
                trend_level=f.level,
                trend_bins=f.n_bins,
                logp_start=f.first,
                logp_end=f.last,
            )
            if r is not None:
                ev.update(reward_start=r.first, reward_end=r.last, reward_t=r.t)
        return ev

    def _base_phase(self) -> str:
        """``healthy`` when the LLD signal is there to say so, else ``unknown``."""
        return "healthy" if C.LOGP_CORRECT in self._seen else "unknown"

    def _nonfinite_alert(
        self, step: int, loss: float, g: float, bad_loss: bool, bad_grad: bool
    ) -> Alert:
        what = []
        if bad_loss:
            what.append(f"loss={loss}")
        if bad_grad:
            what.append(f"grad_norm={g} ({self._grad_bad} rows in a row)")
        return Alert(
            step,
            "nonfinite",
            "critical",
            f"non-finite training values at step {step}: {', '.join(what)}; this is a numerical "
            "failure (e.g. learning rate, precision, a bad batch), not a sign of LLD",
            {"loss": _enc(loss), "grad_norm": _enc(g), "rows": self._grad_bad},
        )

    def _failures(
        self, step: float, istep: int, zstd: float, rstd: float, alerts: list[Alert]
    ) -> None:
        """Dead signal, entropy collapse, length blow-up, reward decline, KL blow-up and
        truncation; each fires once per episode and re-arms after its condition has been clear
        for ``failure_persist_steps``."""
        cfg = self.config
        he, hf = self._h_early, self._ema[_H_F]
        le, lf = self._len_early, self._ema[_LEN_F]
        kl_ref = max(self._kl_ref, cfg.kl_floor) if self._kl_ref == self._kl_ref else _NAN
        conds = (
            (zstd >= cfg.dead_zero_std) or (rstd <= cfg.dead_reward_std),
            he > 0.0 and hf <= cfg.entropy_floor_frac * he,
            le > 0.0 and lf >= cfg.length_blowup_ratio * le,
            self._phase != "collapse" and self._rw_decline is not None,
            self._ema[_KL_F] >= cfg.kl_blowup_ratio * kl_ref,
            self._ema[_TR_F] >= cfg.truncation_frac,
        )
        # truncation also needs several logged rows (one or two batches of a sparse log are not
        # enough, however many steps apart)
        few = self._trunc_rows < cfg.truncation_min_rows
        since, fired, need = self._since, self._fired, cfg.failure_persist_steps
        for kind, cond in zip(_FAILURES, conds):
            off_key = kind + "_off"
            if cond:
                since[off_key] = _NAN
                s = since[kind]
                if s != s:
                    since[kind] = s = step
                held = step - s
                if held >= need and not fired[kind] and not (few and kind == "truncation"):
                    fired[kind] = True
                    alerts.append(self._failure_alert(kind, istep, held, zstd, rstd))
            else:
                since[kind] = _NAN
                if fired[kind]:  # re-arm once the condition has been clear long enough
                    s = since[off_key]
                    if s != s:
                        since[off_key] = s = step
                    if step - s >= need:
                        fired[kind] = False

    def _spike_alert(
        self, step: int, col: str, x: float, median: float, mad: float, base: float, n: int
    ) -> Alert:
        name = "KL to the reference" if col == C.KL else "grad norm"
        msad = f"{(x - median) / (1.4826 * mad):.0f} MADs above it" if mad > 0 else "MAD 0"
        msg = (
            f"single-row spike of {name} at step {step}: {_fmt(x)} is x{x / base:.0f} its "
            f"baseline {_fmt(base)} (median of the last {n} logged values {_fmt(median)}, "
            f"{msad}); one row, not a trend: look at that batch (an outlier sample, a "
            "numerical blip); not specific to LLD"
        )
        ev = {
            "signal": col,
            "value": _enc(x),
            "median": _enc(median),
            "mad": _enc(mad),
            "baseline": _enc(base),
            "window_rows": n,
        }
        return Alert(step, "spike", "info", msg, ev)

    def _displacement_alert(self, step: int, test: _DisplacedShare) -> Alert:
        """The paper's ">50% of correct responses displaced" indicator, with its counts."""
        ev = test.evidence()
        probes = ", ".join(
            f"{k:.0f} of {n:.0f} at step {s}" for s, k, n in ev["displaced_probes"][-3:]
        )
        if test is self._inbatch:
            where = (
                f"measured inside the reused rollout batches, before their last update; "
                f"recent rows: {probes}"
            )
        else:
            share = 100 * ev["displaced_share"]
            where = f"{share:.0f}% in the latest probe; recent probes: {probes}"
        msg = (
            f"LLD indicator at step {step}: the updates lowered the likelihood of most correct "
            f"responses ({where}; pooled {100 * ev['displaced_pooled_share']:.0f}% of "
            f"{ev['displaced_pooled_n']:.0f}, z={ev['displaced_z']:.1f} "
            f"against {100 * self.config.displaced_frac:.0f}%), the paper's >50% sign of lazy "
            "likelihood displacement"
        )
        evidence = {k: (_enc(v) if isinstance(v, float) else v) for k, v in ev.items()}
        evidence["displaced_source"] = "in_batch" if test is self._inbatch else "probe"
        return Alert(step, "displacement", "warning", msg, evidence)

    def _failure_alert(self, kind: str, step: int, held: float, zstd: float, rstd: float) -> Alert:
        he, hf = self._h_early, self._ema[_H_F]
        le, lf = self._len_early, self._ema[_LEN_F]
        if kind == "dead_signal":
            msg = (
                f"every group gets the same reward (frac_zero_std_groups={_fmt(zstd)}, "
                f"reward_std={_fmt(rstd)}): GRPO advantages are zero, no learning signal"
            )
            ev = {"frac_zero_std_groups": _enc(zstd), "reward_std": _enc(rstd)}
        elif kind == "entropy_collapse":
            msg = (
                f"entropy {_fmt(hf)} is {100 * hf / he:.1f}% of its early level {_fmt(he)}: "
                "the policy has become (near) deterministic"
            )
            ev = {"entropy": _enc(hf), "entropy_early": _enc(he)}
        elif kind == "length_blowup":
            msg = f"completion length {_fmt(lf)} is x{lf / le:.1f} its early level {_fmt(le)}"
            ev = {"completion_length": _enc(lf), "completion_length_early": _enc(le)}
        elif kind == "reward_decline":
            r = self._rw_decline
            r0, r1, t, span = (r.first, r.last, r.t, r.span) if r else (_NAN,) * 4
            msg = (
                f"reward declining: {_fmt(r0)} -> {_fmt(r1)} ({_fmt(100 * (r1 - r0) / abs(r0))}%) "
                f"over {span:.0f} steps, t={t:.1f}, with no collapse seen"
            )
            ev = {
                "reward_start": _enc(r0),
                "reward_end": _enc(r1),
                "reward_t": _enc(t),
                "window_steps": _enc(span),
            }
            return Alert(
                step, kind, "warning", f"{msg} (for {held:.0f} steps); not specific to LLD", ev
            )
        elif kind == "truncation":
            tf = self._ema[_TR_F]
            msg = (
                f"{100 * tf:.0f}% of completions cut at the length cap (frac_truncated, recent "
                f"mean; {self._trunc_rows} logged rows at >= "
                f"{100 * self.config.truncation_frac:.0f}%): most rewards score unfinished "
                "answers; raise the completion length cap (TRL max_completion_length) or make "
                "the task's answers shorter"
            )
            ev = {"frac_truncated": _enc(tf), "rows": self._trunc_rows}
            return Alert(
                step, kind, "warning", f"{msg} (for {held:.0f} steps); not specific to LLD", ev
            )
        else:
            kl, ref = self._ema[_KL_F], max(self._kl_ref, self.config.kl_floor)
            msg = f"KL to the reference {_fmt(kl)} is x{kl / ref:.0f} its settled level {_fmt(ref)}"
            ev = {"kl": _enc(kl), "kl_settled": _enc(ref)}
            return Alert(
                step, kind, "warning", f"{msg} (for {held:.0f} steps); not specific to LLD", ev
            )
        return Alert(step, kind, "warning", f"{msg} (for {held:.0f} steps); not a sign of LLD", ev)

    def _phase_alert(self, step: int, phase: str, ev: dict[str, Any]) -> Alert:
        """The alert announcing entry into ``phase``, with its evidence in words and numbers."""
        evidence = {k: (_enc(v) if isinstance(v, float) else v) for k, v in ev.items()}
        evidence["phase_from"] = self._phase
        evidence["phase_to"] = phase
        parts: list[str] = []
        lp = "logp_change" in ev
        fdw = ev.get("frac_displaced_window", _NAN)
        reward_txt = (
            f"reward {ev['reward_start']:.3f} -> {ev['reward_end']:.3f}"
            if math.isfinite(ev.get("reward_start", _NAN))
            else "no reward trend"
        )
        if phase == "stagnation":
            parts.append(
                f"logp of correct responses flat (change {ev['logp_change']:+.4f} nats/token, "
                f"slope {ev['logp_slope']:+.5f}/step over {ev['window_steps']:.0f} steps) while "
                f"{reward_txt.replace('reward', 'reward rose', 1)}"
            )
        elif phase == "decay":
            parts.append(
                f"logp of correct responses declining steadily ({ev['logp_change']:+.4f} "
                f"nats/token, slope {ev['logp_slope']:+.5f}/step, t={ev['logp_t']:.1f}, over "
                f"{ev['window_steps']:.0f} steps) while {reward_txt}; grad norm "
                f"x{_fmt(ev['grad_ratio'])} of its baseline"
            )
        else:
            if lp and math.isfinite(ev.get("short_drop", _NAN)) and ev["short_drop"] > 0:
                parts.append(
                    f"logp of correct responses dropped {ev['short_drop']:.4f} nats/token in "
                    f"{ev['short_steps']:.0f} steps"
                )
            elif not lp:
                parts.append("collapse seen in standard metrics (no LLD columns)")
            # every corroborating signal with its value; those past their threshold first
            hits, others = [], []
            for flag, text in (
                ("grad_surge", f"grad norm x{_fmt(ev['grad_ratio'])} of its baseline"),
                ("entropy_rise", f"entropy x{_fmt(ev['entropy_ratio'])} of its baseline"),
                (
                    "reward_fall",
                    f"reward {100 * ev['reward_fall_frac']:.0f}% below its peak "
                    f"{ev['reward_peak']:.3f}"
                    if math.isfinite(ev.get("reward_fall_frac", _NAN))
                    else "",
                ),
            ):
                if ev.get(flag):
                    hits.append(text)
                elif text and "n/a" not in text:
                    others.append(text)
            parts.extend(hits)
            if others:
                parts.append("not (yet) past threshold: " + ", ".join(others))
        if math.isfinite(fdw):
            parts.append(f"{100 * fdw:.0f}% of correct responses displaced (recent mean)")
        dcw = ev.get("delta_correct_window", _NAN)
        if phase != "collapse" and math.isfinite(dcw):
            parts.append(f"mean change of correct responses {dcw:+.3f} nats")
        severity = "critical" if phase == "collapse" else "warning"
        title = {"stagnation": "Phase I (stagnation)", "decay": "Phase II (steady decay)"}.get(
            phase, "Phase III (accelerated collapse)"
        )
        return Alert(
            step, phase, severity, f"{title} at step {step}: " + "; ".join(parts), evidence
        )


def _fmt(v: float) -> str:
    if v != v:
        return "n/a"
    return f"{v:.3g}"
