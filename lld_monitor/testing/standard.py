"""Labelled runs with standard metrics only (what foreign logs have: no LLD columns), and the
calibration runs. SIMULATED, as the rest of ``lld_monitor.testing``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.testing.base import LabelledRun, _ar1, _bump, _smoothstep

# --- standard-metric-only runs (foreign logs: no LLD columns) ---------------------------------

#: Collapses seen in standard metrics alone (issue: logs users really have). ``drop``: the reward
#: falls back to its start and stays, nothing else moves; ``drop_corroborated``: with a grad-norm
#: surge and an entropy rise; ``drop_dead``: to the floor, then grad norm exactly 0 and every group
#: identical; ``mode_collapse``: completions shrink to a few tokens, most groups identical (the
#: reward may hold); ``spiral``: a slow decline, then a fast fall with a grad-norm surge;
#: ``early_death``: the reward falls from the first steps to its floor, completions to one token.
STANDARD_COLLAPSE_KINDS: tuple[str, ...] = (
    "drop",
    "drop_corroborated",
    "drop_dead",
    "mode_collapse",
    "spiral",
    "early_death",
)
#: Healthy standard-metric runs, the hard negatives: ``learning``; ``plateau_max`` (near the
#: maximum reward, many identical groups); ``noisy`` (row noise up to the whole gain);
#: ``held_low`` (a small gain held at a stable low level, as LLDS holds a run); ``dip`` (a deep
#: transient dip that recovers); ``never_learned`` (flat at the floor from the start: a dead
#: signal, not a collapse); ``grad_spikes`` (single-row grad-norm spikes).
STANDARD_HEALTHY_KINDS: tuple[str, ...] = (
    "learning",
    "plateau_max",
    "noisy",
    "held_low",
    "dip",
    "never_learned",
    "grad_spikes",
)
STANDARD_KINDS: tuple[str, ...] = STANDARD_COLLAPSE_KINDS + STANDARD_HEALTHY_KINDS


def make_standard_run(
    kind: str,
    seed: int = 0,
    *,
    n_steps: int | None = None,
    log_every: int | None = None,
    noise_frac: float | None = None,
    short: bool = False,
) -> LabelledRun:
    """One labelled run with standard metrics only (reward, reward_std, frac_zero_std_groups,
    grad_norm, entropy, completion_length, frac_truncated, kl, loss, learning_rate).

    Drawn unless given: ``n_steps`` log-uniform in 150-3000, ``log_every`` from 1, 2, 5, 10;
    ``short`` logs draw 30-60 rows every 5-10 steps instead. The reward starts at ``r0``, gains
    ``gain`` (rewards are then scaled by 1 or 2.5 and offset by 0 or -1, as logs of other reward
    ranges), row noise sd ``noise_frac * gain`` (0.05-0.35; ``noisy``: 0.5-1.0) with AR(1)
    correlation. Labels: ``collapse_start`` = the step the reward leaves the level it held (the
    onset; a spiral's slow decline), ``fall_start`` = the start of the fast fall,
    ``collapse_step`` = first step its noise-free value is below half the gain, all None for
    healthy kinds; ``kind``, ``n_steps``, ``log_every``, ``noise_frac``.
    """
    if kind not in STANDARD_KINDS:
        raise ValueError(f"unknown standard kind {kind!r}; use one of {STANDARD_KINDS}")
    rng = np.random.default_rng([int(seed), 0x57D])
    if short:
        rows = int(rng.integers(30, 61))
        log_every = log_every or int(rng.choice([5, 10]))
        n = n_steps or rows * log_every
    else:
        n = n_steps or round(math.exp(rng.uniform(math.log(150), math.log(3000))))
        log_every = log_every or int(rng.choice([1, 2, 5, 10]))
    if n < 10 * log_every:
        raise ValueError(f"n_steps={n} gives fewer than 10 rows at log_every={log_every}")
    t = np.arange(1, n + 1, dtype=float)  # [n] steps
    nf = noise_frac if noise_frac is not None else float(rng.uniform(0.05, 0.35))
    if kind == "noisy" and noise_frac is None:
        nf = float(rng.uniform(0.5, 1.0))
    r0 = float(rng.uniform(0.0, 0.3))
    gain = float(rng.uniform(0.3, 0.65))
    if kind == "held_low":
        gain = float(rng.uniform(0.1, 0.2))
    if kind == "plateau_max":
        r0, gain = float(rng.uniform(0.4, 0.7)), 0.0
        gain = float(rng.uniform(0.9, 0.98)) - r0
    tau = float(rng.uniform(0.05, 0.2)) * n
    acc = r0 + gain * (1.0 - np.exp(-t / tau))  # [n] noise-free accuracy in [0, 1]
    log_g = np.log(rng.uniform(0.1, 1.0)) * np.ones(n)  # [n] log grad norm
    ent = rng.uniform(0.2, 1.0) * (1.0 - rng.uniform(0.2, 0.4) * t / n)  # [n]
    length = rng.uniform(100, 1000) * (1.0 + rng.uniform(-0.3, 0.3) * t / n)  # [n]
    zstd_override = np.full(n, np.nan)  # [n] where a kind sets the identical-group share
    dead = np.zeros(n, dtype=bool)  # [n] steps with no gradient at all
    labels: dict[str, Any] = {"collapse_start": None, "collapse_step": None, "fall_start": None}
    t_c = float(rng.uniform(0.4, 0.8)) * n
    d = max(float(rng.uniform(0.01, 0.08)) * n, 1.0)  # steps the fall takes
    fall = _smoothstep((t - t_c) / d)  # [n] 0 before the onset, 1 after the fall
    if kind in ("drop", "drop_corroborated", "drop_dead", "spiral"):
        held = acc.copy()
        if kind == "spiral":
            t_s = float(rng.uniform(0.25, 0.45)) * n
            t_c = max(t_c, t_s + 0.2 * n)
            fall = _smoothstep((t - t_c) / d)
            slow = np.clip((t - t_s) / (t_c - t_s), 0.0, 1.0)
            held = acc - float(rng.uniform(0.1, 0.3)) * gain * slow
        end = r0 + float(rng.uniform(-0.1, 0.2)) * gain
        if kind == "drop_dead":
            end = 0.0
        acc = held * (1.0 - fall) + end * fall
        if kind in ("drop_corroborated", "spiral"):
            log_g = log_g + math.log(rng.uniform(5.0, 150.0)) * fall
            ent = ent * (1.0 + rng.uniform(0.5, 2.0) * fall)
        if kind == "drop_dead":
            dead = fall >= 1.0
            ent = ent * (1.0 - 0.99 * fall)
        labels["collapse_start"] = round(t_s if kind == "spiral" else t_c)
        labels["fall_start"] = round(t_c)
    elif kind == "mode_collapse":
        length = length * (1.0 - fall) + rng.uniform(2.0, 10.0) * fall
        ent = ent * (1.0 - 0.9 * fall)
        zstd_override = np.where(fall > 0.5, rng.uniform(0.7, 1.0), np.nan)
        if rng.random() < 0.5:  # the reward falls too (else a format reward holds it)
            acc = acc * (1.0 - fall) + r0 * fall
        labels["collapse_start"] = labels["fall_start"] = round(t_c)
    elif kind == "early_death":
        t_c = float(rng.uniform(0.005, 0.05)) * n + 1.0
        d = max(float(rng.uniform(0.01, 0.04)) * n, 2.0)
        fall = _smoothstep((t - t_c) / d)
        acc = (r0 + 0.1) * (1.0 - fall)
        length = length * (1.0 - fall) + 1.0 * fall
        ent = ent * (1.0 - 0.99 * fall)
        dead = fall >= 1.0
        labels["collapse_start"] = labels["fall_start"] = round(t_c)
    elif kind == "dip":
        t_d = float(rng.uniform(0.4, 0.8)) * n
        down, up = max(0.01 * n, 2.0), float(rng.uniform(0.02, 0.06)) * n
        acc = acc - float(rng.uniform(0.3, 0.6)) * gain * _bump(t, t_d, down, up)
        labels["dip_steps"] = [int(t_d)]
    elif kind == "never_learned":
        acc = np.full(n, float(rng.uniform(0.0, 0.03)))
    elif kind == "grad_spikes":
        for s in rng.choice(n, size=int(rng.integers(2, 6)), replace=False):
            log_g[s] += math.log(rng.uniform(10.0, 50.0))
    acc = np.clip(acc, 0.0, 1.0)
    steps = _standard_observe(
        rng, kind, t, acc, gain, nf, tau, log_g, ent, length, dead, zstd_override
    )
    if labels["collapse_start"] is not None:
        half = np.flatnonzero((t >= labels["collapse_start"]) & (acc < r0 + 0.5 * max(gain, 0.2)))
        labels["collapse_step"] = int(t[half[0]]) if half.size else None
        if kind == "mode_collapse" and labels["collapse_step"] is None:
            labels["collapse_step"] = labels["collapse_start"]  # the reward may hold
    keep = (t.astype(int) % log_every == 0) | (t == 1)
    steps = steps[keep].reset_index(drop=True)
    labels.update(kind=kind, n_steps=n, log_every=log_every, noise_frac=round(nf, 4))
    labels.update(standard_only=True, name=f"std_{kind}_s{seed}")
    return LabelledRun(steps, labels)


def make_standard_suite(
    n_per_kind: int = 5, seed: int = 0, *, kinds: Sequence[str] = STANDARD_KINDS
) -> list[LabelledRun]:
    """``n_per_kind`` runs of each standard kind, a third of them short logs (30-60 rows every
    5-10 steps); deterministic per ``seed``, seeds share no run."""
    if n_per_kind < 1:
        raise ValueError(f"n_per_kind must be >= 1, got {n_per_kind}")
    runs: list[LabelledRun] = []
    for k, kind in enumerate(kinds):
        for i in range(n_per_kind):
            run_seed = int(seed) * 1_000_003 + k * 1009 + i
            run = make_standard_run(kind, run_seed, short=(i % 3 == 2))
            run.labels["name"] = f"{len(runs):03d}_{run.labels['name']}"
            runs.append(run)
    return runs


# --- calibration runs of the collapse call (issue 28) ------------------------------------------

#: Kinds of ``make_calibration_run``: healthy runs that rise from a low start or start near their
#: plateau, and the same runs collapsing to near the reward's floor (with and without a
#: corroborating signal).
CALIBRATION_HEALTHY_KINDS: tuple[str, ...] = ("healthy_rise", "healthy_plateau")
CALIBRATION_COLLAPSE_KINDS: tuple[str, ...] = (
    "collapse_rise",
    "collapse_rise_corroborated",
    "collapse_plateau",
    "collapse_plateau_corroborated",
)
CALIBRATION_KINDS = CALIBRATION_HEALTHY_KINDS + CALIBRATION_COLLAPSE_KINDS


def make_calibration_run(kind: str, seed: int = 0) -> LabelledRun:
    """A long, noisy TRL-style log with standard metrics, for the calibration of the collapse
    call: 300-3000 rows logged every 1 or 5 steps; each row the mean reward of 2-16 sampled
    completions (binomial: discrete, skewed near 0 and 1) of one or two reward functions summed
    (correctness, and a format reward weighted 0.5 or 1); the accuracy rises from 0.02-0.3 to a
    plateau of 0.35-0.95 (``*_rise``) or starts within 10% of it (``*_plateau``), wanders (AR(1)
    prompt difficulty) and drifts by up to +-10% over the run; single-row spikes of entropy
    (x5-x30) and grad norm (x5-x20) on about 1% of rows; healthy runs get up to 3 transient dips
    (to 50-80% of the level for 3-30 rows) that recover. Collapses: at 40-80% of the run both
    rewards fall at once to near zero (0-5% of their level) and stay there; ``*_corroborated``
    adds a grad norm x10 (or dead) and entropy x3 from the fall on.

    Labels: ``kind``, ``n_rows``, ``log_every``, ``samples``, ``plateau_start`` (bool),
    ``change_row`` (0-based index of the first fallen row, None when healthy), ``change_step``,
    ``drop_sd`` (the fall in sd of the rows before it: (mean of the 100 rows before - mean
    after) / (sd of their consecutive differences / sqrt 2)), ``corroborated``.
    """
    if kind not in CALIBRATION_KINDS:
        raise ValueError(f"unknown calibration kind {kind!r}; use one of {CALIBRATION_KINDS}")
    rng = np.random.default_rng([int(seed), 0xCA1, CALIBRATION_KINDS.index(kind)])
    n = round(math.exp(rng.uniform(math.log(300), math.log(3000))))  # rows
    every = int(rng.choice([1, 5]))
    samples = int(rng.choice([2, 4, 8, 16]))
    plateau_start = kind.endswith("plateau") or "_plateau" in kind
    collapse = kind.startswith("collapse")
    corroborated = kind.endswith("corroborated")
    i = np.arange(n, dtype=float)  # [n] rows
    top = float(rng.uniform(0.35, 0.95))
    p0 = top * float(rng.uniform(0.9, 1.0)) if plateau_start else float(rng.uniform(0.02, 0.3))
    p0 = min(p0, top)
    tau = float(rng.uniform(0.03, 0.2)) * n
    drift = 1.0 + float(rng.uniform(-0.1, 0.1)) * i / n  # [n]
    acc = (p0 + (top - p0) * (1.0 - np.exp(-i / tau))) * drift  # [n] noise-free accuracy
    acc = acc + _ar1(rng, n, float(rng.uniform(0.01, 0.06)), float(rng.uniform(0.0, 0.8)))
    two = bool(rng.random() < 0.5)
    w_fmt = float(rng.choice([0.5, 1.0])) if two else 0.0
    fmt_top = float(rng.uniform(0.85, 0.99))
    fmt = fmt_top - (fmt_top - float(rng.uniform(0.1, 0.5))) * np.exp(-i / (0.5 * tau))  # [n]
    if plateau_start:
        fmt = np.full(n, fmt_top)
    change = None
    if collapse:
        change = int(rng.uniform(0.4, 0.8) * n)
        acc[change:] = acc[change:] * float(rng.uniform(0.0, 0.05))
        fmt[change:] = fmt[change:] * float(rng.uniform(0.0, 0.05))
    else:
        for _ in range(int(rng.integers(0, 4))):
            a = int(rng.integers(int(0.2 * n), n - 30))
            b = a + int(rng.integers(3, 31))
            depth = float(rng.uniform(0.5, 0.8))
            acc[a:b] *= depth
            fmt[a:b] = fmt[a:b] * (1.0 - 0.5 * (1.0 - depth))
    acc = np.clip(acc, 0.0, 1.0)
    fmt = np.clip(fmt, 0.0, 1.0)
    reward = rng.binomial(samples, acc) / samples  # [n]
    if two:
        reward = reward + w_fmt * rng.binomial(samples, fmt) / samples
    grad = float(rng.uniform(0.1, 1.0)) * np.exp(rng.normal(0.0, 0.3, n))  # [n]
    ent = float(rng.uniform(0.2, 1.0)) * np.exp(rng.normal(0.0, 0.05, n))  # [n]
    length = float(rng.uniform(100, 800)) * np.exp(rng.normal(0.0, 0.05, n))  # [n]
    spikes = rng.random(n) < 0.01
    ent[spikes] *= rng.uniform(5, 30, int(spikes.sum()))
    spikes = rng.random(n) < 0.01
    grad[spikes] *= rng.uniform(5, 20, int(spikes.sum()))
    if corroborated and change is not None:
        grad[change:] = 0.0 if rng.random() < 0.3 else grad[change:] * 10.0
        ent[change:] *= 3.0
    steps = (i + 1.0) * every
    drop_sd = None
    if change is not None:
        pre = reward[max(0, change - 100) : change]
        sd = float(np.std(np.diff(pre)) / math.sqrt(2.0))
        drop_sd = float((pre.mean() - reward[change:].mean()) / sd) if sd > 0 else math.inf
    df = pd.DataFrame(
        {
            C.STEP: steps.astype(int),
            C.REWARD_MEAN: reward,
            C.GRAD_NORM: grad,
            C.ENTROPY: ent,
            C.COMPLETION_LENGTH: length,
        }
    )
    labels = {
        "kind": kind,
        "name": f"{kind}-{seed}",
        "n_rows": n,
        "log_every": every,
        "samples": samples,
        "plateau_start": plateau_start,
        "change_row": change,
        "change_step": None if change is None else int(steps[change]),
        "drop_sd": drop_sd,
        "corroborated": corroborated,
    }
    return LabelledRun(df, labels)


def _standard_observe(
    rng: np.random.Generator,
    kind: str,
    t: np.ndarray,
    acc: np.ndarray,
    gain: float,
    nf: float,
    tau: float,
    log_g: np.ndarray,
    ent: np.ndarray,
    length: np.ndarray,
    dead: np.ndarray,
    zstd_override: np.ndarray,
) -> pd.DataFrame:
    """The logged standard columns of ``make_standard_run`` from its noise-free curves ([n]
    arrays over the steps ``t``): the reward with AR(1) noise, group statistics from the
    accuracy, the reward's scale and offset, the other signals' noise."""
    n = len(t)
    # observed values: AR(1) noise on the reward, group statistics from the accuracy
    phi = float(rng.uniform(0.0, 0.5))
    sd = nf * max(gain, 0.1)
    noise = _ar1(rng, n, sd, phi)  # [n]
    G, n_groups = 8, 16
    p_same = acc**G + (1.0 - acc) ** G  # [n] chance that a group's rewards are identical
    zstd = rng.binomial(n_groups, np.clip(p_same, 0.0, 1.0)) / n_groups
    zstd = np.where(np.isfinite(zstd_override), zstd_override, zstd)
    reward_acc = np.clip(acc + noise * (1.0 - zstd), 0.0, 1.0)
    exact = dead | (zstd >= 1.0)
    reward_acc = np.where(exact, acc, reward_acc)
    zstd = np.where(dead, 1.0, zstd)
    rstd = np.sqrt(np.clip(reward_acc * (1.0 - reward_acc), 0.0, None)) * (1.0 - zstd)
    scale, offset = float(rng.choice([1.0, 2.5])), float(rng.choice([0.0, 0.0, -1.0]))
    grad = np.exp(log_g + rng.normal(0.0, 0.3, n))
    grad = np.where(dead, 0.0, grad)
    if kind in ("plateau_max", "never_learned"):  # identical groups carry no gradient
        grad = grad * (1.0 - zstd) + 1e-4 * zstd
    return pd.DataFrame(
        {
            C.STEP: t.astype(int),
            C.REWARD_MEAN: reward_acc * scale + offset,
            C.REWARD_STD: rstd * scale,
            C.FRAC_ZERO_STD_GROUPS: zstd,
            C.GRAD_NORM: grad,
            C.ENTROPY: np.clip(ent * np.exp(rng.normal(0.0, 0.05, n)), 1e-5, None),
            C.COMPLETION_LENGTH: np.clip(length * np.exp(rng.normal(0.0, 0.05, n)), 1.0, None),
            C.FRAC_TRUNCATED: np.clip(rng.normal(0.02, 0.01, n), 0.0, 1.0),
            C.KL: 0.05 * (1.0 - np.exp(-t / tau)) * np.exp(rng.normal(0.0, 0.2, n)),
            C.LOSS: rng.normal(0.0, 0.01, n),
            C.LEARNING_RATE: np.full(n, 1e-6),
        }
    )
