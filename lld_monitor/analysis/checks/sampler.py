"""``sampler_mismatch`` (warning): the sampler (vLLM, SGLang) and the trainer disagree about the
policy's token probabilities, which no reward curve shows until the run degrades (TRL #5814: an
importance-sampling ratio mean of 0.57 where ~1 is right).

Fires once per episode when, on ``sampler_rows`` rows in a row, the importance-sampling ratio
mean leaves the band [1 / ``sampler_is_band``, ``sampler_is_band``] (1.25: a 25% disagreement
on the average token), or the mean absolute log-prob difference per token reaches
``sampler_logp_diff`` (0.1 nats), or verl's mean absolute probability difference reaches
``sampler_prob_diff`` (0.05); re-arms on a row inside all of them. Exact band tests on
logged values, counted from the first row. Rows that log none of the three say nothing.
"""

from __future__ import annotations

import math

from lld_monitor import columns as C
from lld_monitor.analysis import messages
from lld_monitor.analysis.checks.base import StreakCheck
from lld_monitor.analysis.signals import Signals
from lld_monitor.events import Alert


class SamplerMismatch(StreakCheck):
    """The sampler and the trainer disagree, ``sampler_rows`` rows in a row (warning)."""

    __slots__ = ()
    kind = "sampler_mismatch"

    rows_setting = "sampler_rows"

    def holds(self, s: Signals) -> bool | None:
        cfg = self.config
        r, d, p = s.is_ratio_mean, s.sampler_logp_diff, s.sampler_prob_diff
        if r != r and d != d and p != p:
            return None
        out = r == r and r > 0.0 and abs(math.log(r)) > math.log(cfg.sampler_is_band)
        out = out or (r == r and r <= 0.0)
        out = out or (d == d and d >= cfg.sampler_logp_diff)
        return out or (p == p and p >= cfg.sampler_prob_diff)

    def alert(self, s: Signals) -> Alert:
        return messages.sampler_mismatch_alert(
            int(s.step),
            self.since,
            self.rows,
            {
                C.IS_RATIO_MEAN: s.is_ratio_mean,
                C.SAMPLER_LOGP_DIFF: s.sampler_logp_diff,
                C.SAMPLER_PROB_DIFF: s.sampler_prob_diff,
            },
            self.config,
        )
