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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.testing.base import LabelledRun, _ar1, _bump
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
#: Runs with a failure that is not LLD (each must raise its own alert kind).
FAILURE_KINDS: tuple[str, ...] = ("nonfinite", "dead_signal", "entropy_collapse", "length_blowup")
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

    The keywords below widen the run to the ranges real runs measure; left at their defaults the
    run is the classic one (the same table for the same seed as before they existed):

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
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    unknown = set(timeline) - _TIMELINE_KEYS
    if unknown:
        raise ValueError(f"unknown timeline keys {sorted(unknown)}; use {sorted(_TIMELINE_KEYS)}")
    if int(log_every) < 1:
        raise ValueError(f"log_every must be >= 1, got {log_every}")
    if not noise >= 0:
        raise ValueError(f"noise must be a non-negative multiplier, got {noise}")
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
    wide = (
        time_scale is not None
        or int(probe_every) > 1
        or int(rows_per_batch) > 1
        or noise_level is not None
        or logp_noise is not None
        or reward_noise is not None
        or noise_ar is not None
        or batch_size is not None
        or decline is not None
        or displaced is not None
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
    if n_steps is None:
        n_steps = int(rng.integers(220, 301))
        if time_scale is not None:
            n_steps = round(n_steps * time_scale)
    if n_steps < 50:
        raise ValueError(f"n_steps must be >= 50 to hold a run's phases, got {n_steps}")
    n = int(n_steps)
    t = np.arange(n, dtype=float)  # [n] step index
    # Scale of the timeline: the paper's ~200-step spiral in 220-300 steps, stretched for long
    # runs and (collapse runs only) compressed for runs shorter than 220 steps.
    if time_scale is not None:
        scale = float(time_scale)
    else:
        scale = n / 220.0 if kind == "collapse" and n < 220 else max(1.0, n / 260.0)

    # --- shared random run characteristics ------------------------------------------------------
    r0 = rng.uniform(0.08, 0.3)  # initial reward
    r_gain = rng.uniform(0.2, 0.35)  # reward gained by learning
    tau_r = rng.uniform(40.0, 90.0) * scale  # learning time constant (steps)
    sig_r = noise * rng.uniform(0.01, 0.035)  # per-step reward noise (batch size)
    logp0 = rng.uniform(-0.7, -0.2)  # initial per-token log-prob of correct responses
    sig_lp = noise * rng.uniform(0.003, 0.012)  # its per-step noise
    g0 = math.exp(rng.uniform(math.log(0.15), math.log(1.5)))  # baseline grad norm
    sig_g = noise * rng.uniform(0.08, 0.2)  # log-normal grad-norm noise
    h0 = rng.uniform(0.4, 1.2)  # initial entropy
    sig_h = noise * rng.uniform(0.01, 0.03)  # relative entropy noise
    len0 = rng.uniform(150.0, 500.0)  # mean completion length
    searches = rng.uniform(1.2, 2.5)
    if level is not None:
        sig_r = rng2.uniform(*level["reward"]) if reward_noise is None else sig_r
        sig_lp = rng2.uniform(*level["logp"]) if logp_noise is None else sig_lp
        if noise_ar is None:
            noise_ar = float(rng2.uniform(0.0, 0.6))
    sig_r = float(reward_noise) if reward_noise is not None else sig_r
    sig_lp = float(logp_noise) if logp_noise is not None else sig_lp
    phi = float(noise_ar or 0.0)
    if kind == "small_batch" and batch_size is None:
        batch_size = int(rng2.integers(4, 9))

    labels: dict[str, Any] = {
        "kind": kind,
        "seed": int(seed),
        "n_steps": n,
        "log_every": int(log_every),
        "standard_only": bool(standard_only),
        "simulated": True,
        "collapse_step": None,
        "collapse_start": None,
        "decay_start": None,
        "failure": None,
        "failure_step": None,
    }

    # healthy baseline curves ------------------------------------------------------------------
    progress = 1.0 - np.exp(-t / tau_r)  # [n] learning progress in [0, 1)
    reward = r0 + r_gain * progress
    lp_gain = rng.uniform(0.12, 0.35)
    logp_c = logp0 + lp_gain * progress
    frac_disp = rng.uniform(0.15, 0.3) + 0.05 * (1.0 - progress)
    delta_c = rng.uniform(0.3, 1.2) * (1.1 - progress)  # summed change of correct responses
    log_g = np.full(n, math.log(g0)) - 0.2 * progress
    ent = h0 * (1.0 - rng.uniform(0.15, 0.4) * progress)
    length = len0 * (1.0 + rng.uniform(0.0, 0.25) * progress)
    kl = 0.002 + rng.uniform(0.01, 0.05) * progress
    lr = np.full(n, 1e-6)
    loss_nan_from: int | None = None
    phases: list[dict[str, Any]] = [{"phase": "healthy", "start_step": 0, "end_step": n - 1}]
    # displaced share of correct responses (binomial displacement, batch_size given)
    if displaced is None:
        share0 = float(rng2.uniform(0.05, 0.35))
    else:
        share0 = float(displaced)
    share = np.clip(share0 + 0.05 * (0.5 - progress), 0.0, 1.0)
    decline_used: float | None = None

    if kind == "collapse":
        s1 = int(timeline.get("stagnation_end", round(rng.uniform(45, 75) * scale)))
        s2 = int(timeline.get("collapse_start", s1 + round(rng.uniform(45, 70) * scale)))
        s3 = int(timeline.get("collapse_step", s2 + round(rng.uniform(25, 60) * scale)))
        if not 0 < s1 < s2 < s3 < n:
            raise ValueError(
                f"need 0 < stagnation_end < collapse_start < collapse_step < n_steps, got "
                f"{s1}, {s2}, {s3}, {n}"
            )
        # reward keeps rising through phases I and II, then a Gaussian fall: half at s3.
        reward = r0 + r_gain * progress
        r_peak = float(reward[s2])
        width = (s3 - s2) / math.sqrt(math.log(2.0))
        after = np.clip(t - s2, 0.0, None)
        reward = np.where(t <= s2, reward, r_peak * np.exp(-((after / width) ** 2)))
        # logp of correct responses: flat (I), steady decline (II), accelerating drop (III).
        decay_rate = rng.uniform(0.0008, 0.002) / scale
        if decline is not None:
            decay_rate = float(decline) / (s2 - s1)
        decline_used = decay_rate * (s2 - s1)
        drift = rng.uniform(-0.0001, 0.0001) / scale
        logp_c = logp0 + drift * np.minimum(t, s1)
        logp_c -= decay_rate * np.clip(t - s1, 0.0, None)
        logp_c -= rng.uniform(0.8, 2.5) * (after / (n - s2)) ** 1.5
        frac_disp = np.interp(t, [0, s1, s2, s3, n], [0.42, 0.47, 0.55, 0.8, 0.9])
        frac_disp += rng.uniform(-0.03, 0.03)
        delta_c = np.interp(t, [0, s1, s2, s3, n], [0.05, 0.0, -0.3, -2.0, -3.0])
        # displaced share: flat in phase I, past 0.5 during phase II, most in phase III
        if displaced is None:
            early = rng2.random() < 0.25  # real trained spirals: 0.6-0.93 from the first batch
            share0 = float(rng2.uniform(0.6, 0.9) if early else rng2.uniform(0.2, 0.45))
        p2 = max(share0, float(rng2.uniform(0.55, 0.75)))
        p3 = max(p2, float(rng2.uniform(0.75, 0.9)))
        share = np.interp(t, [0, s1, s2, s3, n], [share0, share0, p2, p3, max(p3, 0.92)])
        # gradient norm stable until s2, then explodes; entropy flat/slowly rising, then sharp.
        log_g = np.full(n, math.log(g0)) + np.log1p(
            rng.uniform(20.0, 80.0) * (after / (n - s2)) ** 2
        )
        ent = h0 * (
            1.0
            + rng.uniform(0.0, 0.08) * t / s2
            + rng.uniform(1.0, 3.0) * (after / (n - s2)) ** 1.5
        )
        kl = (
            0.002 + rng.uniform(0.01, 0.04) * np.minimum(t, s2) / s2 + 0.5 * (after / (n - s2)) ** 2
        )
        length = np.full(n, len0)
        phases = [
            {"phase": "stagnation", "start_step": 0, "end_step": s1 - 1},
            {"phase": "decay", "start_step": s1, "end_step": s2 - 1},
            {"phase": "collapse", "start_step": s2, "end_step": n - 1},
        ]
        labels.update(
            collapse_step=s3,
            collapse_start=s2,
            decay_start=s1,
            stagnation_end=s1,
            reward_peak=round(r_peak, 6),
        )
    elif kind == "grad_spikes":
        k = int(rng.integers(2, 6))
        spikes = timeline.get("spike_steps")
        if spikes is None:
            spikes = sorted(int(s) for s in rng.choice(np.arange(30, n - 5), size=k, replace=False))
        for s in spikes:
            width = int(rng.integers(1, 3))
            log_g[s : s + width] += math.log(rng.uniform(8.0, 30.0))
        labels["spike_steps"] = [int(s) for s in spikes]
    elif kind == "plateau":
        # converged: the learning happened before logging began
        reward = np.full(n, r0 + r_gain)
        logp_c = np.full(n, logp0 + lp_gain)
        frac_disp = np.full(n, 0.2)
        delta_c = np.full(n, 0.1)
        log_g = np.full(n, math.log(g0))
        ent = np.full(n, h0 * 0.7)
        kl = np.full(n, 0.03)
        share = np.full(n, share0)
    elif kind == "dip":
        dips = timeline.get("dip_steps")
        # classic runs: dips of fixed length; widened runs: their length follows the time scale
        dscale = scale if time_scale is not None else 1.0
        if dips is None:
            lo, hi = round(40 * dscale), n - round(60 * dscale)
            if hi <= lo:
                raise ValueError(f"n_steps={n} is too short for a dip at time_scale {scale:g}")
            dips = sorted(
                int(s)
                for s in rng.choice(np.arange(lo, hi), size=int(rng.integers(1, 3)), replace=False)
            )
        for s in dips:
            down, up = rng.uniform(5, 12) * dscale, rng.uniform(12, 30) * dscale
            b = _bump(t, s, down, up)  # [n] in [0, 1]
            reward = reward * (1.0 - rng.uniform(0.2, 0.4) * b)
            logp_c = logp_c - rng.uniform(0.01, 0.03) * b
            frac_disp = frac_disp + 0.1 * b
            share = share + 0.1 * b
            delta_c = delta_c - 0.3 * b
            log_g = log_g + math.log(rng.uniform(1.3, 2.0)) * b
            ent = ent * (1.0 + rng.uniform(0.03, 0.1) * b)
        labels["dip_steps"] = [int(s) for s in dips]
    elif kind == "warmup":
        # learning-rate warm-up from 0 (the first updates are no-ops), huge early grad norms
        lr0 = int(rng2.integers(1, 4))  # steps 0..lr0 run at lr 0
        w = max(float(rng2.uniform(0.05, 0.15) * n), 2.0 * lr0)  # warm-up length (steps)
        lr = 1e-6 * np.clip((t - lr0) / (w - lr0), 0.0, 1.0)
        log_g = log_g + math.log(rng2.uniform(5.0, 30.0)) * np.exp(-t / (w / 3.0))
        progress = 1.0 - np.exp(-np.clip(t - w / 2.0, 0.0, None) / tau_r)
        reward = r0 + r_gain * progress
        logp_c = logp0 + lp_gain * progress
        share = np.clip(share0 + 0.05 * (0.5 - progress), 0.0, 1.0)
        labels["warmup_steps"] = round(w)
    elif kind in FAILURE_KINDS:
        fs = int(timeline.get("failure_step", round(rng.uniform(0.3, 0.6) * n)))
        if not 20 <= fs < n - 20:
            raise ValueError(f"failure_step must lie in [20, n_steps - 20), got {fs}")
        labels.update(failure=kind, failure_step=fs)
        if kind == "nonfinite":
            loss_nan_from = fs
        elif kind == "dead_signal":
            # every group gets the same reward: the reward hits 0 (e.g. a broken reward function)
            reward = np.where(t < fs, reward, 0.0)
        elif kind == "entropy_collapse":
            ent = np.where(t < fs, ent, ent * np.exp(-(t - fs) / rng.uniform(5.0, 15.0)) + 1e-4)
        elif kind == "length_blowup":
            length = np.where(t < fs, length, length * np.exp((t - fs) / rng.uniform(8.0, 20.0)))
            length = np.minimum(length, len0 * 20.0)

    # --- noise ------------------------------------------------------------------------------
    reward_obs = np.clip(reward + rng.normal(0.0, sig_r, n), 0.0, 1.0)
    p = np.clip(reward, 0.0, 1.0)
    # share of 5-sample groups with all-equal rewards, per-prompt success spread around p
    zero_std = np.clip(
        p**5 + (1.0 - p) ** 5 + 0.15 * (1.0 - np.abs(2 * p - 1)) + rng.normal(0, 0.02, n), 0, 1
    )
    if kind == "dead_signal":
        zero_std = np.where(t < labels["failure_step"], zero_std, 1.0)
    rows: dict[str, np.ndarray] = {
        C.STEP: t.astype(np.int64),
        C.REWARD_MEAN: reward_obs,
        C.REWARD_STD: np.sqrt(np.clip(reward_obs * (1.0 - reward_obs), 0.0, None)),
        C.ACCURACY: reward_obs,
        C.LOSS: rng.normal(0.0, 0.01, n) + 0.001 * np.exp(log_g - math.log(g0)),
        C.LEARNING_RATE: lr,
        C.GRAD_NORM: np.exp(log_g + rng.normal(0.0, sig_g, n)),
        C.ENTROPY: ent * (1.0 + rng.normal(0.0, sig_h, n)),
        C.KL: np.abs(kl * (1.0 + rng.normal(0.0, 0.05, n))),
        C.COMPLETION_LENGTH: length * (1.0 + rng.normal(0.0, 0.02, n)),
        C.NUM_SEARCHES: searches * (1.0 + rng.normal(0.0, 0.03, n)),
        C.FRAC_ZERO_STD_GROUPS: zero_std,
        C.LOGP_CORRECT: logp_c + rng.normal(0.0, sig_lp, n),
        C.LOGP_INCORRECT: logp_c - rng.uniform(0.2, 0.5) + rng.normal(0.0, sig_lp * 1.5, n),
        C.DELTA_CORRECT: delta_c + rng.normal(0.0, 0.15 * noise, n),
        C.DELTA_CORRECT_PER_TOKEN: (delta_c + rng.normal(0.0, 0.15 * noise, n)) / len0,
        C.FRAC_CORRECT_DISPLACED: np.clip(frac_disp + rng.normal(0.0, 0.04 * noise, n), 0, 1),
        C.FRAC_TOKENS_DISPLACED: np.clip(0.8 * frac_disp + 0.1 + rng.normal(0.0, 0.03, n), 0, 1),
        C.LLDS_ENABLED: np.zeros(n),
        C.LLDS_LAMBDA: np.zeros(n),
    }
    if wide:
        _widen(
            rows,
            rng2,
            rows_per_batch=int(rows_per_batch),
            reward=reward,
            logp_c=logp_c,
            share=share,
            delta_c=delta_c,
            sig_r=sig_r,
            sig_lp=sig_lp,
            phi=phi,
            noise=noise,
            len0=len0,
            batch_size=batch_size,
        )
    if loss_nan_from is not None:
        rows[C.LOSS][loss_nan_from:] = np.nan
        rows[C.GRAD_NORM][loss_nan_from:] = np.nan
    if wide:
        logged = np.flatnonzero(rows[C.STEP] % int(log_every) == 0)
        blank = np.ones(n, dtype=bool)
        blank[logged[probe_rows(logged, int(rows_per_batch), int(probe_every))]] = False
        for col in C.DISPLACEMENT_COLUMNS:
            if col in rows:
                rows[col] = np.where(blank, np.nan, rows[col])
    steps = pd.DataFrame(rows)
    if standard_only:
        steps = steps.drop(columns=[c for c in steps.columns if c in C.LLD_COLUMNS])
    if log_every > 1:
        steps = steps[steps[C.STEP] % int(log_every) == 0].reset_index(drop=True)
    labels["phases"] = phases
    labels.update(
        time_scale=round(scale, 6),
        probe_every=int(probe_every),
        rows_per_batch=int(rows_per_batch),
        noise=round(float(noise), 6),
        noise_level=noise_level,
        logp_noise=round(float(sig_lp), 6),
        reward_noise=round(float(sig_r), 6),
        noise_ar=round(phi, 6),
        batch_size=None if batch_size is None else int(batch_size),
        decline=None if decline_used is None else round(decline_used, 6),
        displaced=round(share0, 6) if batch_size is not None else None,
    )
    suffix = ("_std" if standard_only else "") + (f"_every{log_every}" if log_every > 1 else "")
    labels["name"] = f"{kind}{suffix}_s{seed}"
    return LabelledRun(steps=steps, labels=labels)


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
