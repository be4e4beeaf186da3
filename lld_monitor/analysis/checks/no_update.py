"""Failures no reward curve shows: the update that did nothing (``no_update``, critical) and a
grad norm of exactly 0 while the batch had a learning signal (``zero_grad``, warning).

Both are exact-zero conditions, not statistics, so they count logged rows from the first (no
warm-up) and fire once per episode, after ``no_update_rows`` / ``zero_grad_rows`` rows in a row:

- ``no_update``: the post-update probe found no probed token whose log-prob changed
  (``probe_still`` = 1: every probe of the row still) while the step had a loss or a gradient
  (``loss`` != 0 or ``grad_norm`` > 0): frozen weights, an optimizer that does not step, a
  learning rate of 0, an adapter that is not attached (users of TRL, verl and MLX report runs
  that looked fine with a post-update change of exactly 0). Rows without a probe, and still rows
  whose update had nothing to do (loss and grad norm 0: every group one reward), neither count
  nor break the streak (the probe runs once per rollout batch); a moved log-prob breaks it.
- ``zero_grad``: ``grad_norm`` = 0 exactly while some prompt group had unequal rewards
  (``frac_zero_std_groups`` < 1): GRPO's advantages were not all zero, yet no gradient reached
  the weights. A nonzero grad norm breaks the streak; rows without a grad norm, and zero ones
  without the share, neither count nor break it
  (a batch's ``reward_std`` is no evidence: groups that each got one reward spread it too).
"""

from __future__ import annotations

from lld_monitor.analysis import messages
from lld_monitor.analysis.checks.base import StreakCheck
from lld_monitor.analysis.signals import Signals
from lld_monitor.events import Alert


class NoUpdate(StreakCheck):
    """Every probe of the row found no log-prob that moved while the step had a loss or a
    gradient, ``no_update_rows`` probed rows in a row (critical)."""

    __slots__ = ()
    kind = "no_update"

    rows_setting = "no_update_rows"

    def holds(self, s: Signals) -> bool | None:
        still = s.probe_still
        if still != still:
            return None
        if still < 1.0:
            return False  # a log-prob moved: the weights move
        loss, g = s.loss, s.grad_norm
        asked = (loss == loss and loss != 0.0) or (g == g and g > 0.0)
        return True if asked else None  # (nothing asked of this update: it says nothing)

    def alert(self, s: Signals) -> Alert:
        return messages.no_update_alert(
            int(s.step), self.since, self.rows, s.loss, s.grad_norm, s.learning_rate
        )


class ZeroGrad(StreakCheck):
    """``grad_norm`` exactly 0 while some group had unequal rewards, ``zero_grad_rows`` rows
    in a row (warning)."""

    __slots__ = ()
    kind = "zero_grad"

    rows_setting = "zero_grad_rows"

    def holds(self, s: Signals) -> bool | None:
        g = s.grad_norm
        if g != g:
            return None
        if g != 0.0:
            return False  # a gradient: the streak ends whatever the share says
        zstd = s.frac_zero_std_groups
        if zstd != zstd:
            # (nothing says whether the advantages were all zero: a batch's reward spread does
            # not, since groups that each got one reward of their own spread it too)
            return None
        return zstd < 1.0

    def alert(self, s: Signals) -> Alert:
        return messages.zero_grad_alert(
            int(s.step), self.since, self.rows, s.loss, s.frac_zero_std_groups, s.reward_std
        )
