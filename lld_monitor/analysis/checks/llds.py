"""``llds_inert`` (warning): LLDS is on but adds nothing, read from the LLDS columns alone (ours,
the paper authors' verl fork's ``actor/loss_noreduce*``, a reimplementation's ``actor/lld_*``), so
the same check speaks live and on an imported log.

A public Search-R1 reproduction on verl with groups of 2 ran LLDS for a whole run with its loss
at 0: the A >= 0 gate never fired. The check counts rows with LLDS on (``llds_enabled`` 1, or,
where only the coefficient is logged, ``llds_lambda`` > 0) whose LLDS loss (``llds_loss``, else
``llds_loss_weighted``) is exactly 0; ``llds_inert_rows`` (20) in a row fire it once, a row with
a loss re-arms it (the first update of each reused batch is 0 by construction: 20 in a row is
more than a rollout batch's updates in the settings the monitor knows). The reason is read from
the row: most groups with one reward (``frac_zero_std_groups`` >= 0.75: no preserving response
has a gradient); a gate logged as never firing (``llds_frac_gated`` 0); else most likely no
reuse of the generation batch, where the current policy is the sampling one and LLDS is 0.
"""

from __future__ import annotations

from lld_monitor.analysis import messages
from lld_monitor.analysis.checks.base import StreakCheck
from lld_monitor.analysis.signals import Signals
from lld_monitor.events import Alert


class LldsInert(StreakCheck):
    """LLDS on and its loss exactly 0 on ``llds_inert_rows`` rows in a row (warning)."""

    __slots__ = ()
    kind = "llds_inert"

    rows_setting = "llds_inert_rows"

    def holds(self, s: Signals) -> bool | None:
        on, lam = s.llds_enabled, s.llds_lambda
        if on == on:
            active = on >= 0.5
        elif lam == lam:
            active = lam > 0.0
        else:
            return None
        if not active:
            return False
        loss = s.llds_loss if s.llds_loss == s.llds_loss else s.llds_loss_weighted
        if loss != loss:
            return None
        return loss == 0.0

    def alert(self, s: Signals) -> Alert:
        return messages.llds_inert_alert(
            int(s.step),
            self.since,
            self.rows,
            s.llds_lambda,
            s.frac_zero_std_groups,
            s.llds_frac_gated,
        )
