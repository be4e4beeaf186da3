"""Collapse as a calibrated change in the reward's level (standard metrics alone); mode collapse.

A collapse in a log without LLD columns is not a trend but a change of level: the reward now sits
near the run's floor, far below the level it held, and stays there. ``LevelShiftCollapse`` tests
that in logged rows (not steps: a 40-row log logged every 5 steps is judged on its 40 rows) with
a sequential test whose false-alarm rate is set, not tuned (``analysis/stats.py``):

- **The statistic.** At every row, for every post-change length L of 2-256 rows (the change point
  n - L), the mean of the L rows since against the mean of the R = 4L (16-256) rows before
  (the pre-change segment: never a maximum over windows), in units of its standard error with
  the noise estimated from the run itself (trimmed sd of consecutive differences; the long-run
  sd of 8-row block means where rows correlate, of 2- or 4-row ones early in a run; the
  larger). The maximum over L is compared with a threshold c set by simulation so that about
  one run in 500 of 3000 rows of such noise crosses it (``p_false_run``); its evidence states
  the false-alarm rate. A big fall crosses within 2 rows; a small one takes about
  c^2 / delta^2 rows. Rows that repeat rollout batches count once a batch, and are not
  tested before 8 batches.
- **Collapsed, not a dip.** The fall counts only when the level since the change, by its mean
  plus ``floor_sd`` standard errors, is near the run's floor: at or below floor + ``floor_frac``
  x (held - floor), the floor being zero or the run's starting level when that is below zero;
  or, for a run that learned at least ``learned_frac`` of its height from its start (its peak
  over the start), back near that start (start + ``start_frac`` x gain); or, having learned at
  least ``below_start_frac``, back at or below its start. The drop is at least ``min_drop``
  (rewards move on a scale of 0.1). A run that starts at its plateau is judged against the
  floor alone.
- **Corroboration** (grad norm surge or death, entropy blow-up or collapse, completions at the
  length cap or down to a few tokens, all-identical groups, on 3 rows in a row: a single-row
  spike is none) lowers the threshold to ``p_false_run_corroborated``; it never replaces the
  reward test.

``ModeCollapse`` is the failure where most groups get identical rewards while the completions
become short: the policy answers every prompt with one short string. It is not LLD, and it is
told apart from a dead signal at the start of a run that never learned by the completion length
falling from its early level.

Both are checks (``checks/base.py``): ``update(signals) -> list[Alert]``, JSON state, ``reset()``;
they read only the row's raw values (attributes named like the columns: ``reward_mean``,
``grad_norm``, ...) and ``step``, so any object with those attributes can drive them. Their
hyperparameters are sections of ``DetectorConfig`` (``level_shift``: ``LevelShiftConfig``,
``mode_collapse``: ``ModeCollapseConfig``), saved and tuned with the rest.
``LevelShiftCollapse`` escalates the phase itself (``immediate``): its persistence is in the
statistic already, and the phase machine's ``collapse_persist_steps`` would cost a sparse log rows.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from lld_monitor import columns as C
from lld_monitor.analysis.checks.base import NO_ALERTS, Check
from lld_monitor.analysis.config import DetectorConfig, LevelShiftConfig, ModeCollapseConfig
from lld_monitor.analysis.stats import (
    GLR_CAL_ROWS,
    GLR_MIN_REF,
    GLR_SHORT_MIN_REF,
    GLR_SHORT_ROWS,
    BlockNoise,
    LevelDrop,
    WindowStats,
    glr_rows_per_false_alarm,
    glr_run_rate,
    glr_threshold,
    trimmed_sd,
)
from lld_monitor.analysis.trend import from_json_float, json_float
from lld_monitor.events import Alert

__all__ = ["LevelShiftCollapse", "LevelShiftConfig", "ModeCollapse", "ModeCollapseConfig"]

_NAN = float("nan")
_enc, _dec = json_float, from_json_float
_NOISE_EVERY_FROM = 64  # rows after which the noise is estimated every 8 rows
_REPEAT_ROWS = 64  # last rows behind the repeated-batch test of the noise estimate
_PEAK_ROWS = 16  # rows per block behind the run's peak level
_NEAR_ROWS = 16  # rows before the change behind the held level that "near the floor" is judged by


def _beyond(v: float, stats: tuple[float, float, float], up: float, down: float) -> int:
    """Where a corroborating value ``v`` stands against its baseline ``stats`` (median, min,
    max of its recent values): 1 at or above ``up`` x the median and above the whole range, -1
    at or below ``down`` x the median and below it, 0 otherwise (or NaN, or a median <= 0)."""
    m, lo, hi = stats
    if v != v or not m > 0.0:
        return 0
    if v >= up * m and v > hi:
        return 1
    return -1 if v <= down * m and v < lo else 0


#: (signal, 1 above / -1 below its baseline) -> the words of a corroborating value ``v`` against
#: its baseline's median ``m`` (``r`` = v / m, ``p`` = 100 v / m)
_CORROBORATES: dict[tuple[str, int], str] = {
    (C.GRAD_NORM, 1): "grad norm {v:.3g} = x{r:.0f} its median {m:.3g}",
    (C.GRAD_NORM, -1): "grad norm {v:.3g}: dead (median before {m:.3g})",
    (C.ENTROPY, 1): "entropy {v:.3g} = x{r:.1f} its median {m:.3g}",
    (C.ENTROPY, -1): "entropy {v:.3g} = {p:.0f}% of its median {m:.3g}",
    (C.COMPLETION_LENGTH, -1): "completion length {v:.3g} tokens (median before {m:.3g})",
}

#: The corroborating signals whose finite values feed their baselines, read from ``Signals`` as
#: attributes named as the columns (``zero_std``: only NaN is left out).
_FINITE_SIGNALS = (C.GRAD_NORM, C.ENTROPY, C.COMPLETION_LENGTH, C.FRAC_TRUNCATED)
_finite_signals = operator.attrgetter(*_FINITE_SIGNALS)


class LevelShiftCollapse(Check):
    """``collapse`` (critical) when the reward's level has changed down, by a calibrated test,
    to near the run's floor; see the module docstring.

    ``rank`` is 3 from the alert while the reward stays down (the phase stays ``collapse``);
    ``pending`` holds the alert of this row for the phase machine, which emits it as the phase
    alert (or merges it into its own when another check escalates on the same row).
    """

    kind = "level_shift"
    kinds = ("collapse",)  # (left in pending: the machine emits it as the phase alert)
    immediate = True  # the phase machine escalates on the alert row, without more persistence
    row_only = True  # (reads the row's raw values, its step and nothing else)
    _SIGNALS = (C.GRAD_NORM, C.ENTROPY, C.COMPLETION_LENGTH, C.FRAC_TRUNCATED, "zero_std")

    def __init__(self, config: DetectorConfig | None = None) -> None:
        config = config or DetectorConfig()
        self.shift = config.level_shift
        self.threshold = glr_threshold(self.shift.p_false_run)
        self.threshold_corroborated = glr_threshold(self.shift.p_false_run_corroborated)
        # a row among the run's first GLR_SHORT_ROWS: the thresholds of a run that long
        self.threshold_short = glr_threshold(self.shift.p_false_short_run, short=True)
        self.threshold_short_corroborated = glr_threshold(
            self.shift.p_false_short_run_corroborated, short=True
        )
        super().__init__(config)

    def reset(self) -> None:
        """Forget every row seen; keep the hyperparameters."""
        cfg = self.shift
        self.rank = 0
        self.pending: Alert | None = None
        self._rows = 0  # rows with a finite reward
        # a short run, known to be one (a replay of a whole table of at most GLR_SHORT_ROWS
        # rewards): its rows are held to the short run's threshold and floor margin
        self._short = False
        self._start_sum = 0.0
        self._last = _NAN  # last reward
        # the change-in-level statistic over the last rewards (their running sums and steps)
        self._level = LevelDrop()
        self._diffs: deque[float] = deque(maxlen=cfg.noise_rows)  # |consecutive differences|
        self._vals: deque[float] = deque(maxlen=_REPEAT_ROWS)  # the last rewards, as logged
        self._blocks = [BlockNoise(int(b), cfg.noise_blocks) for b in cfg.block_rows]
        self._peak = -math.inf  # the best mean of a 16-row block so far ...
        self._peak_blocks = 0  # ... of this many
        self._peak_sum = 0.0
        self._peak_n = 0
        self._sd = _NAN  # cached noise sd of a row (NaN: compute again)
        self._base: dict[str, WindowStats] = {
            k: WindowStats(cfg.baseline_rows) for k in self._SIGNALS
        }
        self._finite_base = tuple(self._base[k] for k in _FINITE_SIGNALS)  # (loaded in place)
        self._corro_rows: deque[bool] = deque(maxlen=3)  # rows with a corroborating signal
        self._fired = False
        self._fallen = False  # the reward is still down after the alert
        self._rearm_line = _NAN  # the level the reward must be back above to re-arm
        self._bound: Any = None  # the replay's per-row bound of the statistic (set_bound)

    # --- the state the phase machine reads ------------------------------------------------------
    @property
    def fired(self) -> bool:
        """True from the alert until the reward is back (re-armed)."""
        return self._fired

    @property
    def still_fallen(self) -> bool:
        """True while the reward stays near its floor after a collapse alert."""
        return self._fallen

    @property
    def start_level(self) -> float:
        n = min(self._rows, self.shift.start_rows)
        return self._start_sum / n if n else _NAN

    @property
    def floor(self) -> float:
        """The run's floor: zero, or its starting level where that is below zero."""
        s = self.start_level
        return min(s, 0.0) if s == s else _NAN

    def noise_sd(self) -> float:
        """The sd of one row's reward as estimated from the run: the trimmed sd of consecutive
        differences (``stats.trimmed_sd``); where the rows repeat rollout batches, the sd of the
        differences between batches x sqrt(rows per batch); the long-run sd from 8-row block
        means (4- or 2-row ones early in the run) where rows correlate (a rollout batch logged on
        several rows, a wandering difficulty); the largest. NaN before ``GLR_MIN_REF``
        differences (of batches, when the rows repeat them)."""
        sd = self._sd
        if sd == sd:
            return sd
        d = self._diffs
        if len(d) < GLR_MIN_REF:
            return _NAN
        sd = trimmed_sd(d)
        rep = self._repeat_factor()
        if rep > 1.0:
            # rows that repeat one rollout batch's value: the noise between batches, and each
            # batch counts once (sd x sqrt(rows per batch)), until the block means say it
            nz = [x for x in d if x > 0.0]
            if len(nz) < GLR_MIN_REF:
                return _NAN  # (fewer than 8 batches: too few observations to test)
            sd = max(sd, trimmed_sd(nz) * math.sqrt(rep))
        for b in reversed(self._blocks):  # the longest blocks that have their 8 differences
            lr = b.sd()
            if lr == lr:
                if lr > sd:
                    sd = lr
                break
        self._sd = sd
        return sd

    def _repeat_factor(self) -> float:
        """Rows per repeated value among the last rows when they look like rollout batches
        logged on several rows: at least a quarter of the rows repeat the row before, and the
        repeated values are continuous (nearly every run of equal rows has a value of its own;
        the few values of a discrete reward, e.g. means of 4 samples, recur across runs and are
        real observations). 1.0 otherwise."""
        vals = self._vals
        n = len(vals)
        if n < GLR_MIN_REF:
            return 1.0
        runs = 1 + sum(map(operator.ne, vals, itertools.islice(vals, 1, None)))  # value changes
        if runs > 0.75 * n or len(set(vals)) < 0.8 * runs:
            return 1.0
        return n / runs

    # --- the replay's shortcut --------------------------------------------------------------------
    def bounds(self, rewards: Any) -> Any:
        """For a whole series of finite rewards (the rows this check will be fed, from a fresh
        state), an upper bound of each row's statistic times the noise: max over the tested
        lengths with a drop of at least ``min_drop`` of drop / sqrt(1/L + 1/R) (``_test``'s z
        is that over an sd of at least the row noise), -inf where no length qualifies
        (``LevelDrop.bounds``, the batch twin of ``_test``'s loop)."""
        # (generous: rounding never skips a row)
        return self._level.bounds(rewards, self.shift.min_drop * (1.0 - 1e-6))

    def begin_replay(self, columns: Mapping[str, Any]) -> None:
        """A fresh check about to be fed a whole table: the bound of its statistic over the
        table's finite rewards (``set_bound``)."""
        rw = columns.get(C.REWARD_MEAN)
        if rw is None or len(rw) < 2 or self._rows:
            return
        finite = np.isfinite(rw)
        self.set_bound(self.bounds(rw if finite.all() else rw[finite]))

    def horizon(self, columns: Mapping[str, Any]) -> None:
        """A run of at most ``GLR_SHORT_ROWS`` finite rewards, whole (a replay of its table):
        its rows are held to a short run's threshold (``p_false_short_run``: the rate at which
        a run that long of noise crosses) and floor margin (``floor_sd_short``)."""
        rw = columns.get(C.REWARD_MEAN)
        if rw is None or self._rows:
            return  # (a fresh check only: its rows are indexed from the first)
        self._short = int(np.isfinite(rw).sum()) <= GLR_SHORT_ROWS
        if self._short:
            # a run that falls from its first rows is compared with them (GLR_SHORT_MIN_REF);
            # the replay's bound was taken with the long run's tests: not used (64 rows at most)
            self._level = LevelDrop(min_ref=GLR_SHORT_MIN_REF)
            self._bound = None

    @property
    def _in_short(self) -> bool:
        """This row is judged as a short run's (a resumed run may go on past its horizon)."""
        return self._short and self._rows <= GLR_SHORT_ROWS

    def end_replay(self) -> None:
        self._bound = None

    def set_bound(self, bound: Any) -> None:
        """Give a fresh check ``bounds(rewards)`` of the rows it is about to be fed (a replay
        of a whole table), or None to drop it: a row whose bound is below c x its noise sd
        cannot cross, and its test loop is skipped (the same alerts, sooner)."""
        if bound is not None and self._rows:
            raise ValueError("set_bound needs a fresh check (it indexes rows from the first)")
        self._bound = bound

    # --- update -----------------------------------------------------------------------------------
    def update(self, s: Any) -> list[Alert]:
        """Feed one row. The alert of a collapse first seen goes to ``pending`` (the phase
        machine emits it); nothing is returned."""
        hit = self.observe(s)
        self.pending = hit
        self.rank = 3 if self._fallen else 0
        return NO_ALERTS

    def observe(self, s: Any) -> Alert | None:
        """Feed one row; the alert when the collapse is first seen, else None."""
        cfg = self.shift
        rw = s.reward_mean
        if rw - rw != 0.0:  # (not finite; cheaper than math.isfinite in this per-row path)
            self._push_baselines(s)
            return None
        self._rows += 1
        if self._rows <= cfg.start_rows:
            self._start_sum += rw
        self._push_reward(rw, float(s.step))
        corro = self._corroboration(s)
        self._corro_rows.append(bool(corro))
        if not corro:
            # (a corroborating row is not pushed into the baselines: a signal that stays at its
            # new level keeps corroborating instead of becoming its own baseline)
            self._push_baselines(s)
        elif sum(self._corro_rows) < cfg.corroborated_rows:
            corro = []  # a row or two (one spike) corroborate nothing
        if self._fired:
            self._rearm()
            return None
        return self._test(s, corro)

    def _push_reward(self, rw: float, step: float) -> None:
        last = self._last
        if last == last:
            self._diffs.append(abs(rw - last))
        # the noise is estimated again on every row while the run is young, then every 8 rows
        # (its windows move by a few percent in 8 rows; the estimate is saved with the state)
        n = self._rows
        if n <= _NOISE_EVERY_FROM or not n % 8:
            self._sd = _NAN
        self._last = rw
        self._vals.append(rw)
        self._level.push(rw, step)
        for b in self._blocks:
            b.push(rw)
        self._peak_sum += rw
        self._peak_n += 1
        if self._peak_n == _PEAK_ROWS:
            self._peak = max(self._peak, self._peak_sum / _PEAK_ROWS)
            self._peak_blocks += 1
            self._peak_sum, self._peak_n = 0.0, 0

    def _rearm(self) -> None:
        """After an alert: re-armed once the mean of the last 3 rows is back above the re-arm
        line; the reward is no longer fallen once its last value is."""
        cum = self._level.cum
        line = self._rearm_line
        if len(cum) > 3 and (cum[-1] - cum[-4]) / 3.0 > line:
            self._fired = self._fallen = False
            return
        if self._fallen and self._last > line:
            self._fallen = False

    def _line(self, held: float, floor: float, sd: float) -> tuple[float, str]:
        """The highest level that counts as "near the floor" below ``held``, and its basis:
        floor + ``floor_frac`` x (held - floor) ("floor"); for a run that learned at least
        ``learned_frac`` of its height from its start, back near the start counts too: start +
        ``start_frac`` x (held - start) ("start_gain"), whichever is higher; a run that learned
        at least ``below_start_frac`` of it: back at or below its start ("start"). What the run
        learned is its peak (the best 16-row block mean, less the expected excess of the best of
        n: sqrt(2 ln n) standard errors; a slow decline before the fall does not erase it) or
        the held level, above the start's upper bound (``floor_sd`` standard errors above it)."""
        cfg = self.shift
        line = floor + cfg.floor_frac * max(held - floor, 0.0)
        start = self.start_level
        peak = held
        nb = self._peak_blocks
        if nb >= 2:
            excess = math.sqrt(2.0 * math.log(nb)) * sd / math.sqrt(_PEAK_ROWS)
            peak = max(peak, self._peak - excess)
        height = max(peak - floor, 0.0)
        n = min(self._rows, cfg.start_rows)
        gain = peak - (start + cfg.floor_sd * sd / math.sqrt(n))
        if gain > 0.0 and gain >= cfg.learned_frac * height:
            back = start + cfg.start_frac * max(held - start, 0.0)
            if back > line:
                return back, "start_gain"
        elif gain > 0.0 and gain >= cfg.below_start_frac * height and start > line:
            return start, "start"  # (learned less: back at or below its start)
        return line, "floor"

    def _test(self, s: Any, corro: list[str]) -> Alert | None:
        """The change-in-level test at this row (see the module docstring)."""
        cfg = self.shift
        sd_row = self.noise_sd()
        if sd_row != sd_row:
            return None
        if self._in_short:
            c = self.threshold_short_corroborated if corro else self.threshold_short
            floor_sd = cfg.floor_sd_short
        else:
            c = self.threshold_corroborated if corro else self.threshold
            floor_sd = cfg.floor_sd
        bound = self._bound
        if bound is not None and bound[self._rows - 1] < c * sd_row * (1.0 - 1e-6):
            return None  # no length can reach z >= c (the replay's bound; see set_bound)
        floor = self.floor
        cum = self._level.cum
        min_drop, min_noise = cfg.min_drop, cfg.min_noise_frac
        best: tuple[float, int, int, float, float, float, float, str, float, int] | None = None
        for length, r, mid, ref, post in self._level.candidates():
            drop = ref - post
            if drop < min_drop:
                continue
            sd = max(sd_row, min_noise * max(abs(ref), 0.1))
            z = drop / (sd * math.sqrt(1.0 / length + 1.0 / r))
            if z < c or (best is not None and z <= best[0]):
                continue  # (tested first: the line below costs more, and both must hold)
            # collapsed, not a dip: the level since the change sits near the floor, by its mean
            # plus floor_sd standard errors (two low rows of a noisy dip are not a floor)
            # the level held before the fall sets the line: the higher of its last NEAR_ROWS
            # rows (a long reference reaching back into the learning rise understates it) and
            # the compared segment (a slow decline before the fall understates the first)
            m = min(r, _NEAR_ROWS)
            held = (mid - cum[-1 - length - m]) / m
            if ref > held:
                held, m = ref, r
            line, basis = self._line(held, floor, sd)
            if post + floor_sd * sd / math.sqrt(length) > line:
                continue
            best = (z, length, r, ref, post, sd, line, basis, held, m)
        if best is None:
            return None
        self._fired = self._fallen = True
        held = best[8]
        self._rearm_line = floor + cfg.rearm_frac * max(held - floor, 0.0)
        return self._alert(int(s.step), best, c, corro)

    # --- corroborating signals -------------------------------------------------------------------
    def _corroboration(self, s: Any) -> list[str]:
        """The corroborating signals this row shows against their baselines (the values of the
        rows before it that corroborated nothing): past a multiple of the baseline's median AND
        outside its whole range, so a signal that flips between two levels in a healthy run
        (grad norm ~0 on steps whose groups are all identical) corroborates nothing.

        The share of groups with identical rewards is taken as logged
        (``frac_zero_std_groups``), never from a zero ``reward_std``: a step whose every reward
        is 0 has a zero spread by arithmetic, so it would "corroborate" a low reward with
        itself."""
        cfg = self.shift
        out: list[str] = []
        base = self._base
        # (the columns' names: C.GRAD_NORM, ... read as attributes, per row)
        for col, v, up, down in (
            (C.GRAD_NORM, s.grad_norm, cfg.grad_surge, cfg.grad_dead),
            (C.ENTROPY, s.entropy, cfg.entropy_rise, cfg.entropy_fall),
            (C.COMPLETION_LENGTH, s.completion_length, math.inf, cfg.length_fall),
        ):
            stats = base[col].stats_
            side = _beyond(v, stats, up, down)
            if side:
                m = stats[0]
                out.append(_CORROBORATES[col, side].format(v=v, m=m, r=v / m, p=100 * v / m))
        tr = s.frac_truncated
        if tr == tr:
            m, _, hi = base[C.FRAC_TRUNCATED].stats_
            if tr >= cfg.truncated_frac and m < 0.5 * cfg.truncated_frac and tr > hi:
                out.append(f"{100 * tr:.0f}% of completions at the length cap (before {m:.0%})")
        zs = s.frac_zero_std_groups  # (as logged: see above)
        if zs == zs:
            m, _, hi = base["zero_std"].stats_
            if zs >= cfg.zero_std_frac and m < 0.5 and zs > hi:
                out.append(f"{100 * zs:.0f}% of groups with identical rewards (before {m:.0%})")
        return out

    def _push_baselines(self, s: Any) -> None:
        for v, b in zip(_finite_signals(s), self._finite_base):
            if v - v == 0.0:  # finite
                b.push(v)
        zs = s.frac_zero_std_groups  # (as logged: see _corroboration)
        if zs == zs:
            self._base["zero_std"].push(zs)

    # --- output -----------------------------------------------------------------------------------
    def _alert(
        self,
        step: int,
        best: tuple[float, int, int, float, float, float, float, str, float, int],
        c: float,
        corro: list[str],
    ) -> Alert:
        z, length, r, ref, recent, sd, line, basis, held, m = best
        cfg = self.shift
        floor, start = self.floor, self.start_level
        change_step = self._level.steps[-length]
        short = self._in_short
        per_fa = glr_rows_per_false_alarm(c, short=short)
        p_run = glr_run_rate(c, short=short)
        rate = (
            f"about one run in {1.0 / p_run:,.0f} of {GLR_SHORT_ROWS} rows of noise like this "
            f"run's crosses it (a run of at most {GLR_SHORT_ROWS} rows is held to the threshold "
            "of a run that short)"
            if short
            else f"about one false alarm per {per_fa:,.0f} rows of noise like this run's"
        )
        msg = (
            f"Phase III (collapse) at step {step}: the reward fell from {held:.3g} (mean of the "
            f"{m} rows before step {change_step:.0f}, where the fall began"
            + (f"; {ref:.3g} over the {r} rows the test compares with" if r != m else "")
            + f") to {recent:.3g} (mean of the {length} rows since), "
            + (
                f"near the run's floor {floor:.3g} (at or below {line:.3g} = floor + "
                f"{cfg.floor_frac:g} x the held level's height above it); "
                if basis == "floor"
                else f"back near the level the run started from, {start:.3g} (at or below "
                f"{line:.3g} = start + {cfg.start_frac:g} x the gain); "
                if basis == "start_gain"
                else f"back at or below the level the run started from, {start:.3g}; "
            )
            + f"change-in-level statistic z = {z:.1f} against a threshold of {c:.2f}: {rate} "
            f"(noise sd {sd:.3g} per row, estimated from the run)"
        )
        msg += "; corroborated by " + "; ".join(corro) if corro else "; no corroborating signal"
        msg += " (seen in standard metrics: a level shift, not specific to LLD)"
        ev = {
            "detector": "level_shift",
            "statistic": "glr_z",
            "z": _enc(z),
            "threshold": _enc(c),
            "rows_per_false_alarm": _enc(per_fa),
            "threshold_for_rows": GLR_SHORT_ROWS if short else GLR_CAL_ROWS,
            "p_false_run": _enc(p_run),
            "reward_held": _enc(held),
            "reward_reference": _enc(ref),
            "reward_recent": _enc(recent),
            "reward_start": _enc(start),
            "reward_floor": _enc(floor),
            "reward_drop": _enc(ref - recent),
            "collapsed_line": _enc(line),
            "collapsed_by": basis,
            "noise_sd": _enc(sd),
            "change_step": _enc(change_step),
            "window_rows": length,
            "reference_rows": r,
            "corroborated_by": list(corro),
        }
        return Alert(step, "collapse", "critical", msg, ev)

    # --- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The running state as plain JSON (the last rows' rewards, not their running sums)."""
        cum, steps = self._level.cum, self._level.steps
        n = len(steps)
        return {
            "rows": self._rows,
            "start_sum": self._start_sum,
            "last": _enc(self._last),
            "rewards": [cum[i + 1] - cum[i] for i in range(len(cum) - 1 - n, len(cum) - 1)],
            "steps": list(steps),
            "sd": _enc(self._sd),
            "diffs": list(self._diffs),
            "vals": list(self._vals),
            "blocks": [b.state() for b in self._blocks],
            "peak": [
                _enc(self._peak) if self._peak_blocks else None,
                self._peak_blocks,
                self._peak_sum,
                self._peak_n,
            ],
            "base": {k: v.state() for k, v in self._base.items()},
            "corro_rows": list(self._corro_rows),
            "fired": self._fired,
            "fallen": self._fallen,
            "rearm_line": _enc(self._rearm_line),
            "short": self._short,
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()`` saved with the same hyperparameters."""
        self.reset()
        self._rows, self._start_sum = int(d["rows"]), float(d["start_sum"])
        self._last = _dec(d["last"])
        self._short = bool(d.get("short", False))  # (states saved before short runs: long)
        if self._short:
            self._level = LevelDrop(min_ref=GLR_SHORT_MIN_REF)
        level = self._level
        total = 0.0
        for v in d["rewards"]:
            total += float(v)
            level.cum.append(total)
        level.total = total
        level.steps = [float(v) for v in d["steps"]]
        self._sd = _dec(d["sd"])
        self._diffs.extend(float(v) for v in d["diffs"])
        self._vals.extend(float(v) for v in d["vals"])
        for b, st in zip(self._blocks, d["blocks"], strict=True):
            b.load(st)
        pk, pb, ps, pn = d["peak"]
        self._peak = _dec(pk) if pb else -math.inf
        self._peak_blocks, self._peak_sum, self._peak_n = int(pb), float(ps), int(pn)
        for k, v in d["base"].items():
            self._base[k].load(v)
        self._corro_rows.extend(bool(v) for v in d["corro_rows"])
        self._fired, self._fallen = bool(d["fired"]), bool(d["fallen"])
        self._rearm_line = _dec(d["rearm_line"])
        self.rank = 3 if self._fallen else 0


class ModeCollapse(Check):
    """``mode_collapse`` (warning, not LLD): most groups get identical rewards while the
    completions have shrunk to a fraction of their early length."""

    kind = "mode_collapse"
    row_only = True

    def __init__(self, config: DetectorConfig | None = None) -> None:
        config = config or DetectorConfig()
        self.mode = config.mode_collapse
        super().__init__(config)

    def reset(self) -> None:
        self._early_sum = 0.0
        self._early_n = 0
        self._zs: deque[float] = deque(maxlen=self.mode.window_rows)
        self._held = 0
        self._fired = False

    @property
    def fired(self) -> bool:
        return self._fired

    def update(self, s: Any) -> list[Alert]:
        hit = self.observe(s)
        return [hit] if hit is not None else NO_ALERTS

    def observe(self, s: Any) -> Alert | None:
        """Feed one row; the alert when the mode collapse is first seen, else None."""
        cfg = self.mode
        zs = s.frac_zero_std_groups
        if zs != zs:
            rstd = s.reward_std
            zs = (1.0 if rstd <= 1e-6 else 0.0) if rstd == rstd else _NAN
        ln = s.completion_length
        if ln == ln and self._early_n < cfg.early_rows:
            self._early_sum += ln
            self._early_n += 1
        if zs == zs:
            self._zs.append(zs)
        if ln != ln or zs != zs or not self._early_n:
            return None
        early = self._early_sum / self._early_n
        share = sum(self._zs) / len(self._zs)
        cond = share >= cfg.zero_std_frac and early > 0.0 and ln <= cfg.length_frac * early
        if not cond:
            self._held = 0
            if self._fired and share < cfg.zero_std_frac / 2:
                self._fired = False  # re-arm once most groups differ again
            return None
        self._held += 1
        if self._fired or self._held < cfg.persist_rows:
            return None
        self._fired = True
        step = int(s.step)
        msg = (
            f"mode collapse at step {step}: {100 * share:.0f}% of prompt groups get identical "
            f"rewards (mean of the last {len(self._zs)} rows) while completions are "
            f"{ln:.3g} tokens, {100 * ln / early:.0f}% of their early length {early:.3g}: the "
            "policy gives (nearly) the same short answer to every prompt, so GRPO's advantages "
            "vanish; not a sign of LLD (check the reward for a degenerate answer it accepts)"
        )
        ev = {
            "frac_zero_std_groups": _enc(share),
            "completion_length": _enc(ln),
            "completion_length_early": _enc(early),
            "rows": self._held,
        }
        return Alert(step, self.kind, "warning", msg, ev)

    def state_dict(self) -> dict[str, Any]:
        return {
            "early_sum": self._early_sum,
            "early_n": self._early_n,
            "zs": list(self._zs),
            "held": self._held,
            "fired": self._fired,
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.reset()
        self._early_sum, self._early_n = float(d["early_sum"]), int(d["early_n"])
        self._zs.extend(float(v) for v in d["zs"])
        self._held, self._fired = int(d["held"]), bool(d["fired"])
