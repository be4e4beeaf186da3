"""The monitor's live checks of each row it writes, apart from the detector's.

Said as the row is written (rank 0 writes the events; every rank computes the same): a
critical ``nonfinite`` alert when a reward or a log-prob of the step was +-inf or NaN, once per
episode of each input; a warning (once) when the rewards vary but no response reaches the
correctness threshold; a note (once) when the row's probes found nothing that moved; a warning
(once) when most prompt groups have had one reward for ``ZERO_STD_ROWS`` rows in a row (LLDS's
gate then rarely fires). Their order in the events is the row's: the first three before the row
is written, the last after it (``before_write`` / ``after_write``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lld_monitor import columns as C
from lld_monitor.events import Alert, make_event, warn_user
from lld_monitor.monitor import llds_checks, step_metrics
from lld_monitor.monitor.correctness import ThresholdWatch
from lld_monitor.monitor.llds_checks import OnceNotes
from lld_monitor.monitor.step_metrics import FIELD_INDEX

logger = logging.getLogger("lld_monitor")


class RowChecks:
    """``emit(event)`` records an event (rank 0), ``alert(a)`` hands an alert to the sinks,
    ``guard(where)`` is the failure policy's context manager; ``notes`` says each note once;
    ``threshold_watch`` is the correctness rule's (the monitor keeps it for its state)."""

    def __init__(
        self,
        notes: OnceNotes,
        threshold_watch: ThresholdWatch,
        emit: Callable[[dict[str, Any]], None],
        alert: Callable[[Alert], None],
        guard: Callable[[str], Any],
    ) -> None:
        self.notes = notes
        self.threshold_watch = threshold_watch
        self._emit, self._alert, self._guard = emit, alert, guard
        self._nonfinite_open: set[str] = set()  # inputs in a non-finite episode (alerted)
        self._zero_std_rows = 0  # rows in a row with most groups at zero reward variance

    def before_write(
        self,
        row: Mapping[str, Any],
        host: Sequence[float],
        step: int,
        reward_fn_names: Sequence[str],
        rank: int,
    ) -> None:
        """The checks said before the row is written (``host``: the reduced sums)."""
        n_still = host[FIELD_INDEX["n_probe_still"]]
        if host[FIELD_INDEX["n_probe"]] == 0 and n_still > 0:
            ev = {"probes": n_still}
            self.notes.say("no_step_probe", step, llds_checks.NO_STEP_PROBE, "info", ev)
        self._nonfinite(host, step, reward_fn_names)
        self._threshold(row, host[FIELD_INDEX["rule_reward_max"]], step, rank)

    def _nonfinite(self, host: Sequence[float], step: int, reward_fn_names: Sequence[str]) -> None:
        """A critical ``nonfinite`` alert when a reward (naming the function) or a log-prob was
        +-inf or NaN in this step (the row holds NaN there, never a mean of the rest); once per
        episode of each input, again after it has been finite."""
        bad = step_metrics.nonfinite_inputs(list(host), list(reward_fn_names))
        seen = self._nonfinite_open
        now = {what for what, _ in bad}
        new = [(what, n) for what, n in bad if what not in seen]
        seen.intersection_update(now)
        seen.update(now)
        if not new:
            return
        parts = [what + (f" ({n:g} responses)" if n == n else "") for what, n in new]
        message = (
            f"non-finite input at step {step}: {', '.join(parts)} held +-inf or NaN; the row "
            "says unknown (NaN) for what depends on it (reward_mean, the reward function's "
            "column, the confidence or displacement columns), never a mean of the finite rest. "
            "Check the reward function's return values and the model's log-probs (fp16 "
            "overflow, a -inf logit under the sampled token)"
        )
        evidence = {what: (None if n != n else n) for what, n in new}
        alert = Alert(step, "nonfinite", "critical", message, evidence)
        with self._guard("nonfinite alert"):
            self._emit(alert.to_event())
            self._alert(alert)

    def _threshold(self, row: Mapping[str, Any], rule_max: float, step: int, rank: int) -> None:
        """Warn once when rewards vary but no response has reached the threshold for a while."""
        msg = self.threshold_watch.update(row, rule_max)
        if msg is None:
            return
        logger.warning("lld_monitor: %s", msg)
        if rank == 0:
            warn_user(msg)
        evidence = {"rule_reward_max": self.threshold_watch.rule_max}
        step = int(row.get(C.STEP, step))
        self._emit(make_event("lifecycle", step, "no_correct_responses", msg, "warning", evidence))

    def after_write(self, row: Mapping[str, Any], step: int, who: str | None) -> None:
        """Warn once when most prompt groups have had zero reward variance for
        ``ZERO_STD_ROWS`` rows in a row: the gate rarely fires (a first row like it is normal
        in a run that starts at accuracy 0). ``who``: ``llds_checks.llds_subject``."""
        frac = row.get(C.FRAC_ZERO_STD_GROUPS)
        if frac is None:  # a row without groups neither extends nor breaks the streak
            return
        high = isinstance(frac, int | float) and frac >= llds_checks.ZERO_STD_WARN
        self._zero_std_rows = self._zero_std_rows + 1 if high else 0
        if self._zero_std_rows < llds_checks.ZERO_STD_ROWS:
            return
        msg = llds_checks.zero_std_problem(who, frac, step, self._zero_std_rows)
        if msg is not None:
            evidence = {C.FRAC_ZERO_STD_GROUPS: float(frac)}
            self.notes.say("llds_check_zero_std", step, msg, "warning", evidence)
