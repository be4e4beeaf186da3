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


#: Packages whose frames a warning skips to reach the user's line: this one and the libraries it
#: is called from during training (the trainer loop, its callbacks, torch).
_INTERNAL_PACKAGES: tuple[str, ...] = (
    "lld_monitor",
    "transformers",
    "trl",
    "accelerate",
    "torch",
    "verl",
    "ray",
)


def _internal_dirs() -> tuple[str, ...]:
    """The folders of the imported ``_INTERNAL_PACKAGES`` (with a trailing separator)."""
    import os
    import sys

    dirs = []
    for name in _INTERNAL_PACKAGES:
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointing at the user's own line (the first frame outside this package
    and the training libraries that call it), not at the package's code: the ``stacklevel`` is
    counted, not guessed."""
    import sys
    import warnings

    internal = _internal_dirs()
    frame = sys._getframe(1)
    level = 2  # stacklevel 2 is warn_user's caller
    while frame is not None and frame.f_code.co_filename.startswith(internal):
        frame = frame.f_back
        level += 1
    if frame is None:  # all internal (a thread the package started): the caller's line
        level = 2
    warnings.warn(message, category, stacklevel=level)
