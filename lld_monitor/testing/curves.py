"""The curves of a simulated run (``make_run``): its random characteristics, the healthy
baseline, each kind's timeline (the death spiral, spikes, dips, warm-up, the non-LLD failures) and
the logged columns with their noise. Every function draws from the generators it is given in the
order the classic run always drew, so a seed gives the same table as before this split."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from lld_monitor import columns as C
from lld_monitor.testing.base import _bump

#: Runs with a failure that is not LLD (each must raise its own alert kind).
FAILURE_KINDS: tuple[str, ...] = ("nonfinite", "dead_signal", "entropy_collapse", "length_blowup")


def draw(
    rng: np.random.Generator,
    rng2: np.random.Generator,
    scale: float,
    noise: float,
    level: dict[str, Any] | None,
    reward_noise: float | None,
    logp_noise: float | None,
    noise_ar: float | None,
) -> dict[str, Any]:
    """The run's random characteristics (levels, time constant, noise scales), in the order the
    classic run draws them; a noise level's draws from the second stream (``noise_ar`` too,
    unless given)."""
    d: dict[str, Any] = {"noise_ar": noise_ar}
    d["r0"] = rng.uniform(0.08, 0.3)  # initial reward
    d["r_gain"] = rng.uniform(0.2, 0.35)  # reward gained by learning
    d["tau_r"] = rng.uniform(40.0, 90.0) * scale  # learning time constant (steps)
    sig_r = noise * rng.uniform(0.01, 0.035)  # per-step reward noise (batch size)
    d["logp0"] = rng.uniform(-0.7, -0.2)  # initial per-token log-prob of correct responses
    sig_lp = noise * rng.uniform(0.003, 0.012)  # its per-step noise
    d["g0"] = math.exp(rng.uniform(math.log(0.15), math.log(1.5)))  # baseline grad norm
    d["sig_g"] = noise * rng.uniform(0.08, 0.2)  # log-normal grad-norm noise
    d["h0"] = rng.uniform(0.4, 1.2)  # initial entropy
    d["sig_h"] = noise * rng.uniform(0.01, 0.03)  # relative entropy noise
    d["len0"] = rng.uniform(150.0, 500.0)  # mean completion length
    d["searches"] = rng.uniform(1.2, 2.5)
    if level is not None:
        sig_r = rng2.uniform(*level["reward"]) if reward_noise is None else sig_r
        sig_lp = rng2.uniform(*level["logp"]) if logp_noise is None else sig_lp
        if noise_ar is None:
            d["noise_ar"] = float(rng2.uniform(0.0, 0.6))
    d["sig_r"] = float(reward_noise) if reward_noise is not None else sig_r
    d["sig_lp"] = float(logp_noise) if logp_noise is not None else sig_lp
    return d


class _Curves(SimpleNamespace):
    """The noise-free curves of a run ([n] arrays over the step index ``t``) and what its
    kind's timeline set; the kind functions (``_KIND_CURVES``) change them in place."""


def healthy_curves(
    rng: np.random.Generator,
    rng2: np.random.Generator,
    d: dict[str, Any],
    n: int,
    displaced: float | None,
) -> _Curves:
    """The healthy baseline: learning with time constant ``tau_r``, every signal's level and
    trend."""
    t = np.arange(n, dtype=float)  # [n] step index
    progress = 1.0 - np.exp(-t / d["tau_r"])  # [n] learning progress in [0, 1)
    lp_gain = rng.uniform(0.12, 0.35)
    d["lp_gain"] = lp_gain
    c = _Curves(
        t=t,
        n=n,
        progress=progress,
        reward=d["r0"] + d["r_gain"] * progress,
        logp_c=d["logp0"] + lp_gain * progress,
        frac_disp=rng.uniform(0.15, 0.3) + 0.05 * (1.0 - progress),
        delta_c=rng.uniform(0.3, 1.2) * (1.1 - progress),  # summed change of correct responses
        log_g=np.full(n, math.log(d["g0"])) - 0.2 * progress,
        ent=d["h0"] * (1.0 - rng.uniform(0.15, 0.4) * progress),
        length=d["len0"] * (1.0 + rng.uniform(0.0, 0.25) * progress),
        kl=0.002 + rng.uniform(0.01, 0.05) * progress,
        lr=np.full(n, 1e-6),
        loss_nan_from=None,
        phases=[{"phase": "healthy", "start_step": 0, "end_step": n - 1}],
        decline_used=None,
    )
    # displaced share of correct responses (binomial displacement, batch_size given)
    c.share0 = float(rng2.uniform(0.05, 0.35)) if displaced is None else float(displaced)
    c.share = np.clip(c.share0 + 0.05 * (0.5 - progress), 0.0, 1.0)
    return c


