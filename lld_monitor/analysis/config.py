"""``DetectorConfig``: the hyperparameters of the phase detector, its signals and its checks.

One frozen dataclass holds every setting; the two checks with settings of their own have them as
sections of it (``level_shift``: ``LevelShiftConfig``, ``mode_collapse``: ``ModeCollapseConfig``),
so that every setting is saved with the detector's state and in a run's meta.json, and is tuned
the same way (``PhaseDetector(**{"level_shift.p_false_run": 0.01})``, ``with_overrides``, the
sweep's ``--config level_shift.p_false_run=0.01``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class LevelShiftConfig:
    """Hyperparameters of ``LevelShiftCollapse`` (rows are logged rows with a reward)."""

    # the false-alarm rate: the probability that a run of 3000 rows of noise like the run's own
    # crosses the threshold (about 3000 / p rows per false alarm), without / with corroboration
    p_false_run: float = 0.002
    p_false_run_corroborated: float = 0.05
    # ... at a row among the run's first GLR_SHORT_ROWS (64): the probability that a run of 64
    # rows of such noise crosses (a short run is judged on its own horizon: most published runs
    # log 20-60 rows), without / with corroboration
    p_false_short_run: float = 0.005
    p_false_short_run_corroborated: float = 0.05
    floor_frac: float = (
        0.35  # collapsed: the level since the change <= floor + this x (held - floor)
    )
    # ... or, for a run that learned at least learned_frac of its height from its start, back
    # near the start: <= start + start_frac x (held - start)
    learned_frac: float = 0.5
    start_frac: float = 0.3
    below_start_frac: float = 0.25  # ... or, having learned this share, at or below its start
    floor_sd: float = 2.0  # ... by the mean since the change plus this many of its standard errors
    # ... this many at a row among the run's first GLR_SHORT_ROWS (a short run has few rows
    # after its fall: 2 standard errors of 6 noisy rows are a wide margin)
    floor_sd_short: float = 0.5
    min_drop: float = 0.05  # ... and at least this far below the held level (reward units)
    start_rows: int = 3  # the run's starting level: the mean of its first rows
    noise_rows: int = 128  # consecutive differences behind the row noise
    # rows per block mean of the long-run noise (the longest with enough blocks is used) ...
    block_rows: tuple[int, ...] = (2, 4, 8)
    noise_blocks: int = 32  # ... from the last this many block differences (8 at the least)
    min_noise_frac: float = 0.01  # noise sd at least this share of max(|held level|, 0.1)
    corroborated_rows: int = 3  # rows among the last 3 that show a corroborating signal
    baseline_rows: int = 32  # values of a corroborating signal behind its baseline (median)
    grad_surge: float = 5.0  # grad norm >= this x its baseline
    grad_dead: float = 1e-3  # grad norm <= this x its baseline (or exactly 0)
    entropy_rise: float = 2.0  # entropy >= this x its baseline
    entropy_fall: float = 0.2  # entropy <= this x its baseline
    length_fall: float = 0.25  # completion length <= this x its baseline
    truncated_frac: float = 0.5  # frac_truncated >= this (and its baseline below half of it)
    zero_std_frac: float = 0.9  # frac_zero_std_groups >= this, from a baseline below 0.5
    rearm_frac: float = 0.5  # re-armed once the last 3 rows' mean is back above
    # floor + this x (held - floor)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            vals = v if isinstance(v, tuple) else (v,)
            if not vals or any(
                not isinstance(x, int | float) or isinstance(x, bool) or not x > 0 for x in vals
            ):
                raise ValueError(f"LevelShiftConfig.{f.name} must be positive, got {v!r}")
        if any(int(b) != b or b < 2 for b in self.block_rows):
            raise ValueError("LevelShiftConfig.block_rows must be whole numbers of rows >= 2")
        for name in (
            "p_false_run",
            "p_false_run_corroborated",
            "p_false_short_run",
            "p_false_short_run_corroborated",
            "floor_frac",
            "learned_frac",
            "start_frac",
            "below_start_frac",
            "rearm_frac",
        ):
            if not getattr(self, name) < 1.0:
                raise ValueError(f"LevelShiftConfig.{name} must be below 1")
        if self.p_false_short_run_corroborated < self.p_false_short_run:
            raise ValueError(
                "LevelShiftConfig.p_false_short_run_corroborated must be at least "
                "p_false_short_run (corroboration lowers the threshold, never raises it)"
            )
        if self.p_false_run_corroborated < self.p_false_run:
            raise ValueError(
                "LevelShiftConfig.p_false_run_corroborated must be at least p_false_run "
                "(corroboration lowers the threshold, never raises it)"
            )


@dataclass(frozen=True)
class ModeCollapseConfig:
    """Hyperparameters of ``ModeCollapse``."""

    early_rows: int = 3  # the early completion length: mean of the first rows that have one
    window_rows: int = 5  # rows behind the share of identical-reward groups
    zero_std_frac: float = 0.6  # "most groups": mean share over the window at or above this
    length_frac: float = 0.35  # completions at or below this share of their early length
    persist_rows: int = 2  # rows in a row that hold both before the alert

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"ModeCollapseConfig.{f.name} must be positive, got {v!r}")


#: The sections of ``DetectorConfig``: field name -> its dataclass.
SECTIONS: dict[str, type] = {"level_shift": LevelShiftConfig, "mode_collapse": ModeCollapseConfig}


def _json_dict(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in items}


def _section(cls: type, value: Any, name: str) -> Any:
    """A section given as its dataclass or as a mapping of its fields (JSON: lists for tuples;
    fields it lacks take their defaults)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(
            f"DetectorConfig.{name} must be a {cls.__name__} or a mapping, got {value!r}"
        )
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"unknown DetectorConfig.{name} setting(s) {unknown}; use {sorted(known)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})


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
    no_update_rows: int = 3  # probed rows in a row with no log-prob moved before "no_update"
    zero_grad_rows: int = 3  # rows in a row with grad norm exactly 0 before "zero_grad"
    llds_inert_rows: int = 20  # rows in a row with LLDS on and its loss exactly 0
    sampler_rows: int = 3  # rows in a row of sampler-trainer disagreement before the alert
    sampler_is_band: float = 1.25  # IS-ratio mean outside [1/band, band]: disagreement
    sampler_logp_diff: float = 0.1  # mean |logp_trainer - logp_sampler| (nats/token) at or above
    sampler_prob_diff: float = 0.05  # verl's mean |p_trainer - p_sampler| at or above
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
    # the settings of the level-shift collapse test and of the mode-collapse check
    level_shift: LevelShiftConfig = field(default_factory=LevelShiftConfig)
    mode_collapse: ModeCollapseConfig = field(default_factory=ModeCollapseConfig)

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            object.__setattr__(self, name, _section(cls, getattr(self, name), name))
        for f in fields(self):
            if f.name in SECTIONS:
                continue
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

    def to_dict(self) -> dict[str, Any]:
        """Every setting as plain JSON (the sections as nested objects, tuples as lists)."""
        return asdict(self, dict_factory=_json_dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DetectorConfig:
        """The config of a ``to_dict()`` (JSON-loaded: lists for tuples); settings it lacks,
        added since it was saved, take their defaults; an unknown one is an error."""
        return cls().with_overrides(**d)

    def with_overrides(self, **overrides: Any) -> DetectorConfig:
        """This config with some settings replaced: a field by its name, a section's setting
        by ``section.name`` (``level_shift.p_false_run``), or a whole section by a mapping of
        some of its settings (the rest kept)."""
        top: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {}
        known = {f.name for f in fields(self)}
        for key, value in overrides.items():
            section, dot, name = key.partition(".")
            if section not in known or (dot and section not in SECTIONS):
                raise ValueError(
                    f"unknown PhaseDetector hyperparameter {key!r} (a DetectorConfig setting); "
                    f"use one of {sorted(known)} or "
                    f"section.name for the sections {sorted(SECTIONS)}"
                )
            if dot:
                parts.setdefault(section, {})[name] = value
            elif section in SECTIONS and isinstance(value, Mapping):
                parts.setdefault(section, {}).update(value)
            else:
                top[key] = value
        for section, values in parts.items():
            base = top.get(section, getattr(self, section))
            base = _section(SECTIONS[section], base, section)
            top[section] = _section(SECTIONS[section], {**asdict(base), **values}, section)
        return replace(self, **top)
