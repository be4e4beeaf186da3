"""``PhaseMachine``: the detector's phase from its checks' ranks (escalation, persistence,
recovery).

Escalate to stagnation / decay as soon as a check confirms rank 1 / 2 (trend ranks are confirmed
by their own persistence), to collapse once rank 3 has held ``collapse_persist_steps``; leave a
phase once no check has supported it for the recovery span (``recover_steps`` or longer, see
``Check.recover_after``), never while a collapsed run's reward stays below half its peak.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lld_monitor import columns as C
from lld_monitor.analysis import messages
from lld_monitor.analysis.checks.base import Check
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.signals import Signals, _dec, _enc
from lld_monitor.events import Alert

_NAN = float("nan")
RANK: dict[str, int] = {"unknown": 0, "healthy": 0, "stagnation": 1, "decay": 2, "collapse": 3}
BY_RANK: dict[int, str] = {1: "stagnation", 2: "decay", 3: "collapse"}


class PhaseMachine:
    """The phase, its escalation streaks and its recovery; ``update`` once per row, after the
    checks."""

    __slots__ = (
        "below_rank",
        "config",
        "phase",
        "recover",
        "since_below",
        "since_r3",
    )

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.reset()

    def reset(self) -> None:
        self.phase = "unknown"
        # first step of the current streak of each rank (NaN: not holding), of "below"
        self.since_r3 = self.since_below = _NAN
        self.below_rank = 0
        self.recover = float(self.config.recover_steps)  # steps without support before leaving

    def update(
        self,
        s: Signals,
        checks: Sequence[Check],
        trend_level: int,
        alerts: list[Alert],
        immediate: Sequence[Any] = (),
    ) -> None:
        """Decide this row's phase from the checks' ranks; append the phase alerts to
        ``alerts``. ``trend_level``: the trend level behind a stagnation / decay rank (its
        numbers go into the evidence; -1 none). ``immediate``: checks whose ``pending`` alert
        escalates to collapse on its own row (their persistence is their own)."""
        shift = None
        for c in immediate:
            if c.pending is not None:
                shift = c.pending
                break
        tr = rank = 0
        for c in checks:
            r = c.rank
            if r:
                if r >= 3:
                    rank = 3
                elif r > tr:
                    tr = r
        step = s.step
        cur = RANK[self.phase]
        target = cur
        # trend ranks are confirmed by their own level (trend_persist): they escalate at once;
        # collapse must hold collapse_persist_steps
        if tr > target:
            target = tr
        if rank >= 3:
            t0 = self.since_r3
            if t0 != t0:
                self.since_r3 = t0 = step
            if step - t0 >= self.config.collapse_persist_steps and 3 > target:
                target = 3
        else:
            self.since_r3 = _NAN
        istep = int(step)
        if target > cur:
            new = BY_RANK[target]
            ev = messages.phase_evidence(s, trend_level)
            told = shift is not None and new == "collapse"
            alert = messages.phase_alert(istep, self.phase, new, ev, reward_told=told)
            if told:  # both on one row: one alert
                alert = messages.level_shift_phase_alert(
                    istep, self.phase, shift, s, trend_level, alert
                )
            alerts.append(alert)
            self.phase = new
            self.since_below = _NAN
            # a phase is left after its check's recovery span without support (a trend phase:
            # three windows of the scale that saw it)
            span = max((c.recover_after for c in checks if c.rank == target), default=0.0)
            self.recover = max(float(self.config.recover_steps), span)
        elif shift is not None and cur < 3:
            lld = None
            if C.LOGP_CORRECT in s.seen:
                ev = messages.phase_evidence(s, trend_level)
                lld = messages.phase_alert(istep, self.phase, "collapse", ev, reward_told=True)
            alerts.append(
                messages.level_shift_phase_alert(istep, self.phase, shift, s, trend_level, lld)
            )
            self.phase = "collapse"
            self.since_below = _NAN
            self.recover = float(self.config.recover_steps)
            target = 3
        elif max(rank, tr) < cur and not (cur == 3 and self._reward_still_fallen(s)):
            rank = max(rank, tr)
            t0 = self.since_below
            if t0 != t0:
                self.since_below = step
                self.below_rank = rank
            else:
                self.below_rank = max(self.below_rank, rank)
                if step - t0 >= self.recover:
                    old = self.phase
                    self.phase = BY_RANK.get(self.below_rank, self.base_phase(s))
                    self.since_below = _NAN
                    alerts.append(messages.phase_left_alert(istep, old, self.phase, step - t0))
        else:
            self.since_below = _NAN
        if cur == 0 and s.warm and target == 0:
            self.phase = self.base_phase(s)

    @staticmethod
    def _reward_still_fallen(s: Signals) -> bool:
        """True while the reward (fast EMA) stays below half its peak (the collapse-step rule):
        a collapsed run whose reward never came back is not healthy once its signals go quiet."""
        fall = s.ratios()[3]
        return fall == fall and fall >= 0.5

    @staticmethod
    def base_phase(s: Signals) -> str:
        """``healthy`` when the LLD signal is there to say so, else ``unknown``."""
        return "healthy" if C.LOGP_CORRECT in s.seen else "unknown"

    def state_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "since": {
                "r3": _enc(self.since_r3),
                "below": _enc(self.since_below),
            },
            "below_rank": self.below_rank,
            "recover": self.recover,
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.reset()
        self.phase = str(d["phase"])
        since = d["since"]
        self.since_r3 = _dec(since["r3"])
        self.since_below = _dec(since["below"])
        self.below_rank = int(d["below_rank"])
        self.recover = float(d["recover"])
