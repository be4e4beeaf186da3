"""LLDS pre-checks: why LLDS cannot act, or rarely does, said once per run.

The checks are pure (they return messages and never touch a trainer); :class:`OnceNotes` says
each one once per run: a log line, a ``lifecycle`` event keyed by the check, and a
``UserWarning`` when its severity is ``"warning"``. Nothing is checked while LLDS is off and
``auto_llds`` is off (:func:`llds_subject` returns None).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lld_monitor import columns as C
from lld_monitor.events import make_event, warn_user

logger = logging.getLogger("lld_monitor")

#: ``frac_zero_std_groups`` of a rollout batch at or above which the monitor warns (once) that
#: LLDS's gate rarely fires (most groups give every response advantage 0).
ZERO_STD_WARN = 0.75
#: ... for this many rows in a row: a run that starts at accuracy 0 (every group all-wrong at
#: step 1, normal there) is not warned about until the condition persists.
ZERO_STD_ROWS = 5

#: Said once when a row's probes all found no log-prob that moved (its displacement columns are
#: left out).
NO_STEP_PROBE = (
    "displacement columns left out: the post-update probe found no generated token whose "
    "log-prob changed (the optimizer did not step: learning rate 0 during warm-up, or skipped "
    "steps; or the policy puts probability 1 on every sampled token), so such rows are no "
    "evidence of displacement; said once, it applies to every such row"
)


def llds_subject(
    llds_enabled: bool, auto_llds: bool, auto_llds_on: Sequence[str] | None = None
) -> str | None:
    """Whom the checks speak of: LLDS that is on, or ``auto_llds`` that may switch it on.

    None when LLDS is off and ``auto_llds`` is off (nothing to check). ``auto_llds_on`` given
    names the alert kinds in the message.
    """
    if llds_enabled:
        return "LLDS is on"
    if not auto_llds:
        return None
    if auto_llds_on is None:
        return "auto_llds may switch LLDS on"
    return f"auto_llds may switch LLDS on ({', '.join(auto_llds_on)} alerts)"


def can_act_problems(
    subject: str | None, reuse_problem: str | None, num_generations: int | None
) -> list[tuple[str, str, dict[str, Any]]]:
    """``[(key, message, evidence), ...]``: why LLDS cannot act or rarely does, from the settings.

    ``reuse_problem`` says why each batch gets a single update (LLDS then has nothing to compare
    with); ``num_generations`` <= 2 leaves most groups with equal rewards.
    """
    problems: list[tuple[str, str, dict[str, Any]]] = []
    if subject is None:
        return problems
    if reuse_problem:
        problems.append(("llds_check_reuse", f"{subject}, but it cannot act: {reuse_problem}", {}))
    if num_generations is not None and int(num_generations) <= 2:
        msg = (
            f"{subject}, but its gate rarely fires with num_generations={int(num_generations)}: "
            "with two responses per prompt most groups have equal rewards (advantage 0, no "
            "gradient, nothing displaced) and a mixed group has one preserving response. "
            "Set num_generations >= 4 (the paper uses 5)."
        )
        problems.append(("llds_check_generations", msg, {"num_generations": num_generations}))
    return problems


def zero_std_problem(subject: str | None, frac: Any, step: int, rows: int = 1) -> str | None:
    """The message when ``frac`` (a row's ``frac_zero_std_groups``) is >= ``ZERO_STD_WARN``
    (``rows``: how many rows in a row it has been, said in the message when more than one)."""
    if subject is None or not (isinstance(frac, int | float) and frac >= ZERO_STD_WARN):
        return None
    streak = f", and at least {ZERO_STD_WARN:.0%} for {rows} rows in a row," if rows > 1 else ""
    return (
        f"{subject}, but {frac:.0%} of the prompt groups of the rollout batch at step {step} have "
        f"zero reward variance{streak} ({C.FRAC_ZERO_STD_GROUPS} >= {ZERO_STD_WARN}): their "
        "responses get advantage 0 and no gradient, so LLDS's gate rarely fires. Use more "
        "generations per prompt, a higher temperature, or prompts the policy solves sometimes "
        "(not always or never); said once"
    )


class OnceNotes:
    """Say each note once per run; ``emit(event)`` records its ``lifecycle`` event (rank 0).

    ``guard(where)`` is the failure policy's context manager around the event.
    """

    def __init__(self, emit: Callable[[dict[str, Any]], None], guard: Callable[[str], Any]) -> None:
        self.said: set[str] = set()
        self._emit = emit
        self._guard = guard

    def say(
        self,
        key: str,
        step: int,
        message: str,
        severity: str,
        evidence: Mapping[str, Any],
    ) -> bool:
        """Log, warn (``severity`` "warning", at the user's line: ``events.warn_user``) and
        record ``message`` unless ``key`` was said. False when it was said before."""
        if key in self.said:
            return False
        self.said.add(key)
        # once on the console: a warning (at the user's line), the log at info level (a
        # logger.warning as well would print it a second time through logging's last resort)
        logger.info("lld_monitor: %s", message)
        if severity == "warning":
            warn_user(message)
        with self._guard("llds check event"):
            self._emit(make_event("lifecycle", step, key, message, severity, dict(evidence)))
        return True
