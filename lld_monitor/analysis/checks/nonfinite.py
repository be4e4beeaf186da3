"""``Nonfinite``: a non-finite loss or reward, or non-finite grad norms several rows in a row
(critical)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lld_monitor.analysis import messages
from lld_monitor.analysis.checks.base import NO_ALERTS, Check
from lld_monitor.analysis.signals import Signals
from lld_monitor.events import Alert


class Nonfinite(Check):
    """Fires once per episode of non-finite values (``Signals.bad_loss`` or ``bad_reward``, or
    ``bad_grad`` on
    ``nonfinite_grad_rows`` consecutive rows); re-arms on a row with a finite grad norm and
    loss. Counted from the first row (no warm-up): a NaN is a failure whenever it comes."""

    __slots__ = ("fired", "grad_bad")
    kind = "nonfinite"

    def reset(self) -> None:
        self.grad_bad = 0  # consecutive non-finite grad norms
        self.fired = False

    def update(self, s: Signals) -> list[Alert]:
        bad_grad = s.bad_grad
        self.grad_bad = self.grad_bad + 1 if bad_grad else 0
        if s.bad_loss or s.bad_reward or self.grad_bad >= self.config.nonfinite_grad_rows:
            if not self.fired:
                self.fired = True
                return [
                    messages.nonfinite_alert(
                        int(s.step),
                        s.loss,
                        s.grad_norm,
                        s.bad_loss,
                        bad_grad,
                        self.grad_bad,
                        reward=s.reward_mean if s.bad_reward else None,
                    )
                ]
        elif not bad_grad:
            self.fired = False
        return NO_ALERTS

    def state_dict(self) -> dict[str, Any]:
        return {"grad_bad": self.grad_bad, "fired": self.fired}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.reset()
        self.grad_bad = int(d["grad_bad"])
        self.fired = bool(d["fired"])
