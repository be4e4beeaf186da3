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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C

#: Runs that end in the LLD death spiral.
COLLAPSE_KINDS: tuple[str, ...] = ("collapse",)
#: Healthy runs, including the hard negatives a detector must not flag.
HEALTHY_KINDS: tuple[str, ...] = ("healthy", "grad_spikes", "plateau", "dip")
#: Runs with a failure that is not LLD (each must raise its own alert kind).
FAILURE_KINDS: tuple[str, ...] = ("nonfinite", "dead_signal", "entropy_collapse", "length_blowup")
KINDS: tuple[str, ...] = COLLAPSE_KINDS + HEALTHY_KINDS + FAILURE_KINDS

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


@dataclass(frozen=True)
class LabelledRun:
    """A simulated run: the step table (one row per logged step) and its ground truth."""

    steps: pd.DataFrame
    labels: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """A short file-system-safe name (``labels["name"]``)."""
        return str(self.labels.get("name", self.labels.get("kind", "run")))


def _smoothstep(x: np.ndarray) -> np.ndarray:
    """0 for x<=0, 1 for x>=1, smooth in between; shape of x."""
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def _bump(t: np.ndarray, start: float, down: float, up: float) -> np.ndarray:
    """Transient dip profile in [0, 1]: in over ``down`` steps from ``start``, out over ``up``."""
    rise = _smoothstep((t - start) / down)
    fall = _smoothstep((t - start - down) / up)
    return rise * (1.0 - fall)


def make_run(
    kind: str = "collapse",
    n_steps: int | None = None,
    seed: int = 0,
    *,
    standard_only: bool = False,
    log_every: int = 1,
    noise: float = 1.0,
    **timeline: Any,
) -> LabelledRun:
    """Generate one labelled run of ``kind`` (see ``KINDS``), ``n_steps`` optimizer steps long.

    ``standard_only`` drops the LLD columns (a foreign log), ``log_every`` keeps one row every
    that many steps (sparse logging), ``noise`` multiplies every noise scale (small batches).
    ``timeline`` overrides the random boundaries: ``stagnation_end``, ``collapse_start``,
    ``collapse_step`` (collapse), ``spike_steps`` (grad_spikes), ``dip_steps`` (dip),
    ``failure_step`` (failure kinds).
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
    rng = np.random.default_rng(seed)
    if n_steps is None:
        n_steps = int(rng.integers(220, 301))
    if n_steps < 50:
        raise ValueError(f"n_steps must be >= 50 to hold a run's phases, got {n_steps}")
    n = int(n_steps)
    t = np.arange(n, dtype=float)  # [n] step index
    # Scale of the timeline: the paper's ~200-step spiral in 220-300 steps, stretched for long
    # runs and (collapse runs only) compressed for runs shorter than 220 steps.
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

    labels: dict[str, Any] = {
        "kind": kind,
        "seed": int(seed),
        "n_steps": n,
        "log_every": int(log_every),
        "standard_only": bool(standard_only),
        "simulated": True,
        "collapse_step": None,
        "collapse_start": None,
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
    loss_nan_from: int | None = None
    phases: list[dict[str, Any]] = [{"phase": "healthy", "start_step": 0, "end_step": n - 1}]

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
        drift = rng.uniform(-0.0001, 0.0001) / scale
        logp_c = logp0 + drift * np.minimum(t, s1)
        logp_c -= decay_rate * np.clip(t - s1, 0.0, None)
        logp_c -= rng.uniform(0.8, 2.5) * (after / (n - s2)) ** 1.5
        frac_disp = np.interp(t, [0, s1, s2, s3, n], [0.42, 0.47, 0.55, 0.8, 0.9])
        frac_disp += rng.uniform(-0.03, 0.03)
        delta_c = np.interp(t, [0, s1, s2, s3, n], [0.05, 0.0, -0.3, -2.0, -3.0])
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
    elif kind == "dip":
        dips = timeline.get("dip_steps")
        if dips is None:
            dips = sorted(
                int(s)
                for s in rng.choice(
                    np.arange(40, n - 60), size=int(rng.integers(1, 3)), replace=False
                )
            )
        for s in dips:
            down, up = rng.uniform(5, 12), rng.uniform(12, 30)
            b = _bump(t, s, down, up)  # [n] in [0, 1]
            reward = reward * (1.0 - rng.uniform(0.2, 0.4) * b)
            logp_c = logp_c - rng.uniform(0.01, 0.03) * b
            frac_disp = frac_disp + 0.1 * b
            delta_c = delta_c - 0.3 * b
            log_g = log_g + math.log(rng.uniform(1.3, 2.0)) * b
            ent = ent * (1.0 + rng.uniform(0.03, 0.1) * b)
        labels["dip_steps"] = [int(s) for s in dips]
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
        C.LEARNING_RATE: np.full(n, 1e-6),
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
    if loss_nan_from is not None:
        rows[C.LOSS][loss_nan_from:] = np.nan
        rows[C.GRAD_NORM][loss_nan_from:] = np.nan
    steps = pd.DataFrame(rows)
    if standard_only:
        steps = steps.drop(columns=[c for c in steps.columns if c in C.LLD_COLUMNS])
    if log_every > 1:
        steps = steps[steps[C.STEP] % int(log_every) == 0].reset_index(drop=True)
    labels["phases"] = phases
    suffix = ("_std" if standard_only else "") + (f"_every{log_every}" if log_every > 1 else "")
    labels["name"] = f"{kind}{suffix}_s{seed}"
    return LabelledRun(steps=steps, labels=labels)


def make_suite(
    n: int = 40,
    seed: int = 0,
    *,
    kinds: Sequence[str] = COLLAPSE_KINDS + HEALTHY_KINDS,
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
