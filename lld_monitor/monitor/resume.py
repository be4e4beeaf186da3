"""The monitor's resume state: what a run resumed from a checkpoint needs, as plain JSON.

:func:`monitor_state` builds the state the adapters save with every Trainer checkpoint;
:func:`parse_state` checks one before the monitor adopts it. A resumed run folder keeps its
rows: :func:`last_logged_step` finds the last one, and :func:`replaying` tells which steps (and
their alert/phase/intervention events) a run resumed from an earlier checkpoint replays, so
they are not written twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lld_monitor import columns as C

#: Version of :func:`monitor_state`'s layout.
STATE_VERSION = 1
#: Event types of a step that a resumed folder already holds are not written again.
REPLAYED_EVENT_TYPES = ("alert", "phase", "intervention")


@dataclass(frozen=True)
class MonitorState:
    """A checked :func:`monitor_state`."""

    step: int
    llds_enabled: bool
    llds_lam: float
    phase: str | None = None
    detector: Any | None = None  # the detector's own state_dict
    reward_fn_names: tuple[str, ...] = ()
    correctness: Mapping[str, Any] = field(default_factory=dict)  # ThresholdWatch's state
    watchdog: Mapping[str, Any] | None = None  # LLDSWatchdog's state (None: off, or older)

    def restore_message(self) -> str:
        """The ``restore`` event's message."""
        llds = f"on (lambda={self.llds_lam:g})" if self.llds_enabled else "off"
        return (
            f"monitor state restored from the checkpoint before step {self.step}: LLDS {llds}, "
            f"phase {self.phase}"
        )

    def restore_note(self, asked_on: bool, asked_lam: float) -> tuple[str, dict[str, Any]]:
        """The restore event's message and evidence; ``asked_*``: the LLDS switch the resumed
        script configured (the checkpoint's wins, and the message says so when they differ:
        ``asked_llds_enabled`` is then in the evidence)."""
        evidence: dict[str, Any] = {
            "llds_enabled": int(self.llds_enabled),
            "llds_lam": self.llds_lam,
        }
        message = self.restore_message()
        asked = (asked_on, asked_lam if asked_on else None)
        if asked != (self.llds_enabled, self.llds_lam if self.llds_enabled else None):
            was = f"on (lambda={asked_lam:g})" if asked_on else "off"
            now = f"on (lambda={self.llds_lam:g})" if self.llds_enabled else "off"
            message += (
                f"; this script asked for LLDS {was}, the checkpoint's switch wins: LLDS is "
                f"{now} as it was when the checkpoint was saved (monitor.llds.enable() / "
                "disable() after attach changes it)"
            )
            evidence["asked_llds_enabled"] = int(asked_on)
        return message, evidence


def monitor_state(
    *,
    step: int,
    llds_enabled: bool,
    llds_lam: float,
    phase: str | None,
    detector: Any | None,
    reward_fn_names: Sequence[str],
    correctness: Mapping[str, Any],
    watchdog: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The plain-JSON state: step, LLDS switch, detector (its ``state_dict``), phase, warnings."""
    return {
        "version": STATE_VERSION,
        "step": step,
        "llds": {"enabled": llds_enabled, "lam": llds_lam},
        "phase": phase,
        "detector": detector.state_dict() if hasattr(detector, "state_dict") else None,
        "reward_fn_names": list(reward_fn_names),
        "correctness": dict(correctness),
        "watchdog": None if watchdog is None else dict(watchdog),
    }


def parse_state(state: Mapping[str, Any]) -> MonitorState:
    """Check a :func:`monitor_state` (ValueError on another version) and read it."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"unsupported LLDMonitor state version {state.get('version')!r}")
    llds = state["llds"]
    return MonitorState(
        step=int(state["step"]),
        llds_enabled=bool(llds["enabled"]),
        llds_lam=float(llds["lam"]),
        phase=state.get("phase"),
        detector=state.get("detector"),
        reward_fn_names=tuple(state.get("reward_fn_names", [])),
        correctness=state.get("correctness") or {},
        watchdog=state.get("watchdog"),
    )


def last_logged_step(run_dir: str | Path) -> int | None:
    """The last step a run folder holds, or None (no run there, or no rows yet)."""
    from lld_monitor.runlog import is_run_dir, load_run

    if not is_run_dir(run_dir):
        return None
    steps = load_run(run_dir).steps
    return int(steps[C.STEP].max()) if len(steps) else None


def replaying(last_step: int | None, step: Any) -> bool:
    """True for a ``step`` a resumed folder already holds (``last_step``: its last row)."""
    return last_step is not None and isinstance(step, int | float) and step <= last_step


def replayed_event(last_step: int | None, event: Mapping[str, Any]) -> bool:
    """An alert/phase/intervention event of a step the resumed folder already holds."""
    return event.get(C.EVENT_TYPE) in REPLAYED_EVENT_TYPES and replaying(
        last_step, event.get(C.EVENT_STEP)
    )
