"""Detection and actions: the policy that decides what an alert does, and the responder that acts.

The action policy: what the monitor's settings do on an alert (``decide(alert)``).

Pure: :meth:`ActionPolicy.decide` returns ``[(action, reason), ...]`` and touches nothing; the
monitor carries the actions out (switch LLDS on, ask the trainer to stop or to save) and
records each as an ``intervention`` event with its reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lld_monitor.events import Alert, make_event

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


# --- detection: each row to the detector, its phase and alerts recorded, acted on ---
# Detection and actions: each row to the detector, its phase and alerts on the record, acted on.
#
# :class:`Responder` feeds the online detector one row per step (every rank, same rows -> same
# alerts), records a ``phase`` event when the phase changes and an ``alert`` event per alert, and
# carries out what the :class:`ActionPolicy` decides: it switches LLDS on
# itself, and hands the trainer requests (stop, checkpoint) to ``request``. Each action is an
# ``intervention`` event with its reason.


def phase_message(previous: str | None, phase: str) -> str | None:
    """The ``phase`` event's message for a change ``previous -> phase``; None when unchanged.

    A run that starts healthy says nothing: the first phase is recorded only when it is not
    ``"healthy"``.
    """
    if phase == previous or (previous is None and phase == "healthy"):
        return None
    if previous is None:
        return f"phase {phase} at the first analysed step"
    return f"phase {previous} -> {phase}"


class Responder:
    """The detector of a run and what its alerts do.

    ``emit(event)`` records an event (rank 0), ``alert_sink(alert)`` passes an alert to the sinks,
    ``request(action)`` asks the trainer to stop or to save, ``guard(where)`` is the failure
    policy around the detector. ``llds_given``: the user gave an ``LLDSConfig``, whose lambda an
    automatic switch keeps (else the paper's ``AUTO_LLDS_LAMBDA``).
    """

    def __init__(
        self,
        detector: Any | None,
        policy: ActionPolicy,
        llds: Any,
        *,
        llds_given: bool,
        emit: Callable[[dict[str, Any]], None],
        alert_sink: Callable[[Alert], None],
        request: Callable[[str], None],
        guard: Callable[[str], Any],
    ) -> None:
        self.detector = detector
        self.policy = policy
        self.llds = llds
        self.llds_given = llds_given
        self._emit = emit
        self._alert_sink = alert_sink
        self._request = request
        self._guard = guard
        self.phase: str | None = None  # the last phase recorded (None before the first row)
        self.last_alerts: list[Alert] = []

    def update(self, row: Mapping[str, Any], step: int) -> list[Alert]:
        """Feed ``row``; record a phase change and each alert, and act on the alerts."""
        if self.detector is None:
            self.last_alerts = []
            return []
        alerts: list[Alert] = []
        with self._guard("detector"):
            alerts = list(self.detector.update(row) or [])
        self.last_alerts = alerts
        phase = getattr(self.detector, "phase", None)
        if phase is not None and phase != self.phase:
            msg = phase_message(self.phase, phase)
            if msg is not None:
                evidence = {"previous": self.phase}
                self._emit(make_event("phase", step, str(phase), msg, "info", evidence))
            self.phase = phase
        for alert in alerts:
            self._emit(alert.to_event())
            self._alert_sink(alert)
            self.act(alert, step)
        return alerts

    def act(self, alert: Alert, step: int) -> None:
        """Carry out the policy's actions on ``alert``, each an ``intervention`` event."""
        for action, reason in self.policy.decide(alert, self.llds.enabled):
            evidence = {"alert": alert.kind}
            if action == LLDS_ENABLE:
                if self.llds.blocked is not None:
                    msg = f"{reason}: refused, {self.llds.blocked}"
                    kind = "llds_enable_refused"
                    self._emit(make_event("intervention", step, kind, msg, "warning", evidence))
                    continue
                lam = self.llds.lam if self.llds_given else AUTO_LLDS_LAMBDA
                self.llds.enable(lam, reason=reason)
                continue
            self._request(action)
            self._emit(make_event("intervention", step, action, reason, "warning", evidence))
