"""``TrendLevels``: stagnation (Phase I) and steady decay (Phase II) from the multi-scale trends
of ``logp_correct`` and the reward (``analysis/trend.py``), confirmed level by level.

It raises no alert itself: it sets ``rank`` (1 stagnation, 2 decay) for the phase machine, and
``level``, the trend level behind it (its window sets how long the phase outlasts its support).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lld_monitor import columns as C
from lld_monitor.analysis.checks.base import NO_ALERTS, Check
from lld_monitor.analysis.signals import Signals
from lld_monitor.events import Alert


class TrendLevels(Check):
    """Re-tests the trend levels whose ``logp_correct`` bins closed this row (every row, warm or
    not); ``rank`` is the most severe confirmed level's once warm and with ``logp_correct``."""

    __slots__ = (
        "_confirmed",
        "conf",
        "hold1",
        "hold2",
        "level",
        "rank",
        "recover_after",
        "since1",
        "since2",
    )
    kind = "trend_levels"
    kinds = ()  # (feeds the phase machine its rank: stagnation and decay are the machine's)

    def reset(self) -> None:
        n = self.config.trend_levels
        # per trend level: consecutive tests that held stagnation-or-worse / decay
        self.hold1 = [0] * n
        self.hold2 = [0] * n
        self.since1 = [0.0] * n  # step of the first test of each streak
        self.since2 = [0.0] * n
        self.conf = [0] * n  # confirmed rank per level
        self.level = -1  # the level behind the confirmed rank
        self.rank = 0
        self.recover_after = 0.0
        self._confirmed = 0  # the confirmed rank before the warm-up / logp gate (from conf)

    def update(self, s: Signals) -> list[Alert]:
        closed = s.lp_closed
        if closed:
            self._trend_levels(s, closed)
        self.rank = self._confirmed if s.warm and C.LOGP_CORRECT in s.seen else 0
        return NO_ALERTS

    def _level_rank(self, s: Signals, level: int) -> int:
        """What one trend level says now: 0 nothing, 1 stagnation, 2 decay."""
        cfg = self.config
        lp_ms, rw_ms = s.lp_trend, s.rw_trend
        # cheap pre-checks (ends of the window) before the fits: most windows show no move
        lp_move = lp_ms.end_change(level)
        f = None
        if lp_move <= -0.5 * cfg.decay_min_drop:
            f = lp_ms.fit(level, need_t=2.0)  # None: no decline or rise of note
        if f is not None and -f.change >= cfg.decay_min_drop and f.t <= -s.t_crit(f):
            # declining steadily over the window, still going down, while the reward holds
            # (Phase II); with the reward fallen it is a dip or already the collapse
            if not lp_ms.late_slope(level) < 0.0:
                return 0
            return 0 if s.ratios()[3] >= cfg.reward_fall_frac else 2
        rw_move = rw_ms.end_change(level)
        if not (rw_move > 0.0 and abs(lp_move) <= 2.0 * cfg.flat_tol):
            return 0
        r = rw_ms.fit(level, need_t=2.0)
        if r is None or not (r.t >= s.t_crit(r)):
            return 0  # stagnation needs the reward rising at this scale
        rise = r.last - r.first
        if rise < cfg.reward_min_rise * max(abs(r.first), abs(r.last), 1e-12):
            return 0
        f = lp_ms.fit(level)
        if f is None or abs(f.change) > cfg.flat_tol or f.se_change > cfg.flat_tol:
            return 0  # not flat, or flatness not established at this noise
        if f.t >= 0.0:
            return 0  # any sign of a rise: in learning runs logp_correct rises with the reward
        if s.ratios()[3] > cfg.reward_fall_frac / 3:
            return 0  # recovering from a dip is not learning
        return 1

    def _trend_levels(self, s: Signals, closed: list[int]) -> None:
        """Re-test the levels whose bins just closed and update the confirmed trend rank.

        A level's condition is confirmed when it has held at ``trend_persist - 1`` (at least 2)
        consecutive tests (each test adds one closed bin: at least two new bins beyond the first
        test's window) spanning at least ``trend_persist - 1`` of its bins in steps. Dense logs
        need both: ``trend_persist`` tests. A sparse log (or a rollout batch repeated over more
        rows than a bin holds) closes one bin of one observation per test, so the count of tests,
        not the steps, says how much new data confirmed the condition (two tests, one new
        observation of ten, were enough before, and raised most false alarms of sparse logs).

        A test runs when a bin closes, i.e. at a row of a later bin, so the steps between the
        tests of a dense log jitter by up to a log interval: ``trend_persist`` tests of bins that
        hold several observations each span ``trend_persist - 1`` new bins even when their steps
        fall a few short (4 tests of 48-step bins logged every 10 steps: 140 steps, not 144), and
        they confirm it.
        """
        step = s.step
        need = self.config.trend_persist
        tests = max(need - 1, 2)
        h1, h2, s1, s2, conf = self.hold1, self.hold2, self.since1, self.since2, self.conf
        trend = s.lp_trend
        base = trend.base_steps
        changed = False
        for level in closed:
            r = self._level_rank(s, level)
            span = (need - 1) * base * 2.0**level
            before = conf[level]
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
            # (trend_persist tests of bins of several observations: new bins, whatever the steps)
            dense = trend.last_count(level) >= 2.0
            ok2 = h2[level] >= tests and (step - s2[level] >= span or (dense and h2[level] >= need))
            ok1 = h1[level] >= tests and (step - s1[level] >= span or (dense and h1[level] >= need))
            conf[level] = 2 if ok2 else (1 if ok1 else 0)
            changed |= before != conf[level]
        if changed:
            self._confirm()

    def _confirm(self) -> None:
        """Most severe confirmed level (among equals the finest, the earliest to see it)."""
        best, lvl = 0, -1
        for j, r in enumerate(self.conf):
            if r > best:
                best, lvl = r, j
        self._confirmed, self.level = best, lvl
        # a trend phase is left after three windows of the scale that saw it without support
        # (a decline that becomes sure only later must not pass through healthy)
        cfg = self.config  # (the window of a level as MultiScaleTrend.window_steps)
        window = int(cfg.trend_bins) * float(cfg.trend_base_steps) * 2.0**lvl
        self.recover_after = 3.0 * window if lvl >= 0 else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "hold1": list(self.hold1),
            "hold2": list(self.hold2),
            "since1": list(self.since1),
            "since2": list(self.since2),
            "conf": list(self.conf),
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.reset()
        self.hold1 = [int(v) for v in d["hold1"]]
        self.hold2 = [int(v) for v in d["hold2"]]
        self.since1 = [float(v) for v in d["since1"]]
        self.since2 = [float(v) for v in d["since2"]]
        self.conf = [int(v) for v in d["conf"]]
        self._confirm()
