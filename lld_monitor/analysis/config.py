"""``DetectorConfig``: the hyperparameters of the phase detector, its signals and its checks."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class DetectorConfig:
    """Hyperparameters of ``PhaseDetector`` (steps are optimizer steps, not rows)."""

    warmup_steps: int = 20  # no alert before this many steps after the first row
    warmup_rows: int = 5  # ... nor before this many rows
    window_steps: int = 40  # time constant x2 of the displaced-share / delta EMAs; refinement span
    short_steps: int = 10  # window of a sharp drop (collapse)
    min_short_rows: int = 3
    trend_base_steps: float = 3.0  # bin width of the finest trend level (steps)
    trend_bins: int = 10  # bins per trend window: level j spans trend_bins * base * 2**j steps
    trend_levels: int = 9  # levels: windows of 30, 60, ... 7680 steps with the defaults
    trend_alpha: float = 0.01  # one-sided level of each trend test (Student t, AR(1) n_eff)
    trend_persist: int = 4  # hold at (this - 1) consecutive tests spanning (this - 1) bins
    trend_alpha_decay: float = 0.75  # alpha shrinks as (window / elapsed) ** this in long runs
    collapse_persist_steps: int = 6  # collapse must hold this long
    recover_steps: int = 40  # an LLD phase is left after its conditions cleared this long
    trend_t: float = 3.0  # |t| of an OLS slope that counts as a trend
    reward_min_rise: float = 0.05  # relative reward rise over the window for "reward rises"
    flat_tol: float = 0.02  # nats/token: logp_correct change over the window counted as flat
    decay_min_drop: float = 0.025  # nats/token: minimum logp_correct drop over the window
    collapse_drop: float = 0.05  # nats/token: logp_correct drop over short_steps that is sharp
    displaced_frac: float = 0.5  # share of correct responses displaced (paper's > 50%)
    displaced_z: float = 2.326  # one-sided z (1%) of the pooled displaced share above the 0.5
    displaced_min_n: float = 12.0  # least pooled (weighted) correct responses behind the alert
    displaced_memory: float = 0.5  # weight kept per probe by the pooled displaced counts
    displaced_default_n: float = 8.0  # correct responses assumed per probe without n_correct
    # the probe's share also over its last 2, 4, ... displaced_windows probes (plain counts), each
    # window at this one-sided z (1% over the 4 windows, Bonferroni)
    displaced_windows: int = 16
    displaced_window_z: float = 2.807
    # in-batch counts (distinct responses, a few per row): pooled with a half-life in responses
    inbatch_half_life: float = 24.0
    inbatch_alpha_decay: float = 0.5  # its level shrinks as (window / responses so far) ** this
    grad_surge_ratio: float = 2.0  # fast / slow grad norm (geometric EMAs)
    entropy_rise_ratio: float = 1.15  # fast / slow entropy
    reward_fall_frac: float = 0.15  # reward EMA below its peak by this share of max(|peak|, gain)
    noise_k: float = 3.0  # a surge / rise / fall must exceed this many noise sd of its fast EMA
    fast_tau: float = 5.0  # steps, time constant of the fast EMAs
    slow_tau: float = 50.0  # steps, time constant of the baselines
    nonfinite_grad_rows: int = 3  # consecutive non-finite grad norms before "nonfinite"
    dead_zero_std: float = 0.95  # frac_zero_std_groups at or above = dead signal
    dead_reward_std: float = 1e-6  # reward_std at or below = dead signal
    failure_persist_steps: int = 10  # dead_signal / entropy_collapse / length_blowup persistence
    entropy_floor_frac: float = 0.1  # entropy below this share of its early level = collapse
    length_blowup_ratio: float = 3.0  # completion length above this multiple of its early level
    reward_decline_frac: float = 0.3  # sustained reward decline from its peak (not LLD-specific)
    kl_blowup_ratio: float = 100.0  # KL above this multiple of its settled level ...
    kl_floor: float = 0.01  # ... taken as at least this (KL grows from 0 in every run)
    truncation_frac: float = 0.5  # share of completions cut at the length cap (fast EMA) ...
    truncation_min_rows: int = 3  # ... over at least this many logged rows in a row
    # single-row spikes of KL and grad norm (``spike``, info): a value above the median of the
    # signal's last spike_window logged values + spike_k * 1.4826 * their MAD, and at least
    # spike_ratio (KL) / spike_grad_ratio (grad norm) times its baseline: the larger of that
    # median and the highest such median so far (KL: at least kl_floor)
    spike_window: int = 25  # rows (a fixed window: O(1) per row)
    spike_min_rows: int = 10  # least values in the window before a spike can be named
    spike_k: float = 10.0
    spike_ratio: float = 20.0
    spike_grad_ratio: float = 50.0  # pre-clip grad norms jump x26 in a healthy toy run
    spike_cooldown_rows: int = 10  # values of that signal after a spike alert before the next

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"DetectorConfig.{f.name} must be a positive number, got {v!r}")
        if self.displaced_memory > 1.0 or self.displaced_frac >= 1.0:
            raise ValueError(
                "DetectorConfig.displaced_memory and displaced_frac must be <= 1 / < 1"
            )
        if self.short_steps > self.window_steps:
            raise ValueError("DetectorConfig.short_steps must not exceed window_steps")
        if self.spike_min_rows > self.spike_window:
            raise ValueError("DetectorConfig.spike_min_rows must not exceed spike_window")
