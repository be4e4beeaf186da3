"""``SharpDropCollapse``: Phase III (accelerated collapse), the existing rule.

A collapse is seen when a corroborating signal (grad-norm surge, entropy rise, reward fall, or
most correct responses displaced) comes with a sharp drop of ``logp_correct``, or, in standard
metrics alone, when two of {grad-norm surge, entropy rise, reward fall} come with the reward not
rising and a significant downward reward trend at some scale. No alert of its own: ``rank`` is 3
while it holds (the phase machine asks ``collapse_persist_steps`` of it), else 0.
"""

from __future__ import annotations

import math

from lld_monitor import columns as C
from lld_monitor.analysis.checks.base import NO_ALERTS, Check
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.signals import Signals
from lld_monitor.events import Alert

_NAN = float("nan")


class SharpDropCollapse(Check):
    """Rank 3 on rows (once warm) whose windows show a collapse; stateless between rows."""

    __slots__ = ("_log_surge", "rank")
    kind = "sharp_collapse"
    kinds = ()  # (feeds the phase machine rank 3: the collapse alert is the machine's)

    def __init__(self, config: DetectorConfig) -> None:
        self._log_surge = math.log(config.grad_surge_ratio)
        super().__init__(config)

    def reset(self) -> None:
        self.rank = 0

    def update(self, s: Signals) -> list[Alert]:
        self.rank = self._rank(s) if s.warm else 0
        return NO_ALERTS

    def _rank(self, s: Signals) -> int:
        """3 when the current windows show a collapse, else 0."""
        cfg = self.config
        # KL is reported, not used: it grows from 0 by design early in every run.
        # The ratios of Signals.ratios() only count past their thresholds; the cheap necessary
        # conditions come first, so a quiet row never computes the noise gates.
        gs, hs, peak = s.log_grad_ema.slow, s.entropy_ema.slow, s.reward_peak
        maybe = (
            (gs == gs and s.log_grad_ema.fast - gs >= self._log_surge)
            or (hs == hs and hs > 0.0 and s.entropy_ema.fast >= cfg.entropy_rise_ratio * hs)
            or (peak == peak and peak - s.reward_ema.fast >= cfg.reward_fall_frac * abs(peak))
        )
        fall = 0.0
        n_corro = 0
        if maybe:
            g_ratio, h_ratio, _, fall = s.ratios()
            n_corro = (
                (g_ratio >= cfg.grad_surge_ratio)
                + (h_ratio >= cfg.entropy_rise_ratio)
                + (fall >= cfg.reward_fall_frac)
            )
        fd_high = s.displaced_ema.fast >= cfg.displaced_frac
        if n_corro + fd_high == 0:
            return 0  # (the fits below are only needed with a corroborating signal)
        lp1 = s.lp_trend.fit(1) if C.LOGP_CORRECT in s.seen else None  # ~60-step window
        if lp1 is not None and lp1.slope < 0.0:
            short = s.lp_short
            if len(short.buf) >= cfg.min_short_rows:
                _, st, _, s0, s1 = short.fit()
                # sharp: t, at least collapse_drop, and noise_k standard errors of a fitted
                # change over these n points (equally spaced: sd * sqrt(12 (n-1) / (n (n+1))))
                n = len(short.buf)
                se = s.lp_trend.noise_sd * math.sqrt(12.0 * (n - 1) / (n * (n + 1)))
                if st <= -cfg.trend_t and (s0 - s1) >= max(cfg.collapse_drop, cfg.noise_k * se):
                    return 3  # a sharp drop with a corroborating signal
        if n_corro >= 2:
            rw1 = s.rw_trend.fit(1)
            rt, r0, r1 = (rw1.t, rw1.first, rw1.last) if rw1 is not None else (_NAN,) * 3
            # rising to new highs (a recovery from a dip is not learning)
            reward_rising = (
                rt >= cfg.trend_t
                and not fall > cfg.reward_fall_frac / 3
                and (r1 - r0) >= cfg.reward_min_rise * max(abs(r0), abs(r1), 1e-12)
            )
            if not reward_rising and s.reward_declining():
                return 3  # collapse visible in the standard metrics alone
        return 0
