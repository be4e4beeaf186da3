"""Labelled synthetic GRPO runs: step tables together with their true phases and collapse step.

ruptures-style generators (``make_run`` returns the signal *and* its truth), used by the tests,
the evaluation (``lld-monitor eval``), the benchmarks and ``lld-monitor simulate``. Every run is
SIMULATED: curves follow the published timeline of the LLD death spiral (PAPER.md, Qwen2.5-3B on
NQ: stagnation to ~60, decay to ~120, collapse after ~120) with randomised boundaries, scales and
noise. They are never to be presented as trained runs.

Conventions of the labels (``LabelledRun.labels``, plain JSON):
- ``phases``: ``[{"phase", "start_step", "end_step"}]`` covering the run (true phases);
- ``collapse_step``: first step at which the noise-free reward is below half its peak (the run
  *has* collapsed), ``None`` for runs that do not collapse;
- ``collapse_start``: the onset of phase III (grad-norm surge, sharp likelihood drop), or None;
- ``failure``: the non-LLD failure a run carries (``nonfinite``, ``dead_signal``,
  ``entropy_collapse``, ``length_blowup``) or None.

Widening knobs of ``make_run`` (keywords):

- ``time_scale`` stretches every duration of the timeline (phases, learning, dips) by that
  factor, ``phase_steps`` sets it by the mean length of the stagnation phase
  (``time_scale = phase_steps / 60``: stagnation 0.75-1.25, decay 0.75-1.17 and collapse to
  half reward 0.42-1.0 times ``phase_steps``); ``n_steps`` then defaults to 220-300 times
  ``time_scale``;
- ``rows_per_batch``: consecutive optimizer steps of one rollout batch repeat its reward,
  accuracy, confidence (``logp_*``), zero-std share, length and searches;
- ``probe_every``: the probe columns (``columns.DISPLACEMENT_COLUMNS``) are measured once per
  rollout batch, on the first logged row of every ``probe_every``-th batch, blank elsewhere;
- ``noise_level`` (``low``, ``medium``, ``high``, see ``NOISE_LEVELS``) draws the per-row
  noise sd of ``logp_correct`` (``logp_noise``, nats/token) and of the reward
  (``reward_noise``) from that level's range unless given, an AR(1) coefficient ``noise_ar``
  (per rollout batch, 0-0.6 unless given) and multiplies the other noise scales;
- ``batch_size``: responses probed per rollout batch; ``n_correct`` is then drawn
  binomially from it and the batch's accuracy, the displaced correct responses (change < 0
  strictly) binomially from the displaced share, ``frac_correct_displaced`` is their ratio;
- ``displaced``: that share in a healthy run (default 0.05-0.35) or in a collapsing run's
  phase I (default 0.2-0.45, or 0.6-0.9 in one run of four); collapsing runs climb past 0.5
  during phase II;
- ``decline``: the total fall of ``logp_correct`` (nats/token) spread over phase II.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.testing.base import LabelledRun, _ar1
from lld_monitor.testing.curves import FAILURE_KINDS, draw, healthy_curves, observe, shape_curves
from lld_monitor.testing.standard import (
    CALIBRATION_COLLAPSE_KINDS,
    CALIBRATION_HEALTHY_KINDS,
    CALIBRATION_KINDS,
    STANDARD_COLLAPSE_KINDS,
    STANDARD_HEALTHY_KINDS,
    STANDARD_KINDS,
    make_calibration_run,
    make_standard_run,
    make_standard_suite,
)

#: (the standard-metric-only and calibration runs live in testing/standard.py; the labelled run
#: and the curve pieces the simulators share in testing/base.py)
__all__ = [
    "CALIBRATION_COLLAPSE_KINDS",
    "CALIBRATION_HEALTHY_KINDS",
    "CALIBRATION_KINDS",
    "CLASSIC_KINDS",
    "COLLAPSE_KINDS",
    "FAILURE_KINDS",
    "HEALTHY_KINDS",
    "KINDS",
    "NEW_HEALTHY_KINDS",
    "NOISE_LEVELS",
    "STANDARD_COLLAPSE_KINDS",
    "STANDARD_HEALTHY_KINDS",
    "STANDARD_KINDS",
    "LabelledRun",
    "make_calibration_run",
    "make_run",
    "make_standard_run",
    "make_standard_suite",
    "make_suite",
    "make_wide_suite",
    "probe_rows",
    "wide_knobs",
    "write_run",
    "write_suite",
]

#: Runs that end in the LLD death spiral.
COLLAPSE_KINDS: tuple[str, ...] = ("collapse",)
#: Healthy runs, including the hard negatives a detector must not flag.
#: Healthy kinds added for the widened ranges: learning-rate warm-up with large early grad norms,
#: small-batch noise (high noise, few responses probed).
NEW_HEALTHY_KINDS: tuple[str, ...] = ("warmup", "small_batch")
HEALTHY_KINDS: tuple[str, ...] = ("healthy", "grad_spikes", "plateau", "dip", *NEW_HEALTHY_KINDS)
#: The kinds of the classic suite (``make_suite``'s default): collapse and the first four healthy.
CLASSIC_KINDS: tuple[str, ...] = ("collapse", "healthy", "grad_spikes", "plateau", "dip")
KINDS: tuple[str, ...] = COLLAPSE_KINDS + HEALTHY_KINDS + FAILURE_KINDS

#: Noise levels of the widened runs, matched to measured runs: per-row sd of ``logp_correct``
#: (nats/token) and of the reward, and the multiplier of every other noise scale.
NOISE_LEVELS: dict[str, dict[str, Any]] = {
    "low": {"logp": (0.005, 0.015), "reward": (0.01, 0.04), "multiplier": 1.0},
    "medium": {"logp": (0.015, 0.03), "reward": (0.04, 0.08), "multiplier": 1.5},
    "high": {"logp": (0.03, 0.05), "reward": (0.08, 0.12), "multiplier": 2.0},
}

_TIMELINE_KEYS: frozenset[str] = frozenset(
    {
        "stagnation_end",
        "collapse_start",
        "collapse_step",
        "spike_steps",
        "dip_steps",
        "failure_step",
    }
)


def make_run(
    kind: str = "collapse",
    n_steps: int | None = None,
    seed: int = 0,
    *,
    standard_only: bool = False,
    log_every: int = 1,
    noise: float = 1.0,
    time_scale: float | None = None,
    phase_steps: float | None = None,
    probe_every: int = 1,
    rows_per_batch: int = 1,
    noise_level: str | None = None,
    logp_noise: float | None = None,
    reward_noise: float | None = None,
    noise_ar: float | None = None,
    batch_size: int | None = None,
    decline: float | None = None,
    displaced: float | None = None,
    **timeline: Any,
) -> LabelledRun:
    """Generate one labelled run of ``kind`` (see ``KINDS``), ``n_steps`` optimizer steps long.

    ``standard_only`` drops the LLD columns (a foreign log), ``log_every`` keeps one row every
    that many steps (sparse logging), ``noise`` multiplies every noise scale (small batches).
    ``timeline`` overrides the random boundaries: ``stagnation_end``, ``collapse_start``,
    ``collapse_step`` (collapse), ``spike_steps`` (grad_spikes), ``dip_steps`` (dip),
    ``failure_step`` (failure kinds).

    The other keywords widen the run to the ranges real runs measure (the module docstring,
    "Widening knobs"); left at their defaults the run is the classic one.
    """
    _check_make_run(kind, timeline, log_every, noise)
    _check_knobs(
        time_scale=time_scale,
        phase_steps=phase_steps,
        probe_every=probe_every,
        rows_per_batch=rows_per_batch,
        noise_level=noise_level,
        logp_noise=logp_noise,
        reward_noise=reward_noise,
        noise_ar=noise_ar,
        batch_size=batch_size,
        decline=decline,
        displaced=displaced,
    )
    if phase_steps is not None:
        time_scale = float(phase_steps) / 60.0
    # any widening knob (or a kind that only exists widened): the second stream's columns
    knobs = (noise_level, logp_noise, reward_noise, noise_ar, batch_size, decline, displaced)
    wide = (
        time_scale is not None
        or int(probe_every) > 1
        or int(rows_per_batch) > 1
        or any(k is not None for k in knobs)
        or kind in NEW_HEALTHY_KINDS
    )
    rng = np.random.default_rng(seed)
    # every draw the classic run did not make comes from a second stream, so the classic run's
    # draws (and its table) stay the same
    rng2 = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(seed) >> 32 & 0xFFFF, 0x5EED])
    if kind == "small_batch" and noise_level is None:
        noise_level = "high"
    level = NOISE_LEVELS[noise_level] if noise_level is not None else None
    if level is not None:
        noise = noise * level["multiplier"]
    n, scale = _run_size(kind, n_steps, time_scale, rng)
    d = draw(rng, rng2, scale, noise, level, reward_noise, logp_noise, noise_ar)
    phi = float(d["noise_ar"] or 0.0)
    if kind == "small_batch" and batch_size is None:
        batch_size = int(rng2.integers(4, 9))
    labels: dict[str, Any] = {
        "kind": kind,
        "seed": int(seed),
        "n_steps": n,
        "log_every": int(log_every),
        "standard_only": bool(standard_only),
        "simulated": True,
        **dict.fromkeys(("collapse_step", "collapse_start", "decay_start", "failure")),
        "failure_step": None,
    }
    c = healthy_curves(rng, rng2, d, n, displaced)
    shape_curves(
        kind,
        c,
        d,
        rng,
        rng2,
        scale=scale,
        timeline=timeline,
        labels=labels,
        time_scale=time_scale,
        decline=decline,
        displaced=displaced,
    )
    rows = observe(c, d, rng, noise, kind, labels)
    steps = _logged_table(
        rows,
        c,
        d,
        rng2,
        wide=wide,
        rows_per_batch=int(rows_per_batch),
        probe_every=int(probe_every),
        log_every=int(log_every),
        phi=phi,
        noise=noise,
        batch_size=batch_size,
        standard_only=standard_only,
    )
    labels["phases"] = c.phases
    labels.update(
        _knob_labels(c, d, scale, probe_every, rows_per_batch, noise, noise_level, phi, batch_size)
    )
    suffix = ("_std" if standard_only else "") + (f"_every{log_every}" if log_every > 1 else "")
    labels["name"] = f"{kind}{suffix}_s{seed}"
    return LabelledRun(steps=steps, labels=labels)


def _run_size(
    kind: str, n_steps: int | None, time_scale: float | None, rng: np.random.Generator
) -> tuple[int, float]:
    """(steps, the timeline's scale): steps drawn unless given (the classic run's draw)."""
    if n_steps is None:
        n_steps = int(rng.integers(220, 301))
        if time_scale is not None:
            n_steps = round(n_steps * time_scale)
    if n_steps < 50:
        raise ValueError(f"n_steps must be >= 50 to hold a run's phases, got {n_steps}")
    n = int(n_steps)
    # Scale of the timeline: the paper's ~200-step spiral in 220-300 steps, stretched for long
    # runs and (collapse runs only) compressed for runs shorter than 220 steps.
    if time_scale is not None:
        scale = float(time_scale)
    else:
        scale = n / 220.0 if kind == "collapse" and n < 220 else max(1.0, n / 260.0)
    return n, scale


def _knob_labels(
    c: Any,
    d: dict[str, Any],
    scale: float,
    probe_every: int,
    rows_per_batch: int,
    noise: float,
    noise_level: str | None,
    phi: float,
    batch_size: int | None,
) -> dict[str, Any]:
    """The labels that say how the run was widened (the values used, drawn or given)."""
    return {
        "time_scale": round(scale, 6),
        "probe_every": int(probe_every),
        "rows_per_batch": int(rows_per_batch),
        "noise": round(float(noise), 6),
        "noise_level": noise_level,
        "logp_noise": round(float(d["sig_lp"]), 6),
        "reward_noise": round(float(d["sig_r"]), 6),
        "noise_ar": round(phi, 6),
        "batch_size": None if batch_size is None else int(batch_size),
        "decline": None if c.decline_used is None else round(c.decline_used, 6),
        "displaced": round(c.share0, 6) if batch_size is not None else None,
    }


def _check_make_run(kind: str, timeline: dict[str, Any], log_every: int, noise: float) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    unknown = set(timeline) - _TIMELINE_KEYS
    if unknown:
        raise ValueError(f"unknown timeline keys {sorted(unknown)}; use {sorted(_TIMELINE_KEYS)}")
    if int(log_every) < 1:
        raise ValueError(f"log_every must be >= 1, got {log_every}")
    if not noise >= 0:
        raise ValueError(f"noise must be a non-negative multiplier, got {noise}")


def _logged_table(
    rows: dict[str, np.ndarray],
    c: Any,
    d: dict[str, Any],
    rng2: np.random.Generator,
    *,
    wide: bool,
    rows_per_batch: int,
    probe_every: int,
    log_every: int,
    phi: float,
    noise: float,
    batch_size: int | None,
    standard_only: bool,
) -> pd.DataFrame:
    """The step table as logged: the widened run's batches and probe counts (``_widen``), the
    non-finite values of a ``nonfinite`` run, the probe columns blank off the probed rows, the
    LLD columns dropped from a foreign log, one row every ``log_every`` steps."""
    n = len(rows[C.STEP])
    if wide:
        _widen(
            rows,
            rng2,
            rows_per_batch=rows_per_batch,
            reward=c.reward,
            logp_c=c.logp_c,
            share=c.share,
            delta_c=c.delta_c,
            sig_r=d["sig_r"],
            sig_lp=d["sig_lp"],
            phi=phi,
            noise=noise,
            len0=d["len0"],
            batch_size=batch_size,
        )
    if c.loss_nan_from is not None:
        rows[C.LOSS][c.loss_nan_from :] = np.nan
        rows[C.GRAD_NORM][c.loss_nan_from :] = np.nan
    if wide:
        logged = np.flatnonzero(rows[C.STEP] % log_every == 0)
        blank = np.ones(n, dtype=bool)
        blank[logged[probe_rows(logged, rows_per_batch, probe_every)]] = False
        for col in C.DISPLACEMENT_COLUMNS:
            if col in rows:
                rows[col] = np.where(blank, np.nan, rows[col])
    steps = pd.DataFrame(rows)
    if standard_only:
        steps = steps.drop(columns=[col for col in steps.columns if col in C.LLD_COLUMNS])
    if log_every > 1:
        steps = steps[steps[C.STEP] % log_every == 0].reset_index(drop=True)
    return steps


def probe_rows(steps: np.ndarray, rows_per_batch: int = 1, probe_every: int = 1) -> np.ndarray:
    """Which logged rows carry the probe columns: a boolean mask over ``steps``.

    The probe is measured once per rollout batch (``rows_per_batch`` consecutive optimizer steps,
    the batch of step s is ``s // rows_per_batch``), on the first logged row of every
    ``probe_every``-th batch that has a logged row.
    """
    steps = np.asarray(steps, dtype=np.int64)
    batch = steps // int(rows_per_batch)
    first = np.ones(len(batch), dtype=bool)
    first[1:] = batch[1:] != batch[:-1]
    order = np.cumsum(first) - 1  # index of the row's batch among the logged batches
    return first & (order % int(probe_every) == 0)


def _widen(
    rows: dict[str, np.ndarray],
    rng: np.random.Generator,
    *,
    rows_per_batch: int,
    reward: np.ndarray,
    logp_c: np.ndarray,
    share: np.ndarray,
    delta_c: np.ndarray,
    sig_r: float,
    sig_lp: float,
    phi: float,
    noise: float,
    len0: float,
    batch_size: int | None,
) -> None:
    """Replace the rollout-level columns of ``rows`` (in place) by the widened model.

    One value per rollout batch (AR(1) noise across batches), repeated over the batch's rows;
    probe columns from the batch's first step; binomial displacement counts when ``batch_size``.
    """
    step = rows[C.STEP]
    bidx = step // rows_per_batch  # [n] rollout batch of each step
    t0 = bidx * rows_per_batch  # [n] first step of that batch
    nb = int(bidx[-1]) + 1
    first = t0[::rows_per_batch][:nb]  # [nb] first step of each batch
    r_b = np.clip(reward[first] + _ar1(rng, nb, sig_r, phi), 0.0, 1.0)  # [nb]
    lp_b = logp_c[first] + _ar1(rng, nb, sig_lp, phi)
    lpi_b = logp_c[first] - rng.uniform(0.2, 0.5) + _ar1(rng, nb, 1.5 * sig_lp, phi)
    rows[C.REWARD_MEAN] = r_b[bidx]
    rows[C.ACCURACY] = r_b[bidx]
    rows[C.REWARD_STD] = np.sqrt(np.clip(r_b * (1.0 - r_b), 0.0, None))[bidx]
    rows[C.LOGP_CORRECT] = lp_b[bidx]
    rows[C.LOGP_INCORRECT] = lpi_b[bidx]
    for col in (C.FRAC_ZERO_STD_GROUPS, C.COMPLETION_LENGTH, C.NUM_SEARCHES):
        rows[col] = rows[col][t0]
    # the probe of a batch: the update at its first step (lr 0: a no-op, nothing displaced)
    noop = rows[C.LEARNING_RATE][first] == 0.0  # [nb]
    if batch_size is not None:
        n_c = rng.binomial(int(batch_size), r_b).astype(float)  # [nb]
        n_i = batch_size - n_c
        n_d = rng.binomial(n_c.astype(np.int64), np.clip(share[first], 0.0, 1.0)).astype(float)
        n_d[noop] = 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(n_c > 0, n_d / n_c, np.nan)
        sd_c = 0.15 * noise / np.sqrt(np.maximum(n_c, 1.0))
        d_c = np.where(n_c > 0, delta_c[first] + rng.normal(0.0, 1.0, nb) * sd_c, np.nan)
        d_i = np.where(n_i > 0, -rng.uniform(0.3, 1.5) + rng.normal(0.0, 0.15 * noise, nb), np.nan)
        rows[C.N_CORRECT] = n_c[bidx]
        rows[C.N_INCORRECT] = n_i[bidx]
        rows[C.DELTA_INCORRECT] = np.where(noop, 0.0, d_i)[bidx]
        rows[C.DELTA_INCORRECT_PER_TOKEN] = rows[C.DELTA_INCORRECT] / len0
    else:
        frac = np.clip(rows[C.FRAC_CORRECT_DISPLACED][first], 0.0, 1.0)
        frac[noop] = 0.0
        d_c = rows[C.DELTA_CORRECT][first]
    d_c = np.where(noop, 0.0, d_c)
    tok = np.clip(0.8 * frac + 0.1 + rng.normal(0.0, 0.03, nb), 0.0, 1.0)
    tok = np.where(noop, 0.0, tok)
    rows[C.FRAC_CORRECT_DISPLACED] = frac[bidx]
    rows[C.FRAC_TOKENS_DISPLACED] = tok[bidx]
    rows[C.DELTA_CORRECT] = d_c[bidx]
    rows[C.DELTA_CORRECT_PER_TOKEN] = d_c[bidx] / len0


def _check_knobs(**k: Any) -> None:
    """Clear errors for the widening keywords of ``make_run``."""
    if k["time_scale"] is not None and k["phase_steps"] is not None:
        raise ValueError("give time_scale or phase_steps, not both")
    for name in ("time_scale", "phase_steps", "decline"):
        v = k[name]
        if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    for name in ("probe_every", "rows_per_batch"):
        if not isinstance(k[name], int | np.integer) or k[name] < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {k[name]!r}")
    if k["noise_level"] is not None and k["noise_level"] not in NOISE_LEVELS:
        raise ValueError(
            f"noise_level must be one of {tuple(NOISE_LEVELS)}, got {k['noise_level']!r}"
        )
    for name in ("logp_noise", "reward_noise"):
        v = k[name]
        if v is not None and not (isinstance(v, int | float) and v >= 0):
            raise ValueError(f"{name} must be a non-negative sd, got {v!r}")
    v = k["noise_ar"]
    if v is not None and not (isinstance(v, int | float) and 0 <= v < 1):
        raise ValueError(f"noise_ar must lie in [0, 1), got {v!r}")
    v = k["batch_size"]
    if v is not None and (not isinstance(v, int | np.integer) or v < 1):
        raise ValueError(f"batch_size must be an integer >= 1, got {v!r}")
    v = k["displaced"]
    if v is not None and not (isinstance(v, int | float) and 0 <= v <= 1):
        raise ValueError(f"displaced must be a share in [0, 1], got {v!r}")


def make_suite(
    n: int = 40,
    seed: int = 0,
    *,
    kinds: Sequence[str] = CLASSIC_KINDS,
    frac_collapse: float = 0.4,
    frac_standard_only: float = 0.25,
    frac_sparse: float = 0.2,
) -> list[LabelledRun]:
    """``n`` labelled runs: ``frac_collapse`` of them collapsing, the rest healthy kinds in turn.

    A ``frac_standard_only`` share is stripped to standard metrics, a ``frac_sparse`` share logs
    every 5 or 10 steps. Run seeds derive from ``seed``, so two suites with different seeds share
    no run (use one seed to tune, another to evaluate).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown kinds {bad}; use {KINDS}")
    rng = np.random.default_rng(seed)
    others = [k for k in kinds if k not in COLLAPSE_KINDS]
    n_collapse = (
        round(n * frac_collapse)
        if "collapse" in kinds and others
        else (n if "collapse" in kinds else 0)
    )
    runs: list[LabelledRun] = []
    for i in range(n):
        kind = "collapse" if i < n_collapse else others[(i - n_collapse) % len(others)]
        run_seed = int(seed) * 100_003 + i
        standard_only = bool(rng.random() < frac_standard_only)
        log_every = int(rng.choice([5, 10])) if rng.random() < frac_sparse else 1
        run = make_run(kind, seed=run_seed, standard_only=standard_only, log_every=log_every)
        run.labels["name"] = f"{i:03d}_{run.labels['name']}"
        runs.append(run)
    return runs


#: Ranges of the widened runs (``wide_knobs``, ``make_wide_suite``, scripts/sweep_detector.py).
WIDE_PHASE_STEPS: tuple[float, float] = (30.0, 1000.0)  # mean stagnation length, log-uniform
WIDE_LOG_EVERY: tuple[int, ...] = tuple(range(1, 11))
WIDE_PROBE_EVERY: tuple[int, ...] = tuple(range(1, 9))
WIDE_ROWS_PER_BATCH: tuple[int, ...] = (1, 2, 4, 8)
WIDE_BATCH_SIZE: tuple[int, ...] = (16, 24, 32, 40, 48, 64)  # responses probed per batch
WIDE_DECLINE: tuple[float, float] = (0.03, 0.15)  # phase II fall of logp_correct, nats/token


def wide_knobs(rng: np.random.Generator, kind: str, **fixed: Any) -> dict[str, Any]:
    """``make_run`` keywords for one widened run of ``kind``: ``fixed`` ones kept, the rest drawn.

    Drawn: ``phase_steps`` (log-uniform in ``WIDE_PHASE_STEPS``), ``log_every``,
    ``probe_every``, ``rows_per_batch``, ``noise_level`` (``small_batch`` runs are always
    ``high``), ``noise_ar`` (0-0.6), ``batch_size`` (4-8 for ``small_batch``) and, for collapsing
    runs, ``decline``.
    """
    lo, hi = WIDE_PHASE_STEPS
    k: dict[str, Any] = {
        "phase_steps": round(math.exp(rng.uniform(math.log(lo), math.log(hi))), 1),
        "log_every": int(rng.choice(WIDE_LOG_EVERY)),
        "probe_every": int(rng.choice(WIDE_PROBE_EVERY)),
        "rows_per_batch": int(rng.choice(WIDE_ROWS_PER_BATCH)),
        "noise_level": str(rng.choice(list(NOISE_LEVELS))),
        "noise_ar": round(float(rng.uniform(0.0, 0.6)), 3),
        "batch_size": int(rng.choice(WIDE_BATCH_SIZE)),
    }
    if kind == "small_batch":
        k["noise_level"] = "high"
        k["batch_size"] = int(rng.integers(4, 9))
    if kind == "collapse":
        k["decline"] = round(float(rng.uniform(*WIDE_DECLINE)), 4)
    k.update(fixed)
    return k


def make_wide_suite(
    n: int = 50,
    seed: int = 0,
    *,
    kinds: Sequence[str] = COLLAPSE_KINDS + HEALTHY_KINDS,
    frac_collapse: float = 0.4,
    frac_standard_only: float = 0.2,
) -> list[LabelledRun]:
    """``n`` labelled runs drawn from the widened ranges (``wide_knobs``).

    ``frac_collapse`` of them collapse, the rest are the healthy kinds of ``kinds`` in turn
    (warm-up and small-batch runs included), ``frac_standard_only`` are stripped to standard
    metrics. Phases last ~30-1000 steps (runs of ~110-5000 steps), rows are logged every 1-10
    steps, probes come on every 1st-8th rollout batch, rollout batches span 1-8 rows, noise is
    low, medium or high. Deterministic per ``seed``; seeds share no run.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown kinds {bad}; use {KINDS}")
    rng = np.random.default_rng([int(seed), 0xA1DE])
    others = [k for k in kinds if k not in COLLAPSE_KINDS]
    if "collapse" not in kinds:
        n_collapse = 0
    else:
        n_collapse = round(n * frac_collapse) if others else n
    runs: list[LabelledRun] = []
    for i in range(n):
        kind = "collapse" if i < n_collapse else others[(i - n_collapse) % len(others)]
        knobs = wide_knobs(rng, kind)
        standard_only = bool(rng.random() < frac_standard_only)
        run = make_run(kind, seed=int(seed) * 100_003 + i, standard_only=standard_only, **knobs)
        run.labels["name"] = f"{i:03d}_{run.labels['name']}_p{round(knobs['phase_steps'])}"
        runs.append(run)
    return runs


def write_run(run: LabelledRun, path: str | Path, *, meta: dict[str, Any] | None = None) -> Path:
    """Write one labelled run as a run folder (``RunWriter``), marked simulated in its meta."""
    from lld_monitor.runlog import RunWriter

    path = Path(path)
    full_meta: dict[str, Any] = {
        "simulated": True,
        "labels": run.labels,
        "trainer": "lld_monitor.testing (simulated, not trained)",
        "note": "SIMULATED run following the paper's published timeline; not a trained run",
    }
    full_meta.update(meta or {})
    with RunWriter(path, meta=full_meta) as writer:
        for rec in run.steps.to_dict("records"):
            row = {k: _plain(v) for k, v in rec.items() if not _is_missing(v)}
            row[C.STEP] = int(rec[C.STEP])
            # a non-finite loss is data, not a missing value: keep it
            for col in (C.LOSS, C.GRAD_NORM):
                if col in rec and _is_nan(rec[col]):
                    row[col] = float("nan")
            writer.log_step(row)
    return path


def write_suite(runs: Iterable[LabelledRun], out_dir: str | Path) -> list[Path]:
    """Write each run to ``out_dir/<run name>``; returns the folders."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [write_run(run, out / run.name) for run in runs]


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _is_missing(v: Any) -> bool:
    return v is None or _is_nan(v)


def _plain(v: Any) -> Any:
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v
