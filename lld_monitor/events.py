"""Alerts and run events: the records the analyzer emits and the run log stores."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from lld_monitor import columns as C


@dataclass(frozen=True)
class Alert:
    """One alert: what was seen, at which step, how bad, and the numbers behind it."""

    step: int
    # LLD: stagnation | decay | collapse | displacement; not LLD: nonfinite | dead_signal |
    # entropy_collapse | length_blowup | mode_collapse | reward_decline | kl_blowup |
    # truncation | spike; the phase machine's: phase (docs/analyzer.md lists them all)
    kind: str
    severity: str  # info | warning | critical
    message: str  # human-readable, names the evidence with numbers
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in C.SEVERITIES:
            raise ValueError(f"severity must be one of {C.SEVERITIES}, got {self.severity!r}")

    def to_event(self) -> dict[str, Any]:
        """The run-log event dict for this alert."""
        return make_event("alert", self.step, self.kind, self.message, self.severity, self.evidence)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_event(
    type: str,
    step: int | None,
    kind: str,
    message: str,
    severity: str = "info",
    evidence: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build an event-log record (see docs/run-format.md)."""
    if type not in C.EVENT_TYPES:
        raise ValueError(f"event type must be one of {C.EVENT_TYPES}, got {type!r}")
    if severity not in C.SEVERITIES:
        raise ValueError(f"severity must be one of {C.SEVERITIES}, got {severity!r}")
    return {
        C.EVENT_TYPE: type,
        C.EVENT_STEP: None if step is None else int(step),
        C.EVENT_TIME: time.time(),
        C.EVENT_KIND: kind,
        C.EVENT_SEVERITY: severity,
        C.EVENT_MESSAGE: message,
        C.EVENT_EVIDENCE: dict(evidence or {}),
    }
