"""Collapse as a level shift, from standard metrics alone; mode collapse.

A collapse in a log without LLD columns is not a trend but a change of level: the reward is now
far below a level it held, back near where the run started (or below), and it stays there.
``LevelShiftCollapse`` tests exactly that, in logged rows (not steps, so a 40-row log logged
every 5 steps is judged on its 40 rows), at several window sizes at once, with the noise
estimated from the run itself (the median absolute difference of consecutive rewards). A
corroborating signal on the same rows (grad norm surge or death, entropy blow-up or collapse,
completions at the length cap or down to a few tokens, all-identical groups) lets it fire on a
shorter window.

``ModeCollapse`` is the failure where most groups get identical rewards while the completions
become short: the policy answers every prompt with one short string. It is not LLD, and it is
told apart from a dead signal at the start of a run that never learned by the completion length
falling from its early level.

Both are checks (``checks/base.py``): ``update(signals) -> list[Alert]``, JSON state, ``reset()``;
they read only the row's raw values (attributes named like the columns: ``reward_mean``,
``grad_norm``, ...) and ``step``, so any object with those attributes can drive them. Their
hyperparameters are their own frozen configs (``LevelShiftConfig``, ``ModeCollapseConfig``).
``LevelShiftCollapse`` escalates the phase itself (``immediate``): its persistence is in rows
already, and the phase machine's ``collapse_persist_steps`` would cost a sparse log rows.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from lld_monitor import columns as C
from lld_monitor.analysis.checks.base import NO_ALERTS, Check
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.trend import from_json_float, json_float
from lld_monitor.events import Alert

_NAN = float("nan")
_SQRT2 = math.sqrt(2.0)
_enc, _dec = json_float, from_json_float


@dataclass(frozen=True)
class LevelShiftConfig:
    """Hyperparameters of ``LevelShiftCollapse`` (rows are logged rows with a reward)."""

    windows: tuple[int, ...] = (3, 6, 12, 24, 48)  # rows of the held block and the recent mean
    corroborated_window: int = 2  # a shorter window, used only with a corroborating signal
    start_rows: int = 3  # the run's starting level: the mean of its first rows
    keep_frac: float = 0.3  # "near the start": below start + keep_frac * (held - start)
    min_drop_frac: float = 0.25  # the drop is at least this share of max(|held|, |start|, gain,
    # min_scale): rewards are taken to move on a scale of 0.1 or more, so a run that never left
    # ~0.02 (never learned) does not collapse by losing 0.02, however small its noise
    min_scale: float = 0.1
    plain_drop_frac: float = 0.4  # the same share without a corroborating signal
    z: float = 2.5  # the drop exceeds z noise sd of the difference of the two means ...
    # ... plus the expected excess of the highest of n block means (sqrt(2 ln n) sd)
    noise_rows: int = 64  # consecutive differences behind the noise estimate
    min_blocks: int = 3  # a window size is tested once this many of its blocks are clear of it
    corroborated_rows: int = 3  # rows among the last 3 that show a corroborating signal
    min_noise_frac: float = 0.01  # noise sd at least this share of the drop's scale
    # without corroboration the low level holds this many steps too, and this share of the
    # steps the run has had (a transient dip of a long run is not a collapse)
    hold_steps: float = 8.0
    hold_frac: float = 0.1
    hold_cap: float = 200.0  # ... at most this many steps (a long run's collapse is not slower)
    # ... or, in a sparse log (rows sparse_gap steps apart or more), this many rows with new
    # values, spanning hold_steps at least: a 40-row log logged every 5 steps has no finer time
    hold_rows: int = 3
    sparse_gap: float = 4.0
    sparse_max_rows: int = 120  # ... in a short log: a long sparse log has the steps to wait
    z_level: float = 3.0  # z of the test against the level just before the recent window
    baseline_rows: int = 32  # values of a corroborating signal behind its baseline (median)
    grad_surge: float = 5.0  # grad norm >= this x its baseline
    grad_dead: float = 1e-3  # grad norm <= this x its baseline (or exactly 0)
    entropy_rise: float = 2.0  # entropy >= this x its baseline
    entropy_fall: float = 0.2  # entropy <= this x its baseline
    length_fall: float = 0.25  # completion length <= this x its baseline
    truncated_frac: float = 0.5  # frac_truncated >= this (and its baseline below half of it)
    zero_std_frac: float = 0.9  # frac_zero_std_groups >= this, from a baseline below 0.5
    rearm_frac: float = 0.5  # re-armed once the recent mean is back above start + this * gain

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            vals = v if isinstance(v, tuple) else (v,)
            if not vals or any(
                not isinstance(x, int | float) or isinstance(x, bool) or not x > 0 for x in vals
            ):
                raise ValueError(f"LevelShiftConfig.{f.name} must be positive, got {v!r}")
        if any(int(w) != w or w < 2 for w in (*self.windows, self.corroborated_window)):
            raise ValueError("LevelShiftConfig windows must be whole numbers of rows >= 2")


class _Block:
    """Block means of ``w`` consecutive rows; the highest mean of the blocks that ended at
    least ``w`` rows ago (so it never overlaps the recent window)."""

    __slots__ = (
        "best",
        "best_end",
        "count",
        "diffs",
        "folded",
        "last",
        "means",
        "n_blocks",
        "pending",
        "sd_cache",
        "total",
        "w",
    )

    def __init__(self, w: int, noise_blocks: int = 32) -> None:
        self.w = w
        self.total = 0.0
        self.count = 0
        self.pending: deque[tuple[int, float]] = deque()  # (end row, mean), not yet folded
        self.best = _NAN
        self.best_end = -1
        self.n_blocks = 0
        self.last = _NAN  # the last block mean
        # |differences of consecutive block means|: the noise of a block mean, autocorrelation
        # of the rows included (which row differences alone would miss)
        self.diffs: deque[float] = deque(maxlen=noise_blocks)
        self.means: deque[float] = deque(maxlen=noise_blocks)  # the last block means
        self.folded: deque[float] = deque(maxlen=8)  # the last means clear of the recent window
        # noise_sd(local=True / False), a function of the block means: computed again only after
        # a block completes or folds (not saved: rebuilt from the state on demand)
        self.sd_cache: list[float | None] = [None, None]

    def noise_sd(self, local: bool) -> float:
        """Robust sd of one block mean: the larger of the median |difference| of consecutive
        means / 0.954 (white noise) and the MAD * 1.4826 of the block means the reference
        spans (noise that wanders, e.g. autocorrelated rollout batches, has small consecutive
        differences): the last few means clear of the recent window (``local``, for the level
        just before it) or the last ``noise_blocks`` (for the best block of the run); NaN
        before 3 blocks."""
        cached = self.sd_cache[local]
        if cached is not None:
            return cached
        sd = self._noise_sd(local)
        self.sd_cache[local] = sd
        return sd

    def _noise_sd(self, local: bool) -> float:
        # (a log of exact constants has few non-zero differences: the fall itself, maybe)
        sd = _median(self.diffs) / 0.9539 if len(self.diffs) >= 3 else 0.0
        pool = self.folded if local else self.means
        if len(pool) < 4 and len(self.diffs) < 3:
            return _NAN
        if len(pool) >= 4:
            mad = _detrended_mad(pool)
            if mad > sd:
                sd = mad
        return sd

    def push(self, row: int, x: float) -> None:
        self.total += x
        self.count += 1
        if self.count == self.w:
            m = self.total / self.w
            if self.last == self.last and m != self.last:  # (a repeated batch: no news)
                self.diffs.append(abs(m - self.last))
            self.last = m
            self.means.append(m)
            self.pending.append((row, m))
            self.total, self.count = 0.0, 0
            self.sd_cache = [None, None]
        pend = self.pending
        while pend and pend[0][0] <= row - self.w:
            self.sd_cache = [None, None]
            end, m = pend.popleft()
            self.n_blocks += 1
            self.folded.append(m)
            if not m <= self.best:
                self.best, self.best_end = m, end

    def state(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "count": self.count,
            "pending": [[e, m] for e, m in self.pending],
            "best": _enc(self.best),
            "best_end": self.best_end,
            "n_blocks": self.n_blocks,
            "last": _enc(self.last),
            "diffs": list(self.diffs),
            "means": list(self.means),
            "folded": list(self.folded),
        }

    def load(self, d: Mapping[str, Any]) -> None:
        self.total, self.count = float(d["total"]), int(d["count"])
        self.pending = deque((int(e), float(m)) for e, m in d["pending"])
        self.best, self.best_end = _dec(d["best"]), int(d["best_end"])
        self.n_blocks = int(d["n_blocks"])
        self.last = _dec(d["last"])
        self.diffs.clear()
        self.diffs.extend(float(v) for v in d["diffs"])
        self.means.clear()
        self.means.extend(float(v) for v in d["means"])
        self.folded.clear()
        self.folded.extend(float(v) for v in d["folded"])
        self.sd_cache = [None, None]


class _Baseline:
    """The last ``n`` values of a corroborating signal and their (median, min, max), computed
    again after every ``every`` new values (a sort of a short window: O(1) amortized per row);
    NaN before 3 values."""

    __slots__ = ("dirty", "every", "stats_", "values")

    def __init__(self, n: int, every: int = 8) -> None:
        self.values: deque[float] = deque(maxlen=n)
        self.every = every
        self.dirty = 0
        self.stats_ = (_NAN, _NAN, _NAN)

    def push(self, v: float) -> None:
        vals = self.values
        vals.append(v)
        d = self.dirty + 1
        if d >= self.every or (d == 3 and self.stats_[0] != self.stats_[0]):
            d = 0  # (the first stats come at 3 values, then every ``every`` values)
            self.stats_ = (_median(vals), min(vals), max(vals))
        self.dirty = d

    def stats(self) -> tuple[float, float, float]:
        return self.stats_

    def state(self) -> dict[str, Any]:
        return {
            "values": list(self.values),
            "dirty": self.dirty,
            "stats": [_enc(v) for v in self.stats_],
        }

    def load(self, d: Mapping[str, Any]) -> None:
        self.values.clear()
        self.values.extend(float(v) for v in d["values"])
        self.dirty = int(d["dirty"])
        a, b, c = (_dec(v) for v in d["stats"])
        self.stats_ = (a, b, c)


def _median(values: Any) -> float:
    srt = sorted(values)
    n = len(srt)
    if not n:
        return _NAN
    h = n >> 1
    return srt[h] if n & 1 else 0.5 * (srt[h - 1] + srt[h])


def _detrended_mad(values: Any) -> float:
    """1.4826 x the MAD of ``values`` about their Theil-Sen line (median of the pairwise
    slopes): the spread of block means that a rise of the reward (learning) does not inflate."""
    v = list(values)
    n = len(v)
    slope = _median([(v[j] - v[i]) / (j - i) for i in range(n) for j in range(i + 1, n)])
    icpt = _median([x - slope * i for i, x in enumerate(v)])
    return 1.4826 * _median([abs(x - icpt - slope * i) for i, x in enumerate(v)])


def _value(s: Any, name: str) -> float:
    """The row's value of a column (``Signals`` holds every one as a float, NaN when missing)."""
    return getattr(s, name)


