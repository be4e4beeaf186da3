"""The action policy: what the monitor's settings do on an alert (``decide(alert)``).

Pure: :meth:`ActionPolicy.decide` returns ``[(action, reason), ...]`` and touches nothing; the
monitor carries the actions out (switch LLDS on, ask the trainer to stop or to save) and
records each as an ``intervention`` event with its reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from lld_monitor.events import Alert

#: Alert kinds on which ``auto_llds=True`` switches LLDS on by default: the earliest credible
#: signals (the paper's phases I and II, and its >50%-displaced indicator), collapse as the last
#: resort.
AUTO_LLDS_KINDS: tuple[str, ...] = ("stagnation", "decay", "displacement", "collapse")
#: Alert kinds ``auto_llds_on`` accepts.
AUTO_LLDS_ACCEPTED: tuple[str, ...] = ("stagnation", "decay", "displacement", "collapse")
#: Alert kinds on which ``stop_on_collapse`` / ``checkpoint_on_collapse`` act.
COLLAPSE_KINDS: tuple[str, ...] = ("collapse",)
#: Lambda used by ``auto_llds`` when no ``LLDSConfig`` was given (the paper's value).
AUTO_LLDS_LAMBDA = 0.2

#: Action names (also the ``kind`` of their intervention events).
LLDS_ENABLE, STOP, CHECKPOINT = "llds_enable", "stop", "checkpoint"


class ActionPolicy:
    """``auto_llds`` on the ``auto_llds_on`` kinds; stop / checkpoint on a collapse."""

    def __init__(
        self,
        auto_llds: bool = False,
        auto_llds_on: Sequence[str] = AUTO_LLDS_KINDS,
        stop_on_collapse: bool = False,
        checkpoint_on_collapse: bool = False,
    ) -> None:
        known = AUTO_LLDS_ACCEPTED
        if isinstance(auto_llds_on, str) or not set(auto_llds_on) <= set(known):
            raise ValueError(
                f"auto_llds_on must be a sequence of alert kinds from {known} (default "
                f"{AUTO_LLDS_KINDS}), got {auto_llds_on!r}"
            )
        self.auto_llds = bool(auto_llds)
        self.auto_llds_on = tuple(auto_llds_on)
        self.stop_on_collapse = bool(stop_on_collapse)
        self.checkpoint_on_collapse = bool(checkpoint_on_collapse)

    def decide(self, alert: Alert, llds_enabled: bool) -> list[tuple[str, str]]:
        """The actions these settings take on ``alert``: ``[(action, reason), ...]``."""
        actions = []
        if self.auto_llds and alert.kind in self.auto_llds_on and not llds_enabled:
            actions.append((LLDS_ENABLE, f"auto_llds on a {alert.kind} alert at step {alert.step}"))
        if alert.kind in COLLAPSE_KINDS:
            if self.stop_on_collapse:
                actions.append((STOP, f"stop_on_collapse on a collapse alert at step {alert.step}"))
            if self.checkpoint_on_collapse:
                actions.append((CHECKPOINT, f"checkpoint_on_collapse at step {alert.step}"))
        return actions
