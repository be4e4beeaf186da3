"""The LLDS watchdog: after LLDS switches on, keep it acting where it should (issue 51, item 2).

Users of LLDS report two ways it goes wrong: it never acts (its loss stays 0: the ``llds_inert``
alert says so) or it acts too hard (coefficient 0.05 with a chunk gate, exact match 0.250 ->
0.000, "policy locked"). The watchdog watches the run's own rows while LLDS is on:

- **raise**: the displaced share of correct responses (the probe's ``frac_correct_displaced``,
  else the in-batch share) above the paper's one half (``displaced_max``) on average over the
  last ``window_rows`` measured rows, while the gate is active (``llds_frac_gated`` > 0 or a
  nonzero ``llds_loss``): LLDS is on but displacement goes on; lambda x ``raise_factor``, at
  most ``lam_max``;
- **back off**: the reward fell after LLDS went on while the gate was active: the mean of the
  last ``reward_rows`` rewards below the mean of the ``reward_rows`` rewards before LLDS went on
  by a one-sided Welch t of at least ``fall_z`` (2.33: about 1% for noise alone) and by at least
  ``fall_frac`` of it (20%); lambda x ``backoff_factor``; below ``lam_min`` LLDS goes off. A
  reward is a measurement, not a row: a value equal to the one before is the same rollout
  batch's reward logged again at its next update (the toy testbed and TRL with
  ``steps_per_generation`` log one batch's reward on each of its updates) and counts once; 16
  copies of one batch taken as 16 samples gave t = -inf on the first batch after LLDS went on
  (the first d7 measurement, sample_runs/README.md).

Every change waits ``cooldown_rows`` rows after the previous one, and is an intervention event
with its reason and numbers (``LLDSSwitch``'s ``on_change``: the dashboard's lambda trace and
stars, the analysis's story). Pure: ``update(row, enabled, lam)`` returns the decision; the
monitor carries it out. Off by default (``llds_watchdog=True`` turns it on): on the testbed's
fast collapsing preset it ended below automatic LLDS at a fixed lambda on most seeds
(sample_runs/README.md, "The LLDS watchdog"): in a run that collapses anyway, the reward's fall
after LLDS went on reads as LLDS's doing, and the back-off takes LLDS away.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lld_monitor import columns as C


@dataclass(frozen=True)
class WatchdogConfig:
    """The watchdog's bounds and tests (module docstring)."""

    displaced_max: float = 0.5
    window_rows: int = 8
    raise_factor: float = 1.5
    lam_max: float = 1.0
    backoff_factor: float = 0.5
    lam_min: float = 0.05
    reward_rows: int = 16
    fall_z: float = 2.33
    fall_frac: float = 0.2
    cooldown_rows: int = 16


@dataclass(frozen=True)
class Decision:
    """What the watchdog asks: ``action`` "raise" | "lower" | "off", the new lambda, why."""

    action: str
    lam: float
    reason: str
    evidence: dict[str, Any]


