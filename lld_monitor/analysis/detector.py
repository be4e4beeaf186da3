"""The online phase detector: one row at a time, O(1) amortized, same alerts live and on replay.

Phases (PAPER.md, "The death spiral"): ``stagnation`` = likelihood of correct responses flat while
the reward rises; ``decay`` = that likelihood declines steadily; ``collapse`` = sharp drop with a
grad-norm surge, entropy rise, reward fall (and most correct responses displaced). Without the LLD
columns only ``collapse`` can be seen (from standard metrics); stagnation and decay cannot, and the
phase stays ``unknown`` until then. Non-LLD failures raise their own kinds.

All windows are in *steps* (the ``step`` column), never in rows, so sparse logging works; a trend
window always keeps at least ``min_window_rows`` rows.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from lld_monitor import columns as C
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
)
#: Columns whose absence rules out the LLD phases (stagnation, decay).
LLD_REQUIRED: tuple[str, ...] = (C.LOGP_CORRECT,)


@dataclass(frozen=True)
class DetectorConfig:
    """Hyperparameters of ``PhaseDetector`` (steps are optimizer steps, not rows)."""

    warmup_steps: int = 20  # no alert before this many steps after the first row
    warmup_rows: int = 5  # ... nor before this many rows
    window_steps: int = 40  # trend window (stagnation, decay)
    min_window_rows: int = 8  # a trend window keeps at least this many rows (sparse logs)
    short_steps: int = 10  # window of a sharp drop (collapse)
    min_short_rows: int = 3
    persist_steps: int = 15  # stagnation / decay must hold this long before firing
    collapse_persist_steps: int = 6  # collapse must hold this long
    recover_steps: int = 40  # an LLD phase is left after its conditions cleared this long
    trend_t: float = 3.0  # |t| of an OLS slope that counts as a trend
    reward_min_rise: float = 0.05  # relative reward rise over the window for "reward rises"
    flat_tol: float = 0.02  # nats/token: logp_correct change over the window counted as flat
    decay_min_drop: float = 0.025  # nats/token: minimum logp_correct drop over the window
    collapse_drop: float = 0.05  # nats/token: logp_correct drop over short_steps that is sharp
    displaced_frac: float = 0.5  # share of correct responses displaced (paper's > 50%)
    grad_surge_ratio: float = 2.0  # fast / slow grad norm (geometric EMAs)
    entropy_rise_ratio: float = 1.15  # fast / slow entropy
    kl_surge_ratio: float = 3.0  # fast / slow KL
    reward_fall_frac: float = 0.15  # reward EMA below its peak by this share of the peak
    fast_tau: float = 5.0  # steps, time constant of the fast EMAs
    slow_tau: float = 50.0  # steps, time constant of the baselines
    nonfinite_grad_rows: int = 3  # consecutive non-finite grad norms before "nonfinite"
    dead_zero_std: float = 0.95  # frac_zero_std_groups at or above = dead signal
    dead_reward_std: float = 1e-6  # reward_std at or below = dead signal
    failure_persist_steps: int = 10  # dead_signal / entropy_collapse / length_blowup persistence
    entropy_floor_frac: float = 0.1  # entropy below this share of its early level = collapse
    length_blowup_ratio: float = 3.0  # completion length above this multiple of its early level

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"DetectorConfig.{f.name} must be a positive number, got {v!r}")
        if self.short_steps > self.window_steps:
            raise ValueError("DetectorConfig.short_steps must not exceed window_steps")


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
        while len(buf) > self.min_rows and buf[0][0] <= lim:
            ox, oy = buf.popleft()
            dx = ox - s[0]
            s[1] -= 1.0
            s[2] -= dx
            s[3] -= oy
            s[4] -= dx * dx
            s[5] -= dx * oy
            s[6] -= oy * oy
        self.n_since += 1
        if self.n_since >= max(len(buf), 16):
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
        return {"buf": [list(p) for p in self.buf], "s": list(self.s), "n_since": self.n_since}

    def load(self, d: Mapping[str, Any]) -> None:
        self.buf = deque((float(x), float(y)) for x, y in d["buf"])
        self.s = [float(v) for v in d["s"]]
        self.n_since = int(d["n_since"])


class _EMA:
    """Exponential moving average in step time: weight ``1 - exp(-dt / tau)`` on a new value."""

    __slots__ = ("last", "tau", "value")

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self.value = _NAN
        self.last = _NAN

    def push(self, x: float, y: float) -> float:
        if self.value != self.value:
            self.value = y
        else:
            a = 1.0 - math.exp(-(x - self.last) / self.tau)
            self.value += a * (y - self.value)
        self.last = x
        return self.value

    def state(self) -> list[float | None]:
        return [_enc(self.value), _enc(self.last)]

    def load(self, d: list[float | None]) -> None:
        self.value, self.last = _dec(d[0]), _dec(d[1])


def _enc(v: float) -> float | None:
    return None if v != v else v


def _dec(v: float | None) -> float:
    return _NAN if v is None else float(v)


def _f(v: Any) -> float:
    """A row value as a float; NaN when missing or not a number."""
    if v is None:
        return _NAN
    try:
        return float(v)
    except (TypeError, ValueError):
        return _NAN


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
        self._phase = "unknown"
        self._seen: set[str] = set()
        self._lp_win = _RollingOLS(cfg.window_steps, cfg.min_window_rows)
        self._lp_half = _RollingOLS(cfg.window_steps / 2, max(3, cfg.min_window_rows // 2))
        self._lp_short = _RollingOLS(cfg.short_steps, cfg.min_short_rows)
        self._rw_win = _RollingOLS(cfg.window_steps, cfg.min_window_rows)
        self._rw_fast = _EMA(cfg.fast_tau)
        self._rw_peak = _NAN
        self._fd_fast = _EMA(cfg.fast_tau)
        self._fd_slow = _EMA(cfg.window_steps / 2)
        self._dc_slow = _EMA(cfg.window_steps / 2)
        self._g_fast = _EMA(cfg.fast_tau)  # log grad norm
        self._g_slow = _EMA(cfg.slow_tau)
        self._h_fast = _EMA(cfg.fast_tau)
        self._h_slow = _EMA(cfg.slow_tau)
        self._kl_fast = _EMA(cfg.fast_tau)
        self._kl_slow = _EMA(cfg.slow_tau)
        self._len_fast = _EMA(cfg.fast_tau)
        self._h_early = _NAN  # entropy level at the end of warm-up
        self._len_early = _NAN
        self._early_n = 0  # rows averaged into the early levels
        self._grad_bad = 0  # consecutive non-finite grad norms
        # streaks: first step of the current run of rows where the condition held (NaN = not)
        self._since: dict[str, float] = {
            k: _NAN
            for k in (
                "r1",
                "r2",
                "r3",
                "below",
                "nonfinite",
                "dead_signal",
                "entropy_collapse",
                "length_blowup",
            )
        }
        self._below_rank = 0
        self._fired: dict[str, bool] = {
            k: False for k in ("nonfinite", "dead_signal", "entropy_collapse", "length_blowup")
        }

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
        step = row.get(C.STEP)
        if step is None or _f(step) != _f(step):
            raise ValueError(f"a row needs a numeric {C.STEP!r} value, got {step!r}")
        return self._update(float(step), tuple(_f(row.get(c)) for c in INPUT_COLUMNS))

    def state_dict(self) -> dict[str, Any]:
        """The full running state as plain JSON (no NaN: encoded as null)."""
        ols = ("_lp_win", "_lp_half", "_lp_short", "_rw_win")
        emas = (
            "_rw_fast",
            "_fd_fast",
            "_fd_slow",
            "_dc_slow",
            "_g_fast",
            "_g_slow",
            "_h_fast",
            "_h_slow",
            "_kl_fast",
            "_kl_slow",
            "_len_fast",
        )
        return {
            "version": 1,
            "params": asdict(self.config),
            "n_rows": self._n_rows,
            "first_step": _enc(self._first_step),
            "last_step": _enc(self._last_step),
            "phase": self._phase,
            "seen": sorted(self._seen),
            "ols": {k: getattr(self, k).state() for k in ols},
            "ema": {k: getattr(self, k).state() for k in emas},
            "rw_peak": _enc(self._rw_peak),
            "h_early": _enc(self._h_early),
            "len_early": _enc(self._len_early),
            "early_n": self._early_n,
            "grad_bad": self._grad_bad,
            "since": {k: _enc(v) for k, v in self._since.items()},
            "below_rank": self._below_rank,
            "fired": dict(self._fired),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``; the hyperparameters must be the ones it was saved with."""
        if state.get("version") != 1:
            raise ValueError(f"unsupported PhaseDetector state version {state.get('version')!r}")
        if dict(state["params"]) != asdict(self.config):
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
        for k, v in state["ema"].items():
            getattr(self, k).load(v)
        self._rw_peak = _dec(state["rw_peak"])
        self._h_early = _dec(state["h_early"])
        self._len_early = _dec(state["len_early"])
        self._early_n = int(state["early_n"])
        self._grad_bad = int(state["grad_bad"])
        self._since = {k: _dec(v) for k, v in state["since"].items()}
        self._below_rank = int(state["below_rank"])
        self._fired = {k: bool(v) for k, v in state["fired"].items()}

    # --- the work -----------------------------------------------------------------------------
    def _streak(self, key: str, cond: bool, step: float) -> float:
        """Steps the condition ``key`` has held continuously up to ``step`` (-1 when it fails)."""
        since = self._since
        if not cond:
            since[key] = _NAN
            return -1.0
        s = since[key]
        if s != s:
            since[key] = step
            return 0.0
        return step - s

    def _update(self, step: float, v: tuple[float, ...]) -> list[Alert]:
        """Core update on the value tuple ordered as ``INPUT_COLUMNS``."""
        if step <= self._last_step:
            return []
        cfg = self.config
        rw, lp, fd, dc, g, h, kl, ln, loss, zstd, rstd = v
        seen = self._seen
        if self._first_step != self._first_step:
            self._first_step = step
        self._last_step = step
        self._n_rows += 1
        alerts: list[Alert] = []
        istep = int(step)

        # --- non-finite loss / grad norm (not a missing value: see _nonfinite) ------------
        other_finite = any(math.isfinite(x) for x in (rw, h, kl, ln))
        bad_loss = loss in (math.inf, -math.inf) or (
            loss != loss and C.LOSS in seen and other_finite
        )
        bad_grad = g in (math.inf, -math.inf) or (g != g and C.GRAD_NORM in seen and other_finite)
        self._grad_bad = self._grad_bad + 1 if bad_grad else 0

        # --- feed the statistics -------------------------------------------------------------
        fin = math.isfinite
        if fin(rw):
            seen.add(C.REWARD_MEAN)
            self._rw_win.push(step, rw)
            ef = self._rw_fast.push(step, rw)
            if not ef <= self._rw_peak:
                self._rw_peak = ef
        if fin(lp):
            seen.add(C.LOGP_CORRECT)
            self._lp_win.push(step, lp)
            self._lp_half.push(step, lp)
            self._lp_short.push(step, lp)
        if fin(fd):
            seen.add(C.FRAC_CORRECT_DISPLACED)
            self._fd_fast.push(step, fd)
            self._fd_slow.push(step, fd)
        if fin(dc):
            seen.add(C.DELTA_CORRECT)
            self._dc_slow.push(step, dc)
        if fin(g) and g > 0.0:
            seen.add(C.GRAD_NORM)
            lg = math.log(g)
            self._g_fast.push(step, lg)
            self._g_slow.push(step, lg)
        if fin(h):
            seen.add(C.ENTROPY)
            self._h_fast.push(step, h)
            self._h_slow.push(step, h)
        if fin(kl) and kl >= 0.0:
            seen.add(C.KL)
            self._kl_fast.push(step, kl)
            self._kl_slow.push(step, kl)
        if fin(ln):
            seen.add(C.COMPLETION_LENGTH)
            self._len_fast.push(step, ln)
        if fin(loss):
            seen.add(C.LOSS)
        if fin(zstd):
            seen.add(C.FRAC_ZERO_STD_GROUPS)
        if fin(rstd):
            seen.add(C.REWARD_STD)

        warm = step - self._first_step >= cfg.warmup_steps and self._n_rows >= cfg.warmup_rows
        if not warm:
            # early levels for entropy collapse / length blow-up: mean over the warm-up rows
            k = self._early_n
            if fin(h):
                self._h_early = (
                    h
                    if k == 0 or self._h_early != self._h_early
                    else (self._h_early + (h - self._h_early) / (k + 1))
                )
            if fin(ln):
                self._len_early = (
                    ln
                    if k == 0 or self._len_early != self._len_early
                    else (self._len_early + (ln - self._len_early) / (k + 1))
                )
            self._early_n = k + 1

        # --- non-LLD failures -----------------------------------------------------------------
        if bad_loss or self._grad_bad >= cfg.nonfinite_grad_rows:
            if not self._fired["nonfinite"]:
                self._fired["nonfinite"] = True
                what = []
                if bad_loss:
                    what.append(f"loss={loss}")
                if bad_grad:
                    what.append(f"grad_norm={g} ({self._grad_bad} rows in a row)")
                alerts.append(
                    Alert(
                        istep,
                        "nonfinite",
                        "critical",
                        f"non-finite training values at step {istep}: {', '.join(what)}; "
                        "this is a numerical failure, not a sign of LLD",
                        {"loss": _enc(loss), "grad_norm": _enc(g), "rows": self._grad_bad},
                    )
                )
        elif not bad_grad:
            self._fired["nonfinite"] = False
        if warm:
            alerts.extend(self._failures(step, istep, h, ln, zstd, rstd))

        # --- LLD phase conditions ---------------------------------------------------------------
        ev: dict[str, Any] = {}
        rank = 0
        have_lp = C.LOGP_CORRECT in seen and len(self._lp_win.buf) >= cfg.min_window_rows
        g_ratio = _ratio_log(self._g_fast.value, self._g_slow.value)
        h_ratio = _ratio(self._h_fast.value, self._h_slow.value)
        kl_ratio = _ratio(self._kl_fast.value, self._kl_slow.value)
        peak, rwf = self._rw_peak, self._rw_fast.value
        fall = (peak - rwf) / abs(peak) if peak == peak and peak != 0.0 else _NAN
        corro = {
            "grad_surge": g_ratio >= cfg.grad_surge_ratio,
            "entropy_rise": h_ratio >= cfg.entropy_rise_ratio,
            "kl_surge": kl_ratio >= cfg.kl_surge_ratio and self._kl_slow.value > 1e-6,
            "reward_fall": fall >= cfg.reward_fall_frac,
        }
        fdv = self._fd_fast.value
        if warm:
            n_corro = sum(corro.values())
            _rslope, rt, _rspan, r0, r1 = self._rw_win.fit()
            # rising to new highs (a recovery from a dip is not learning)
            reward_rising = (
                rt >= cfg.trend_t
                and not fall > cfg.reward_fall_frac / 3
                and (r1 - r0) >= cfg.reward_min_rise * max(abs(r0), abs(r1), 1e-12)
            )
            if have_lp:
                slope, t, span, l0, l1 = self._lp_win.fit()
                _hslope, ht, _, _, _ = self._lp_half.fit()
                _sslope, st, sspan, s0, s1 = self._lp_short.fit()
                change = l1 - l0
                se_span = abs(slope / t) * span if t and t == t and math.isfinite(t) else 0.0
                # flat: small change, known to within flat_tol, and no clear upward trend
                flat = (
                    abs(change) <= cfg.flat_tol
                    and change + 2.0 * se_span <= 2 * cfg.flat_tol
                    and (t < cfg.trend_t or change <= cfg.flat_tol / 2)
                )
                declining = t <= -cfg.trend_t and -change >= cfg.decay_min_drop and ht < -1.0
                sharp = (
                    len(self._lp_short.buf) >= cfg.min_short_rows
                    and st <= -cfg.trend_t
                    and (s0 - s1) >= cfg.collapse_drop
                )
                lld_corro = n_corro + (fdv >= cfg.displaced_frac)
                if sharp and lld_corro >= 1:
                    rank = 3
                elif declining:
                    rank = 2
                elif flat and reward_rising:
                    rank = 1
                ev = {
                    "logp_change": change,
                    "logp_slope": slope,
                    "logp_t": t,
                    "window_steps": span,
                    "logp_start": l0,
                    "logp_end": l1,
                    "short_drop": s0 - s1 if s0 == s0 else _NAN,
                    "short_steps": sspan,
                }
            if rank < 3 and n_corro >= 2 and not reward_rising:
                rank = 3  # collapse visible in the standard metrics alone
            ev.update(
                reward_start=r0,
                reward_end=r1,
                reward_t=rt,
                reward_peak=peak,
                reward_fall_frac=fall,
                grad_ratio=g_ratio,
                entropy_ratio=h_ratio,
                kl_ratio=kl_ratio,
                frac_displaced=fdv,
                frac_displaced_window=self._fd_slow.value,
                delta_correct_window=self._dc_slow.value,
                **corro,
            )

        # --- phase machine: escalate after persistence, de-escalate after recover_steps --------
        cur = _RANK[self._phase]
        persist = (0.0, cfg.persist_steps, cfg.persist_steps, cfg.collapse_persist_steps)
        target = cur
        for r in (1, 2, 3):
            if self._streak(f"r{r}", rank >= r, step) >= persist[r] and r > target:
                target = r
        since = self._since
        if target > cur:
            new = _BY_RANK[target]
            alerts.append(self._phase_alert(istep, new, ev))
            self._phase = new
            since["below"] = _NAN
        elif rank < cur:
            s = since["below"]
            if s != s:
                since["below"] = step
                self._below_rank = rank
            else:
                self._below_rank = max(self._below_rank, rank)
                if step - s >= cfg.recover_steps:
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

    def _base_phase(self) -> str:
        """``healthy`` when the LLD signal is there to say so, else ``unknown``."""
        return "healthy" if C.LOGP_CORRECT in self._seen else "unknown"

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
            seen_parts = []
            if ev.get("grad_surge"):
                seen_parts.append(f"grad norm x{_fmt(ev['grad_ratio'])} of its baseline")
            if ev.get("entropy_rise"):
                seen_parts.append(f"entropy x{_fmt(ev['entropy_ratio'])} of its baseline")
            if ev.get("kl_surge"):
                seen_parts.append(f"KL x{_fmt(ev['kl_ratio'])} of its baseline")
            if ev.get("reward_fall"):
                seen_parts.append(
                    f"reward {100 * ev['reward_fall_frac']:.0f}% below its peak "
                    f"{ev['reward_peak']:.3f}"
                )
            parts.extend(seen_parts)
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

    def _failures(
        self, step: float, istep: int, h: float, ln: float, zstd: float, rstd: float
    ) -> list[Alert]:
        """Dead signal, entropy collapse and length blow-up, each once per episode."""
        cfg = self.config
        out: list[Alert] = []
        checks: list[tuple[str, bool, str, dict[str, Any]]] = []
        dead = (zstd == zstd and zstd >= cfg.dead_zero_std) or (
            rstd == rstd and rstd <= cfg.dead_reward_std
        )
        checks.append(
            (
                "dead_signal",
                dead,
                f"every group gets the same reward (frac_zero_std_groups={_fmt(zstd)}, "
                f"reward_std={_fmt(rstd)}): GRPO advantages are zero, no learning signal",
                {"frac_zero_std_groups": _enc(zstd), "reward_std": _enc(rstd)},
            )
        )
        he, hf = self._h_early, self._h_fast.value
        ent_low = he == he and he > 0 and hf == hf and hf <= cfg.entropy_floor_frac * he
        checks.append(
            (
                "entropy_collapse",
                ent_low,
                f"entropy {_fmt(hf)} is {100 * hf / he if he == he and he else 0:.1f}% of its "
                f"early level {_fmt(he)}: the policy has become (near) deterministic",
                {"entropy": _enc(hf), "entropy_early": _enc(he)},
            )
        )
        le, lf = self._len_early, self._len_fast.value
        blow = le == le and le > 0 and lf == lf and lf >= cfg.length_blowup_ratio * le
        checks.append(
            (
                "length_blowup",
                blow,
                f"completion length {_fmt(lf)} is x{lf / le if le == le and le else 0:.1f} its "
                f"early level {_fmt(le)}",
                {"completion_length": _enc(lf), "completion_length_early": _enc(le)},
            )
        )
        for kind, cond, msg, evidence in checks:
            held = self._streak(kind, cond, step)
            if not cond:
                self._fired[kind] = False
            elif held >= cfg.failure_persist_steps and not self._fired[kind]:
                self._fired[kind] = True
                out.append(
                    Alert(
                        istep,
                        kind,
                        "warning",
                        f"{msg} (for {held:.0f} steps); not a sign of LLD",
                        evidence,
                    )
                )
        return out


def _ratio(fast: float, slow: float) -> float:
    return fast / slow if slow == slow and fast == fast and slow > 0 else _NAN


def _ratio_log(fast: float, slow: float) -> float:
    return math.exp(fast - slow) if slow == slow and fast == fast else _NAN


def _fmt(v: float) -> str:
    if v != v:
        return "n/a"
    return f"{v:.3g}"