class LevelShiftCollapse(Check):
    """``collapse`` (critical) when the reward has fallen from a level it held to near the run's
    starting level or below and stays there; see the module docstring.

    ``rank`` is 3 from the alert while the reward stays down (the phase stays ``collapse``);
    ``pending`` holds the alert of this row for the phase machine, which emits it as the phase
    alert (or merges it into its own when another check escalates on the same row).
    """

    kind = "level_shift"
    immediate = True  # the phase machine escalates on the alert row, without more persistence
    _SIGNALS = (C.GRAD_NORM, C.ENTROPY, C.COMPLETION_LENGTH, C.FRAC_TRUNCATED, "zero_std")

    def __init__(
        self, config: DetectorConfig | None = None, shift: LevelShiftConfig | None = None
    ) -> None:
        self.shift = shift or LevelShiftConfig()
        super().__init__(config or DetectorConfig())

    def reset(self) -> None:
        """Forget every row seen; keep the hyperparameters."""
        cfg = self.shift
        self.rank = 0
        self.pending: Alert | None = None
        self._rows = 0  # rows with a finite reward
        self._row_sd = _NAN  # noise sd from the row differences (NaN: to be computed again)
        self._first_step = _NAN
        self._start_sum = 0.0
        self._last = _NAN  # last reward
        self._recent: deque[float] = deque(maxlen=max(cfg.windows))
        self._diffs: deque[float] = deque(maxlen=cfg.noise_rows)  # |consecutive differences|
        ws = sorted({*cfg.windows, cfg.corroborated_window})
        self._blocks = {w: _Block(w) for w in ws}
        self._block_list = list(self._blocks.values())
        self._base: dict[str, _Baseline] = {k: _Baseline(cfg.baseline_rows) for k in self._SIGNALS}
        self._low_since = _NAN  # step since which the uncorroborated condition has held
        self._low_rows = 0  # rows it has held on
        self._corro_rows: deque[bool] = deque(maxlen=3)  # rows with a corroborating signal
        self._fired = False
        self._fallen = False  # the reward is still down after the alert

    # --- the state the phase machine reads ------------------------------------------------------
    @property
    def fired(self) -> bool:
        """True from the alert until the reward is back (re-armed)."""
        return self._fired

    @property
    def still_fallen(self) -> bool:
        """True while the reward stays near its starting level after a collapse alert."""
        return self._fallen

    @property
    def start_level(self) -> float:
        n = min(self._rows, self.shift.start_rows)
        return self._start_sum / n if n else _NAN

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
        rw = _value(s, C.REWARD_MEAN)
        if not math.isfinite(rw):
            self._push_baselines(s)
            return None
        self._rows += 1
        row = self._rows
        if row == 1:
            self._first_step = float(s.step)
        if row <= cfg.start_rows:
            self._start_sum += rw
        # an exact repeat is a rollout batch's value logged again (or a dead constant), not a
        # new observation of the noise: it is left out of the noise estimates
        if self._last == self._last and rw != self._last:
            self._diffs.append(abs(rw - self._last))
            self._row_sd = _NAN
        self._last = rw
        self._recent.append(rw)
        for b in self._block_list:
            b.push(row, rw)
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
        if rw > self._highest_line():  # no window can hold: the cheap common case
            if self._low_since == self._low_since and self._back_up():
                self._low_since = _NAN
            return None
        return self._test(s, corro)

    def _eligible(self, w: int, b: _Block) -> bool:
        return b.best == b.best and len(self._recent) >= w and b.n_blocks >= self.shift.min_blocks

    def _highest_line(self) -> float:
        """The highest "near the start" line over the windows that can be tested (those with
        ``min_blocks`` blocks clear of them): a reward above it cannot be a collapse at any."""
        need = self.shift.min_blocks
        top = -math.inf
        for b in self._blocks.values():
            if b.n_blocks >= need and b.best > top:
                top = b.best
        if top == -math.inf:
            return top
        start = self._start_sum / min(self._rows, self.shift.start_rows)
        return start + self.shift.keep_frac * (top - start if top > start else 0.0)

    def _back_up(self) -> bool:
        """The low level is over: the mean of the shortest window is back above its line (one
        noisy row above it is not)."""
        w = min(self.shift.windows)
        b = self._blocks[w]
        if not self._eligible(w, b):
            return True
        start, recent = self.start_level, self._recent
        line = start + self.shift.keep_frac * max(b.best - start, 0.0)
        return sum(itertools.islice(reversed(recent), w)) / w > line

    def _rearm(self) -> None:
        """After an alert: re-arm once the recent mean of the shortest window is back above
        start + rearm_frac * gain; the reward is no longer fallen once its last value is."""
        cfg = self.shift
        w = min(cfg.windows)
        b = self._blocks[w]
        start, recent = self.start_level, self._recent
        if self._eligible(w, b):
            gain = max(b.best - start, 0.0)
            r = sum(itertools.islice(reversed(recent), w)) / w
            if r > start + cfg.rearm_frac * gain:
                self._fired = self._fallen = False
                self._low_since = _NAN
                return
        if self._fallen and recent[-1] > start + cfg.rearm_frac * max(b.best - start, 0.0):
            self._fallen = False

    def _test(self, s: Any, corro: list[str]) -> Alert | None:
        cfg = self.shift
        start = self.start_level
        recent = self._recent
        step = float(s.step)
        best: tuple[int, float, float, float, float, float] | None = None
        sigma = _NAN
        for w, b in self._blocks.items():
            if w == cfg.corroborated_window and w not in cfg.windows:
                if not corro:  # the short window needs corroboration
                    continue
            if not self._eligible(w, b):
                continue
            held = b.best
            gain = max(held - start, 0.0)
            line = start + cfg.keep_frac * gain
            if recent[-1] > line:
                continue
            r = 0.0
            for i in range(1, w + 1):
                r += recent[-i]
            r /= w
            if r > line:
                continue
            drop = held - r
            ref = max(abs(held), abs(start), gain, cfg.min_scale)
            # without corroboration the fall must be a larger share of the level: a deep
            # transient dip of a run that gained little crosses its start line too
            need_frac = cfg.min_drop_frac if corro else cfg.plain_drop_frac
            if not (ref > 0.0 and drop >= need_frac * ref):
                continue
            if sigma != sigma:
                if self._row_sd != self._row_sd:  # (NaN: stale since the last difference)
                    d = self._diffs
                    self._row_sd = _median(d) / 0.9539 if len(d) >= 3 else 0.0
                sigma = max(self._row_sd, cfg.min_noise_frac * ref)
            # sd of one w-row mean: white noise from the row differences, or what the block
            # means themselves scatter by (autocorrelated noise), whichever is larger
            white = sigma / math.sqrt(w)
            sd_long = max(white, b.noise_sd(local=False))
            sd_loc = max(white, b.noise_sd(local=True))
            if sd_long != sd_long:
                continue
            # two references: the best block (an extreme of n_blocks means: corrected by
            # sqrt(2 ln n) sd of the long-run spread), and the level just before the recent
            # window (the median of the last k block means clear of it: sd ~ 1.25 sd / sqrt(k))
            extreme = math.sqrt(2.0 * math.log(b.n_blocks)) if b.n_blocks > 1 else 0.0
            k = len(b.folded)
            plateau = _median(b.folded) if k >= 4 else _NAN
            # a run that never gained needs a corroborating signal: a low reward that drifts
            # down a little with nothing else moving is a run that never learned
            if not corro:
                lvl_gain = held - sd_long * extreme - start  # the best, less its excess
                if plateau == plateau:
                    lvl_gain = max(lvl_gain, plateau - start)
                if lvl_gain <= cfg.z * sd_long * _SQRT2:
                    continue
            # with a corroborating signal (independent evidence, two rows of three) the best
            # block is not discounted for being the best of many
            lvl, sd_w = held, sd_long
            if drop <= sd_long * (cfg.z * _SQRT2 + (0.0 if corro else extreme)):
                if plateau != plateau:
                    continue
                lvl, sd_w = plateau, sd_loc
                if lvl - r <= cfg.z_level * sd_loc * math.sqrt(1.0 + 1.5625 / k):
                    continue
            z = (lvl - r) / (sd_w * _SQRT2)
            if best is None or w < best[0]:
                best = (w, lvl, r, lvl - r, sd_w, z)
        if best is None:
            if self._low_since == self._low_since and self._back_up():
                self._low_since = _NAN
            return None
        uncorroborated = best[0] in cfg.windows
        if self._low_since != self._low_since:
            self._low_since = step
            self._low_rows = 0
        if len(recent) < 2 or recent[-1] != recent[-2]:  # observations, not repeated rows
            self._low_rows += 1
        if not corro:
            held_for = step - self._low_since
            hold = max(cfg.hold_steps, min(cfg.hold_frac * (step - self._first_step), cfg.hold_cap))
            gap = (step - self._first_step) / max(self._rows - 1, 1)  # steps between rows
            sparse_ok = (
                gap >= cfg.sparse_gap
                and self._rows <= cfg.sparse_max_rows
                and self._low_rows >= cfg.hold_rows
                and held_for >= cfg.hold_steps
            )
            if not uncorroborated or not (held_for >= hold or sparse_ok):
                return None
        self._fired = self._fallen = True
        return self._alert(int(step), start, best, corro)

    # --- corroborating signals -------------------------------------------------------------------
    @staticmethod
    def _zero_std(s: Any) -> float:
        """The share of groups with identical rewards, as logged (``frac_zero_std_groups``).
        A zero ``reward_std`` is not taken for it here: a step whose every reward is 0 has a
        zero spread by arithmetic, so it would "corroborate" a low reward with itself."""
        return _value(s, C.FRAC_ZERO_STD_GROUPS)

    def _corroboration(self, s: Any) -> list[str]:
        """The corroborating signals this row shows against their baselines (the values of the
        rows before it that corroborated nothing): past a multiple of the baseline's median AND
        outside its whole range, so a signal that flips between two levels in a healthy run
        (grad norm ~0 on steps whose groups are all identical) corroborates nothing."""
        cfg = self.shift
        out: list[str] = []
        base = self._base
        g = _value(s, C.GRAD_NORM)
        if g == g:
            m, lo, hi = base[C.GRAD_NORM].stats()
            if m > 0.0 and g >= cfg.grad_surge * m and g > hi:
                out.append(f"grad norm {g:.3g} = x{g / m:.0f} its median {m:.3g}")
            elif m > 0.0 and g <= cfg.grad_dead * m and g < lo:
                out.append(f"grad norm {g:.3g}: dead (median before {m:.3g})")
        h = _value(s, C.ENTROPY)
        if h == h:
            m, lo, hi = base[C.ENTROPY].stats()
            if m > 0.0 and h >= cfg.entropy_rise * m and h > hi:
                out.append(f"entropy {h:.3g} = x{h / m:.1f} its median {m:.3g}")
            elif m > 0.0 and h <= cfg.entropy_fall * m and h < lo:
                out.append(f"entropy {h:.3g} = {100 * h / m:.0f}% of its median {m:.3g}")
        ln = _value(s, C.COMPLETION_LENGTH)
        if ln == ln:
            m, lo, _ = base[C.COMPLETION_LENGTH].stats()
            if m > 0.0 and ln <= cfg.length_fall * m and ln < lo:
                out.append(f"completion length {ln:.3g} tokens (median before {m:.3g})")
        tr = _value(s, C.FRAC_TRUNCATED)
        if tr == tr:
            m, _, hi = base[C.FRAC_TRUNCATED].stats()
            if tr >= cfg.truncated_frac and m < 0.5 * cfg.truncated_frac and tr > hi:
                out.append(f"{100 * tr:.0f}% of completions at the length cap (before {m:.0%})")
        zs = self._zero_std(s)
        if zs == zs:
            m, _, hi = base["zero_std"].stats()
            if zs >= cfg.zero_std_frac and m < 0.5 and zs > hi:
                out.append(f"{100 * zs:.0f}% of groups with identical rewards (before {m:.0%})")
        return out

    def _push_baselines(self, s: Any) -> None:
        base = self._base
        for name in (C.GRAD_NORM, C.ENTROPY, C.COMPLETION_LENGTH, C.FRAC_TRUNCATED):
            v = _value(s, name)
            if v == v and math.isfinite(v):
                base[name].push(v)
        zs = self._zero_std(s)
        if zs == zs:
            base["zero_std"].push(zs)

    # --- output -----------------------------------------------------------------------------------
    def _alert(
        self,
        step: int,
        start: float,
        best: tuple[int, float, float, float, float, float],
        corro: list[str],
    ) -> Alert:
        w, held, recent, drop, sigma, z = best
        b = self._blocks[w]
        msg = (
            f"Phase III (collapse) at step {step}: reward fell from the level it held, "
            f"{held:.3g} (best mean of {w} rows), to {recent:.3g} (mean of the last {w} rows), "
            f"{'below' if recent <= start else 'back near'} the run's starting level {start:.3g}; "
            f"a drop of {drop:.3g} = {z:.1f} sd of the difference (sd of a {w}-row mean "
            f"{sigma:.3g}, estimated from the run)"
        )
        msg += "; corroborated by " + "; ".join(corro) if corro else "; no corroborating signal"
        msg += " (seen in standard metrics: a level shift, not specific to LLD)"
        ev = {
            "detector": "level_shift",
            "reward_held": _enc(held),
            "reward_held_end_row": b.best_end,
            "reward_recent": _enc(recent),
            "reward_start": _enc(start),
            "reward_drop": _enc(drop),
            "noise_sd_of_mean": _enc(sigma),
            "drop_z": _enc(z),
            "window_rows": w,
            "corroborated_by": list(corro),
        }
        return Alert(step, "collapse", "critical", msg, ev)

    # --- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The running state as plain JSON."""
        return {
            "rows": self._rows,
            "start_sum": self._start_sum,
            "first_step": _enc(self._first_step),
            "last": _enc(self._last),
            "recent": list(self._recent),
            "diffs": list(self._diffs),
            "blocks": {str(w): b.state() for w, b in self._blocks.items()},
            "base": {k: v.state() for k, v in self._base.items()},
            "low_since": _enc(self._low_since),
            "low_rows": self._low_rows,
            "corro_rows": list(self._corro_rows),
            "fired": self._fired,
            "fallen": self._fallen,
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()`` saved with the same hyperparameters."""
        self.reset()
        self._rows, self._start_sum = int(d["rows"]), float(d["start_sum"])
        self._last = _dec(d["last"])
        self._first_step = _dec(d["first_step"])
        self._recent.extend(float(v) for v in d["recent"])
        self._diffs.extend(float(v) for v in d["diffs"])
        for w, b in d["blocks"].items():
            self._blocks[int(w)].load(b)
        for k, v in d["base"].items():
            self._base[k].load(v)
        self._low_since = _dec(d["low_since"])
        self._low_rows = int(d["low_rows"])
        self._corro_rows.extend(bool(v) for v in d["corro_rows"])
        self._fired, self._fallen = bool(d["fired"]), bool(d["fallen"])
        self.rank = 3 if self._fallen else 0


@dataclass(frozen=True)
class ModeCollapseConfig:
    """Hyperparameters of ``ModeCollapse``."""

    early_rows: int = 3  # the early completion length: mean of the first rows that have one
    window_rows: int = 5  # rows behind the share of identical-reward groups
    zero_std_frac: float = 0.6  # "most groups": mean share over the window at or above this
    length_frac: float = 0.35  # completions at or below this share of their early length
    persist_rows: int = 2  # rows in a row that hold both before the alert

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"ModeCollapseConfig.{f.name} must be positive, got {v!r}")


class ModeCollapse(Check):
    """``mode_collapse`` (warning, not LLD): most groups get identical rewards while the
    completions have shrunk to a fraction of their early length."""

    kind = "mode_collapse"

    def __init__(
        self, config: DetectorConfig | None = None, mode: ModeCollapseConfig | None = None
    ) -> None:
        self.mode = mode or ModeCollapseConfig()
        super().__init__(config or DetectorConfig())

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
        zs = _value(s, C.FRAC_ZERO_STD_GROUPS)
        if zs != zs:
            rstd = _value(s, C.REWARD_STD)
            zs = (1.0 if rstd <= 1e-6 else 0.0) if rstd == rstd else _NAN
        ln = _value(s, C.COMPLETION_LENGTH)
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