def _no_change(c: _Curves, d: dict[str, Any], *args: Any, **kw: Any) -> None:
    """``healthy`` and ``small_batch``: the baseline as it is."""


def _collapse(
    c: _Curves,
    d: dict[str, Any],
    rng: Any,
    rng2: Any,
    *,
    scale: float,
    timeline: dict,
    labels: dict,
    decline: float | None,
    displaced: float | None,
    **_: Any,
) -> None:
    """The death spiral: stagnation, decay, collapse (PAPER.md's timeline, scaled)."""
    t, n, r0, r_gain = c.t, c.n, d["r0"], d["r_gain"]
    s1 = int(timeline.get("stagnation_end", round(rng.uniform(45, 75) * scale)))
    s2 = int(timeline.get("collapse_start", s1 + round(rng.uniform(45, 70) * scale)))
    s3 = int(timeline.get("collapse_step", s2 + round(rng.uniform(25, 60) * scale)))
    if not 0 < s1 < s2 < s3 < n:
        raise ValueError(
            f"need 0 < stagnation_end < collapse_start < collapse_step < n_steps, got "
            f"{s1}, {s2}, {s3}, {n}"
        )
    # reward keeps rising through phases I and II, then a Gaussian fall: half at s3.
    reward = r0 + r_gain * c.progress
    r_peak = float(reward[s2])
    width = (s3 - s2) / math.sqrt(math.log(2.0))
    after = np.clip(t - s2, 0.0, None)
    c.reward = np.where(t <= s2, reward, r_peak * np.exp(-((after / width) ** 2)))
    # logp of correct responses: flat (I), steady decline (II), accelerating drop (III).
    decay_rate = rng.uniform(0.0008, 0.002) / scale
    if decline is not None:
        decay_rate = float(decline) / (s2 - s1)
    c.decline_used = decay_rate * (s2 - s1)
    drift = rng.uniform(-0.0001, 0.0001) / scale
    logp_c = d["logp0"] + drift * np.minimum(t, s1)
    logp_c -= decay_rate * np.clip(t - s1, 0.0, None)
    logp_c -= rng.uniform(0.8, 2.5) * (after / (n - s2)) ** 1.5
    c.logp_c = logp_c
    c.frac_disp = np.interp(t, [0, s1, s2, s3, n], [0.42, 0.47, 0.55, 0.8, 0.9])
    c.frac_disp += rng.uniform(-0.03, 0.03)
    c.delta_c = np.interp(t, [0, s1, s2, s3, n], [0.05, 0.0, -0.3, -2.0, -3.0])
    # displaced share: flat in phase I, past 0.5 during phase II, most in phase III
    if displaced is None:
        early = rng2.random() < 0.25  # real trained spirals: 0.6-0.93 from the first batch
        c.share0 = float(rng2.uniform(0.6, 0.9) if early else rng2.uniform(0.2, 0.45))
    p2 = max(c.share0, float(rng2.uniform(0.55, 0.75)))
    p3 = max(p2, float(rng2.uniform(0.75, 0.9)))
    c.share = np.interp(t, [0, s1, s2, s3, n], [c.share0, c.share0, p2, p3, max(p3, 0.92)])
    # gradient norm stable until s2, then explodes; entropy flat/slowly rising, then sharp.
    c.log_g = np.full(n, math.log(d["g0"])) + np.log1p(
        rng.uniform(20.0, 80.0) * (after / (n - s2)) ** 2
    )
    c.ent = d["h0"] * (
        1.0 + rng.uniform(0.0, 0.08) * t / s2 + rng.uniform(1.0, 3.0) * (after / (n - s2)) ** 1.5
    )
    c.kl = 0.002 + rng.uniform(0.01, 0.04) * np.minimum(t, s2) / s2 + 0.5 * (after / (n - s2)) ** 2
    c.length = np.full(n, d["len0"])
    c.phases = [
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


def _grad_spikes(
    c: _Curves, d: dict, rng: Any, rng2: Any, *, timeline: dict, labels: dict, **_: Any
) -> None:
    """Healthy, with 2-5 grad-norm spikes of x8-30 lasting 1-2 steps."""
    k = int(rng.integers(2, 6))
    spikes = timeline.get("spike_steps")
    if spikes is None:
        spikes = sorted(int(s) for s in rng.choice(np.arange(30, c.n - 5), size=k, replace=False))
    for s in spikes:
        width = int(rng.integers(1, 3))
        c.log_g[s : s + width] += math.log(rng.uniform(8.0, 30.0))
    labels["spike_steps"] = [int(s) for s in spikes]


def _plateau(c: _Curves, d: dict, rng: Any, rng2: Any, **_: Any) -> None:
    """Converged: the learning happened before logging began."""
    n = c.n
    c.reward = np.full(n, d["r0"] + d["r_gain"])
    c.logp_c = np.full(n, d["logp0"] + d["lp_gain"])
    c.frac_disp = np.full(n, 0.2)
    c.delta_c = np.full(n, 0.1)
    c.log_g = np.full(n, math.log(d["g0"]))
    c.ent = np.full(n, d["h0"] * 0.7)
    c.kl = np.full(n, 0.03)
    c.share = np.full(n, c.share0)


def _dip(
    c: _Curves,
    d: dict,
    rng: Any,
    rng2: Any,
    *,
    scale: float,
    timeline: dict,
    labels: dict,
    time_scale: float | None,
    **_: Any,
) -> None:
    """Healthy, with 1-2 dips of the reward that recover (a hard negative)."""
    t, n = c.t, c.n
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
        c.reward = c.reward * (1.0 - rng.uniform(0.2, 0.4) * b)
        c.logp_c = c.logp_c - rng.uniform(0.01, 0.03) * b
        c.frac_disp = c.frac_disp + 0.1 * b
        c.share = c.share + 0.1 * b
        c.delta_c = c.delta_c - 0.3 * b
        c.log_g = c.log_g + math.log(rng.uniform(1.3, 2.0)) * b
        c.ent = c.ent * (1.0 + rng.uniform(0.03, 0.1) * b)
    labels["dip_steps"] = [int(s) for s in dips]


def _warmup(c: _Curves, d: dict, rng: Any, rng2: Any, *, labels: dict, **_: Any) -> None:
    """Learning-rate warm-up from 0 (the first updates are no-ops), huge early grad norms."""
    t, n = c.t, c.n
    lr0 = int(rng2.integers(1, 4))  # steps 0..lr0 run at lr 0
    w = max(float(rng2.uniform(0.05, 0.15) * n), 2.0 * lr0)  # warm-up length (steps)
    c.lr = 1e-6 * np.clip((t - lr0) / (w - lr0), 0.0, 1.0)
    c.log_g = c.log_g + math.log(rng2.uniform(5.0, 30.0)) * np.exp(-t / (w / 3.0))
    c.progress = 1.0 - np.exp(-np.clip(t - w / 2.0, 0.0, None) / d["tau_r"])
    c.reward = d["r0"] + d["r_gain"] * c.progress
    c.logp_c = d["logp0"] + d["lp_gain"] * c.progress
    c.share = np.clip(c.share0 + 0.05 * (0.5 - c.progress), 0.0, 1.0)
    labels["warmup_steps"] = round(w)


def _failure(
    c: _Curves, d: dict, rng: Any, rng2: Any, *, timeline: dict, labels: dict, kind: str, **_: Any
) -> None:
    """A non-LLD failure from ``failure_step`` on (its kind)."""
    t, n = c.t, c.n
    fs = int(timeline.get("failure_step", round(rng.uniform(0.3, 0.6) * n)))
    if not 20 <= fs < n - 20:
        raise ValueError(f"failure_step must lie in [20, n_steps - 20), got {fs}")
    labels.update(failure=kind, failure_step=fs)
    if kind == "nonfinite":
        c.loss_nan_from = fs
    elif kind == "dead_signal":
        # every group gets the same reward: the reward hits 0 (e.g. a broken reward function)
        c.reward = np.where(t < fs, c.reward, 0.0)
    elif kind == "entropy_collapse":
        c.ent = np.where(t < fs, c.ent, c.ent * np.exp(-(t - fs) / rng.uniform(5.0, 15.0)) + 1e-4)
    elif kind == "length_blowup":
        length = np.where(t < fs, c.length, c.length * np.exp((t - fs) / rng.uniform(8.0, 20.0)))
        c.length = np.minimum(length, d["len0"] * 20.0)


#: kind -> the function that shapes its curves (the healthy baseline as it is otherwise)
_KIND_CURVES: dict[str, Callable[..., None]] = {
    "collapse": _collapse,
    "grad_spikes": _grad_spikes,
    "plateau": _plateau,
    "dip": _dip,
    "warmup": _warmup,
    **{k: _failure for k in FAILURE_KINDS},
}


def shape_curves(kind: str, c: _Curves, d: dict[str, Any], rng: Any, rng2: Any, **kw: Any) -> None:
    """Shape the healthy baseline ``c`` into a run of ``kind`` (in place; ``kw``: ``scale``,
    ``timeline``, ``labels``, ``time_scale``, ``decline``, ``displaced``)."""
    _KIND_CURVES.get(kind, _no_change)(c, d, rng, rng2, kind=kind, **kw)


def observe(
    c: _Curves,
    d: dict[str, Any],
    rng: np.random.Generator,
    noise: float,
    kind: str,
    labels: dict[str, Any],
) -> dict[str, np.ndarray]:
    """The logged columns: the curves with their noise (in the classic run's order of draws)."""
    t, n = c.t, c.n
    reward_obs = np.clip(c.reward + rng.normal(0.0, d["sig_r"], n), 0.0, 1.0)
    p = np.clip(c.reward, 0.0, 1.0)
    # share of 5-sample groups with all-equal rewards, per-prompt success spread around p
    zero_std = np.clip(
        p**5 + (1.0 - p) ** 5 + 0.15 * (1.0 - np.abs(2 * p - 1)) + rng.normal(0, 0.02, n), 0, 1
    )
    if kind == "dead_signal":
        zero_std = np.where(t < labels["failure_step"], zero_std, 1.0)
    log_g, g0, len0, sig_lp = c.log_g, d["g0"], d["len0"], d["sig_lp"]
    return {
        C.STEP: t.astype(np.int64),
        C.REWARD_MEAN: reward_obs,
        C.REWARD_STD: np.sqrt(np.clip(reward_obs * (1.0 - reward_obs), 0.0, None)),
        C.ACCURACY: reward_obs,
        C.LOSS: rng.normal(0.0, 0.01, n) + 0.001 * np.exp(log_g - math.log(g0)),
        C.LEARNING_RATE: c.lr,
        C.GRAD_NORM: np.exp(log_g + rng.normal(0.0, d["sig_g"], n)),
        C.ENTROPY: c.ent * (1.0 + rng.normal(0.0, d["sig_h"], n)),
        C.KL: np.abs(c.kl * (1.0 + rng.normal(0.0, 0.05, n))),
        C.COMPLETION_LENGTH: c.length * (1.0 + rng.normal(0.0, 0.02, n)),
        C.NUM_SEARCHES: d["searches"] * (1.0 + rng.normal(0.0, 0.03, n)),
        C.FRAC_ZERO_STD_GROUPS: zero_std,
        C.LOGP_CORRECT: c.logp_c + rng.normal(0.0, sig_lp, n),
        C.LOGP_INCORRECT: c.logp_c - rng.uniform(0.2, 0.5) + rng.normal(0.0, sig_lp * 1.5, n),
        C.DELTA_CORRECT: c.delta_c + rng.normal(0.0, 0.15 * noise, n),
        C.DELTA_CORRECT_PER_TOKEN: (c.delta_c + rng.normal(0.0, 0.15 * noise, n)) / len0,
        C.FRAC_CORRECT_DISPLACED: np.clip(c.frac_disp + rng.normal(0.0, 0.04 * noise, n), 0, 1),
        C.FRAC_TOKENS_DISPLACED: np.clip(0.8 * c.frac_disp + 0.1 + rng.normal(0.0, 0.03, n), 0, 1),
        C.LLDS_ENABLED: np.zeros(n),
        C.LLDS_LAMBDA: np.zeros(n),
    }