def _num(row: Mapping[str, Any], key: str) -> float:
    v = row.get(key)
    try:
        f = float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def welch_t(a: list[float], b: list[float]) -> float:
    """Welch's t of mean(b) - mean(a) (negative: b lower); NaN with fewer than 2 values each."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1)
    se = math.sqrt(va / len(a) + vb / len(b))
    if se == 0.0:
        return -math.inf if mb < ma else (math.inf if mb > ma else 0.0)
    return (mb - ma) / se


class LLDSWatchdog:
    """Feed every row (``update``); a ``Decision`` when lambda should change, else None."""

    def __init__(self, config: WatchdogConfig | None = None) -> None:
        self.config = config or WatchdogConfig()
        self.reset()

    def reset(self) -> None:
        cfg = self.config
        self.recent: deque[float] = deque(maxlen=cfg.reward_rows)  # the last rewards measured
        self.last_reward = math.nan  # the last finite reward logged (a repeat counts once)
        self.before: list[float] = []  # the rewards before LLDS went on
        self.after: deque[float] = deque(maxlen=cfg.reward_rows)
        self.displaced: deque[float] = deque(maxlen=cfg.window_rows)
        self.on = False
        self.gate_seen = False
        self.since_change = 0
        self.on_step: int | None = None

    def update(self, row: Mapping[str, Any], enabled: bool, lam: float) -> Decision | None:
        cfg = self.config
        reward = _num(row, C.REWARD_MEAN)
        step = int(_num(row, C.STEP)) if math.isfinite(_num(row, C.STEP)) else None
        fresh = math.isfinite(reward) and reward != self.last_reward  # (a repeat: same batch)
        if math.isfinite(reward):
            self.last_reward = reward
        if not enabled:
            self.on = False
            if fresh:
                self.recent.append(reward)
            return None
        if not self.on:  # LLDS just went on: the rows before are the reference
            self.on, self.on_step, self.gate_seen = True, step, False
            self.before = list(self.recent)
            self.after.clear()
            self.displaced.clear()
            self.since_change = 0
        self.since_change += 1
        if fresh:
            self.after.append(reward)
        gated, loss = _num(row, C.LLDS_FRAC_GATED), _num(row, C.LLDS_LOSS)
        active = (math.isfinite(gated) and gated > 0) or (math.isfinite(loss) and loss > 0)
        self.gate_seen = self.gate_seen or active
        share = _num(row, C.FRAC_CORRECT_DISPLACED)
        if not math.isfinite(share):
            share = _num(row, C.INBATCH_FRAC_CORRECT_DISPLACED)
        if math.isfinite(share):
            self.displaced.append(share)
        if self.since_change < cfg.cooldown_rows:
            return None
        fall = self._fall()
        if fall is not None and self.gate_seen:
            t, m0, m1 = fall
            new = lam * cfg.backoff_factor
            numbers = (
                f"reward {m0:.3g} over the {len(self.before)} rewards logged before LLDS went on "
                f"(step {self.on_step}) -> {m1:.3g} over the last {len(self.after)}, t={t:.1f}"
            )
            evidence = {"t": t, "reward_before": m0, "reward_after": m1, "lam_was": lam}
            self._changed()
            if new < cfg.lam_min:
                return Decision("off", lam, f"llds_watchdog: {numbers}; LLDS off", evidence)
            return Decision(
                "lower", new, f"llds_watchdog: {numbers}; lambda {lam:g} -> {new:g}", evidence
            )
        if active and len(self.displaced) >= max(2, cfg.window_rows // 2) and lam < cfg.lam_max:
            mean = sum(self.displaced) / len(self.displaced)
            if mean > cfg.displaced_max:
                new = min(cfg.lam_max, lam * cfg.raise_factor)
                reason = (
                    f"llds_watchdog: {100 * mean:.0f}% of correct responses displaced over the "
                    f"last {len(self.displaced)} measured rows with LLDS on (above the paper's "
                    f"{100 * cfg.displaced_max:.0f}%); lambda {lam:g} -> {new:g}"
                )
                self._changed()
                return Decision("raise", new, reason, {"displaced": mean, "lam_was": lam})
        return None

    def _fall(self) -> tuple[float, float, float] | None:
        """(t, mean before, mean after) when the reward fell by the stated test, else None."""
        cfg = self.config
        if len(self.before) < cfg.reward_rows // 2 or len(self.after) < cfg.reward_rows:
            return None
        a, b = list(self.before), list(self.after)
        m0, m1 = sum(a) / len(a), sum(b) / len(b)
        t = welch_t(a, b)
        if t <= -cfg.fall_z and (m0 - m1) >= cfg.fall_frac * abs(m0) and m0 != 0.0:
            return t, m0, m1
        return None

    def _changed(self) -> None:
        self.since_change = 0
        self.after.clear()
        self.displaced.clear()

    def state_dict(self) -> dict[str, Any]:
        return {
            "recent": list(self.recent),
            "before": list(self.before),
            "after": list(self.after),
            "displaced": list(self.displaced),
            "on": self.on,
            "gate_seen": self.gate_seen,
            "since_change": self.since_change,
            "on_step": self.on_step,
            "last_reward": self.last_reward if math.isfinite(self.last_reward) else None,
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.reset()
        self.recent.extend(float(x) for x in d["recent"])
        self.before = [float(x) for x in d["before"]]
        self.after.extend(float(x) for x in d["after"])
        self.displaced.extend(float(x) for x in d["displaced"])
        self.on, self.gate_seen = bool(d["on"]), bool(d["gate_seen"])
        self.since_change = int(d["since_change"])
        self.on_step = d["on_step"]
        last = d.get("last_reward")
        self.last_reward = math.nan if last is None else float(last)
