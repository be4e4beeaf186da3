"""Failures that are not LLD: dead signal, entropy collapse, length blow-up, reward decline,
KL blow-up, truncation (warnings). One class each; they share the episode logic of
``PersistentCheck``: a condition that holds ``failure_persist_steps`` fires once, and re-arms
after it has been clear as long. All wait for the warm-up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lld_monitor.analysis import messages
from lld_monitor.analysis.checks.base import NO_ALERTS, Check
from lld_monitor.analysis.signals import Signals, _dec, _enc
from lld_monitor.events import Alert

_NAN = float("nan")


class PersistentCheck(Check):
    """A condition held ``failure_persist_steps`` (in steps) fires once per episode."""

    __slots__ = ("fired", "since", "since_off")

    def holds(self, s: Signals) -> bool:
        """The condition on this row."""
        raise NotImplementedError

    def alert(self, s: Signals, held: float) -> Alert:
        """The alert, ``held`` steps into the episode."""
        raise NotImplementedError

    def may_fire(self, s: Signals) -> bool:
        """An extra gate on firing (not on the streak); True unless a subclass needs more."""
        return True

    def reset(self) -> None:
        self.since = _NAN  # first step of the current streak of the condition (NaN: not holding)
        self.since_off = _NAN  # first step of the condition's current absence, once fired
        self.fired = False

    def update(self, s: Signals) -> list[Alert]:
        if not s.warm:
            return NO_ALERTS
        if self.holds(s):
            step = s.step
            self.since_off = _NAN
            t0 = self.since
            if t0 != t0:
                self.since = t0 = step
            held = step - t0
            if held >= self.config.failure_persist_steps and not self.fired and self.may_fire(s):
                self.fired = True
                return [self.alert(s, held)]
        elif self.fired:  # re-arm once the condition has been clear long enough
            self.since = _NAN
            step = s.step
            t0 = self.since_off
            if t0 != t0:
                self.since_off = t0 = step
            if step - t0 >= self.config.failure_persist_steps:
                self.fired = False
        else:
            self.since = _NAN
        return NO_ALERTS

    def state_dict(self) -> dict[str, Any]:
        return {"since": _enc(self.since), "since_off": _enc(self.since_off), "fired": self.fired}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.reset()
        self.since = _dec(d["since"])
        self.since_off = _dec(d["since_off"])
        self.fired = bool(d["fired"])


class DeadSignal(PersistentCheck):
    """Every group gets the same reward (``frac_zero_std_groups`` >= ``dead_zero_std`` or
    ``reward_std`` <= ``dead_reward_std``): GRPO advantages are zero."""

    __slots__ = ()
    kind = "dead_signal"

    def holds(self, s: Signals) -> bool:
        cfg = self.config
        return s.frac_zero_std_groups >= cfg.dead_zero_std or s.reward_std <= cfg.dead_reward_std

    def alert(self, s: Signals, held: float) -> Alert:
        return messages.dead_signal_alert(int(s.step), held, s.frac_zero_std_groups, s.reward_std)


class EntropyCollapse(PersistentCheck):
    """Entropy (fast EMA) below ``entropy_floor_frac`` of its level over the warm-up rows."""

    __slots__ = ()
    kind = "entropy_collapse"

    def holds(self, s: Signals) -> bool:
        he = s.entropy_early
        return he > 0.0 and s.entropy_ema.fast <= self.config.entropy_floor_frac * he

    def alert(self, s: Signals, held: float) -> Alert:
        return messages.entropy_collapse_alert(
            int(s.step), held, s.entropy_ema.fast, s.entropy_early
        )


class LengthBlowup(PersistentCheck):
    """Completion length (fast EMA) above ``length_blowup_ratio`` times its early level."""

    __slots__ = ()
    kind = "length_blowup"

    def holds(self, s: Signals) -> bool:
        le = s.length_early
        return le > 0.0 and s.length_ema.fast >= self.config.length_blowup_ratio * le

    def alert(self, s: Signals, held: float) -> Alert:
        return messages.length_blowup_alert(int(s.step), held, s.length_ema.fast, s.length_early)


class RewardDecline(PersistentCheck):
    """A significant slow reward decline (``Signals.rw_decline``) outside a collapse phase,
    held a quarter of the window it was seen in."""

    __slots__ = ()
    kind = "reward_decline"

    def holds(self, s: Signals) -> bool:
        return s.phase != "collapse" and s.rw_decline is not None

    def may_fire(self, s: Signals) -> bool:
        """A decline seen over a window of W steps has held W / 4 steps (and the usual
        ``failure_persist_steps``): a transient dip that recovers within a quarter of the window
        it was seen in is not a decline."""
        r = s.rw_decline
        return r is not None and s.step - self.since >= 0.25 * r.span

    def alert(self, s: Signals, held: float) -> Alert:
        return messages.reward_decline_alert(int(s.step), held, s.rw_decline)


class KlBlowup(PersistentCheck):
    """KL (fast EMA) above ``kl_blowup_ratio`` times its settled level (at least ``kl_floor``)."""

    __slots__ = ()
    kind = "kl_blowup"

    def holds(self, s: Signals) -> bool:
        cfg = self.config
        ref = s.kl_ref
        kl_ref = max(ref, cfg.kl_floor) if ref == ref else _NAN
        return s.kl_ema.fast >= cfg.kl_blowup_ratio * kl_ref

    def alert(self, s: Signals, held: float) -> Alert:
        ref = max(s.kl_ref, self.config.kl_floor)
        return messages.kl_blowup_alert(int(s.step), held, s.kl_ema.fast, ref)


class Truncation(PersistentCheck):
    """Most completions cut at the length cap (``frac_truncated`` fast EMA >= ``truncation_frac``)
    over at least ``truncation_min_rows`` logged rows (one or two batches of a sparse log are not
    enough, however many steps apart)."""

    __slots__ = ()
    kind = "truncation"

    def holds(self, s: Signals) -> bool:
        return s.truncated_ema.fast >= self.config.truncation_frac

    def may_fire(self, s: Signals) -> bool:
        return s.trunc_rows >= self.config.truncation_min_rows

    def alert(self, s: Signals, held: float) -> Alert:
        return messages.truncation_alert(
            int(s.step), held, s.truncated_ema.fast, s.trunc_rows, self.config.truncation_frac
        )
