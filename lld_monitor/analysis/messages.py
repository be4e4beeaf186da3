"""Alert builders of the phase detector: the words and the evidence of every alert it raises.

Kept apart from the checks so that a check decides and a builder phrases; each builder takes the
numbers behind the decision and returns the ``Alert``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lld_monitor import columns as C
from lld_monitor.analysis.trend import TrendFit, json_float
from lld_monitor.events import Alert

if TYPE_CHECKING:
    from lld_monitor.analysis.signals import Signals

_NAN = float("nan")
_enc = json_float


def fmt(v: float) -> str:
    """Three significant digits; ``n/a`` for NaN."""
    if v != v:
        return "n/a"
    return f"{v:.3g}"


def _failure(step: int, kind: str, msg: str, held: float, ev: dict[str, Any], llds: str) -> Alert:
    ev = {**ev, "held_steps": _enc(held)}
    return Alert(step, kind, "warning", f"{msg} (for {held:.0f} steps); {llds}", ev)


# --- non-LLD failures -----------------------------------------------------------------------------
def nonfinite_alert(
    step: int,
    loss: float,
    g: float,
    bad_loss: bool,
    bad_grad: bool,
    rows: int,
    *,
    reward: float | None = None,
) -> Alert:
    """A non-finite loss or reward (``reward``: its value, None when finite), or non-finite
    grad norms ``rows`` rows in a row."""
    what = []
    if reward is not None:
        what.append(f"reward={reward}")
    if bad_loss:
        what.append(f"loss={loss}")
    if bad_grad:
        what.append(f"grad_norm={g} ({rows} row{'' if rows == 1 else 's'} in a row)")
    return Alert(
        step,
        "nonfinite",
        "critical",
        f"non-finite training values at step {step}: {', '.join(what)}; this is a numerical "
        "failure (e.g. learning rate, precision, a bad batch), not a sign of LLD",
        {"loss": _enc(loss), "grad_norm": _enc(g), "rows": rows}
        | ({"reward": _enc(reward)} if reward is not None else {}),
    )


def no_update_alert(step: int, since: int, rows: int, loss: float, g: float, lr: float) -> Alert:
    """The update that did nothing: ``rows`` probed rows since ``since`` without a moved
    log-prob, while the step had a loss or a gradient."""
    lr_said = f", learning rate {fmt(lr)}" if lr == lr else ""
    msg = (
        f"the update did nothing at step {step}: on {rows} probed rows in a row (since step "
        f"{since}) no probed token's log-prob changed after the update, while the step had "
        f"loss {fmt(loss)} and grad norm {fmt(g)}{lr_said}: the weights are not moving. Likely "
        "causes: a learning rate of 0, frozen weights (requires_grad False, an adapter not "
        "attached or not trained), an optimizer that does not step (skipped steps under fp16 "
        "loss scaling, a compiled model whose parameters were copied); not a sign of LLD"
    )
    ev = {"since_step": since, "rows": rows, "loss": _enc(loss), "grad_norm": _enc(g)}
    ev["learning_rate"] = _enc(lr)
    return Alert(step, "no_update", "critical", msg, ev)


def zero_grad_alert(
    step: int, since: int, rows: int, loss: float, zstd: float, rstd: float
) -> Alert:
    """Grad norm exactly 0 on ``rows`` rows since ``since`` while some group had a signal."""
    told = (
        f"{100 * (1 - zstd):.0f}% of prompt groups had unequal rewards"
        if zstd == zstd
        else f"reward std {fmt(rstd)}"
    )
    msg = (
        f"grad norm exactly 0 on {rows} rows in a row (since step {since}) while {told}, so "
        f"GRPO's advantages were not all zero (loss {fmt(loss)}): no gradient reaches the "
        "weights. Check that the trainable parameters are the ones the optimizer holds (an "
        "adapter attached and trainable), that the loss is not detached from the graph, and "
        "the gradient clipping and scaling; not a sign of LLD"
    )
    ev = {
        "since_step": since,
        "rows": rows,
        "loss": _enc(loss),
        "frac_zero_std_groups": _enc(zstd),
        "reward_std": _enc(rstd),
    }
    return Alert(step, "zero_grad", "warning", msg, ev)


def llds_inert_alert(
    step: int, since: int, rows: int, lam: float, zstd: float, gated: float
) -> Alert:
    """LLDS on and adding nothing for ``rows`` rows since ``since``, with the likely reason."""
    if zstd == zstd and zstd >= 0.75:
        reason = "zero_variance"
        why = (
            f"{100 * zstd:.0f}% of the prompt groups got one reward (advantage 0): few "
            "responses are preserving with a gradient; use more samples per prompt "
            "(num_generations / rollout.n >= 4, the paper uses 5), a higher temperature, or "
            "prompts the policy solves sometimes"
        )
    elif gated == gated and gated == 0.0:
        reason = "gate_never_fires"
        why = (
            "its gate never fired (llds_frac_gated 0): either the generation batch is not "
            "reused (on a batch trained once the current policy is the sampling one: TRL "
            "num_iterations > 1 or steps_per_generation > gradient_accumulation_steps, verl "
            "ppo_mini_batch_size below the batch), or no preserving action lost likelihood "
            "during its reuse (with groups of 2 most groups tie, the public Search-R1 "
            "reproduction's case: num_generations >= 4)"
        )
    else:
        reason = "no_reuse"
        why = (
            "most likely the generation batch is not reused: on a batch trained once the "
            "current policy is the sampling one and LLDS is 0 by construction; TRL "
            "num_iterations > 1 or steps_per_generation > gradient_accumulation_steps, verl "
            "ppo_mini_batch_size below the batch or ppo_epochs > 1"
        )
    lam_said = f" (lambda {fmt(lam)})" if lam == lam else ""
    msg = (
        f"LLDS is on{lam_said} but added nothing on {rows} rows in a row (since step {since}): "
        f"its loss is exactly 0; {why}"
    )
    ev = {"since_step": since, "rows": rows, "reason": reason, "llds_lambda": _enc(lam)}
    ev |= {"frac_zero_std_groups": _enc(zstd), "llds_frac_gated": _enc(gated)}
    return Alert(step, "llds_inert", "warning", msg, ev)


def sampler_mismatch_alert(
    step: int, since: int, rows: int, values: dict[str, float], cfg: Any
) -> Alert:
    """The sampler and the trainer disagree: the values of the row, the band, the causes."""
    said = []
    r = values[C.IS_RATIO_MEAN]
    if r == r:
        said.append(
            f"importance-sampling ratio mean {fmt(r)} (trainer / sampler; ~1 when they agree, "
            f"band {1 / cfg.sampler_is_band:.2f}-{cfg.sampler_is_band:.2f})"
        )
    d = values[C.SAMPLER_LOGP_DIFF]
    if d == d:
        said.append(
            f"mean |log-prob difference| {fmt(d)} nats/token "
            f"(at or above {cfg.sampler_logp_diff:g})"
        )
    p = values[C.SAMPLER_PROB_DIFF]
    if p == p:
        said.append(
            f"mean |probability difference| {fmt(p)} (at or above {cfg.sampler_prob_diff:g})"
        )
    msg = (
        f"sampler and trainer disagree at step {step}, on {rows} rows in a row (since step "
        f"{since}): {'; '.join(said)}. The rollouts were sampled from a policy other than the "
        "one trained: likely an engine-trainer dtype or kernel mismatch (bf16 vs fp32 logits, "
        "fp8 rollouts), weights not synced to the inference engine after an update, or an "
        "estimator bug (log-probs padded with 0, masks misaligned); not a sign of LLD"
    )
    ev = {"since_step": since, "rows": rows, **{k: _enc(v) for k, v in values.items()}}
    return Alert(step, "sampler_mismatch", "warning", msg, ev)


def spike_alert(
    step: int, col: str, x: float, median: float, mad: float, base: float, n: int
) -> Alert:
    """A single-row spike of ``col`` (KL or grad norm) against its window's median / MAD."""
    name = "KL to the reference" if col == C.KL else "grad norm"
    msad = f"{(x - median) / (1.4826 * mad):.0f} MADs above it" if mad > 0 else "MAD 0"
    msg = (
        f"single-row spike of {name} at step {step}: {fmt(x)} is x{x / base:.0f} its "
        f"baseline {fmt(base)} (median of the last {n} logged values {fmt(median)}, "
        f"{msad}); one row, not a trend: look at that batch (an outlier sample, a "
        "numerical blip); not specific to LLD"
    )
    ev = {
        "signal": col,
        "value": _enc(x),
        "median": _enc(median),
        "mad": _enc(mad),
        "baseline": _enc(base),
        "window_rows": n,
    }
    return Alert(step, "spike", "info", msg, ev)


def dead_signal_alert(step: int, held: float, zstd: float, rstd: float) -> Alert:
    msg = (
        f"every group gets the same reward (frac_zero_std_groups={fmt(zstd)}, "
        f"reward_std={fmt(rstd)}): GRPO advantages are zero, no learning signal"
    )
    ev = {"frac_zero_std_groups": _enc(zstd), "reward_std": _enc(rstd)}
    return _failure(step, "dead_signal", msg, held, ev, "not a sign of LLD")


def entropy_collapse_alert(step: int, held: float, hf: float, he: float) -> Alert:
    msg = (
        f"entropy {fmt(hf)} is {100 * hf / he:.1f}% of its early level {fmt(he)}: "
        "the policy has become (near) deterministic"
    )
    ev = {"entropy": _enc(hf), "entropy_early": _enc(he)}
    return _failure(step, "entropy_collapse", msg, held, ev, "not a sign of LLD")


def length_blowup_alert(step: int, held: float, lf: float, le: float) -> Alert:
    msg = f"completion length {fmt(lf)} is x{lf / le:.1f} its early level {fmt(le)}"
    ev = {"completion_length": _enc(lf), "completion_length_early": _enc(le)}
    return _failure(step, "length_blowup", msg, held, ev, "not a sign of LLD")


def reward_decline_alert(step: int, held: float, r: TrendFit | None) -> Alert:
    r0, r1, t, span = (r.first, r.last, r.t, r.span) if r else (_NAN,) * 4
    msg = (
        f"reward declining: {fmt(r0)} -> {fmt(r1)} ({fmt(100 * (r1 - r0) / abs(r0))}%) "
        f"over {span:.0f} steps, t={t:.1f}, with no collapse seen"
    )
    ev = {
        "reward_start": _enc(r0),
        "reward_end": _enc(r1),
        "reward_t": _enc(t),
        "window_steps": _enc(span),
    }
    return _failure(step, "reward_decline", msg, held, ev, "not specific to LLD")


def kl_blowup_alert(step: int, held: float, kl: float, ref: float) -> Alert:
    msg = f"KL to the reference {fmt(kl)} is x{kl / ref:.0f} its settled level {fmt(ref)}"
    ev = {"kl": _enc(kl), "kl_settled": _enc(ref)}
    return _failure(step, "kl_blowup", msg, held, ev, "not specific to LLD")


def truncation_alert(step: int, held: float, tf: float, rows: int, frac: float) -> Alert:
    msg = (
        f"{100 * tf:.0f}% of completions cut at the length cap (frac_truncated, recent "
        f"mean; {rows} logged rows at >= {100 * frac:.0f}%): most rewards score unfinished "
        "answers; raise the completion length cap (TRL max_completion_length) or make "
        "the task's answers shorter"
    )
    ev = {"frac_truncated": _enc(tf), "rows": rows}
    return _failure(step, "truncation", msg, held, ev, "not specific to LLD")


# --- LLD ------------------------------------------------------------------------------------------
def displacement_alert(step: int, ev: dict[str, Any], in_batch: bool, frac: float) -> Alert:
    """The paper's ">50% of correct responses displaced" indicator, with its counts (``ev``:
    ``_DisplacedShare.evidence()``)."""
    probes = ", ".join(f"{k:.0f} of {n:.0f} at step {s}" for s, k, n in ev["displaced_probes"][-3:])
    if in_batch:
        where = (
            f"measured inside the reused rollout batches, before their last update; "
            f"recent rows: {probes}"
        )
    else:
        share = 100 * ev["displaced_share"]
        where = f"{share:.0f}% in the latest probe; recent probes: {probes}"
    window = ev.get("displaced_window_probes")
    pooled = "pooled" if window is None else f"the last {window} probes together"
    msg = (
        f"LLD indicator at step {step}: the updates lowered the likelihood of most correct "
        f"responses ({where}; {pooled} {100 * ev['displaced_pooled_share']:.0f}% of "
        f"{ev['displaced_pooled_n']:.0f}, z={ev['displaced_z']:.1f} "
        f"against {100 * frac:.0f}%), the paper's >50% sign of lazy "
        "likelihood displacement"
    )
    evidence = {k: (_enc(v) if isinstance(v, float) else v) for k, v in ev.items()}
    evidence["displaced_source"] = "in_batch" if in_batch else "probe"
    return Alert(step, "displacement", "warning", msg, evidence)


def phase_evidence(s: Signals, trend_level: int) -> dict[str, Any]:
    """The numbers behind the current windows (computed only when a phase alert fires);
    ``trend_level``: the trend level behind a stagnation / decay rank (-1: none)."""
    cfg = s.config
    g_ratio, h_ratio, kl_ratio, fall = s.ratios()
    rw1 = s.rw_trend.fit(1)
    rt, r0, r1 = (rw1.t, rw1.first, rw1.last) if rw1 is not None else (_NAN,) * 3
    ev: dict[str, Any] = {
        "reward_start": r0,
        "reward_end": r1,
        "reward_t": rt,
        "reward_peak": s.reward_peak,
        "reward_fall_frac": fall,
        "grad_ratio": g_ratio,
        "entropy_ratio": h_ratio,
        "kl_ratio": kl_ratio,
        "frac_displaced": s.displaced_ema.fast,
        "frac_displaced_window": s.displaced_ema.window,
        "delta_correct_window": s.delta_correct_ema.window,
        "grad_surge": g_ratio >= cfg.grad_surge_ratio,
        "entropy_rise": h_ratio >= cfg.entropy_rise_ratio,
        "reward_fall": fall >= cfg.reward_fall_frac,
    }
    lp1 = s.lp_trend.fit(1) if C.LOGP_CORRECT in s.seen else None
    if lp1 is not None and len(s.lp_short.buf) >= 3:
        slope, t, span, l0, l1 = lp1.slope, lp1.t, lp1.span, lp1.first, lp1.last
        _, _, sspan, s0, s1 = s.lp_short.fit()
        ev.update(
            logp_change=l1 - l0,
            logp_slope=slope,
            logp_t=t,
            window_steps=span,
            logp_start=l0,
            logp_end=l1,
            short_drop=s0 - s1,
            short_steps=sspan,
        )
    lvl = trend_level
    f = s.lp_trend.fit(lvl) if lvl >= 0 else None
    r = s.rw_trend.fit(lvl) if lvl >= 0 else None
    if f is not None:  # the trend level behind a stagnation / decay rank
        ev.update(
            logp_change=f.change,
            logp_slope=f.slope,
            logp_t=f.t,
            logp_t_crit=s.t_crit(f),
            logp_se_change=f.se_change,
            window_steps=f.span,
            window_start=f.start,
            trend_level=f.level,
            trend_bins=f.n_bins,
            logp_start=f.first,
            logp_end=f.last,
        )
        if r is not None:
            ev.update(reward_start=r.first, reward_end=r.last, reward_t=r.t)
    return ev


def phase_alert(
    step: int, old: str, phase: str, ev: dict[str, Any], *, reward_told: bool = False
) -> Alert:
    """The alert announcing entry into ``phase`` from ``old``, with its evidence in words and
    numbers (``ev``: ``phase_evidence``). ``reward_told``: the reward's fall is told by the
    level shift the alert is merged with, so the peak-based reward clause is left out (the two
    measure it differently and would read as a contradiction)."""
    evidence = {k: (_enc(v) if isinstance(v, float) else v) for k, v in ev.items()}
    evidence["phase_from"] = old
    evidence["phase_to"] = phase
    parts: list[str] = []
    lp = "logp_change" in ev
    fdw = ev.get("frac_displaced_window", _NAN)
    reward_txt = (
        f"reward {ev['reward_start']:.3f} -> {ev['reward_end']:.3f}"
        if math.isfinite(ev.get("reward_start", _NAN))
        else "no reward trend"
    )
    if phase == "stagnation":
        parts.append(
            f"logp of correct responses flat (change {ev['logp_change']:+.4f} nats/token, "
            f"slope {ev['logp_slope']:+.5f}/step over {ev['window_steps']:.0f} steps) while "
            f"{reward_txt.replace('reward', 'reward rose', 1)}"
        )
    elif phase == "decay":
        parts.append(
            f"logp of correct responses declining steadily ({ev['logp_change']:+.4f} "
            f"nats/token, slope {ev['logp_slope']:+.5f}/step, t={ev['logp_t']:.1f}, over "
            f"{ev['window_steps']:.0f} steps) while {reward_txt}; grad norm "
            f"x{fmt(ev['grad_ratio'])} of its baseline"
        )
    else:
        if lp and math.isfinite(ev.get("short_drop", _NAN)) and ev["short_drop"] > 0:
            parts.append(
                f"logp of correct responses dropped {ev['short_drop']:.4f} nats/token in "
                f"{ev['short_steps']:.0f} steps"
            )
        elif not lp:
            parts.append("collapse seen in standard metrics (no LLD columns)")
        # every corroborating signal with its value; those past their threshold first
        hits, others = [], []
        for flag, text in (
            ("grad_surge", f"grad norm x{fmt(ev['grad_ratio'])} of its baseline"),
            ("entropy_rise", f"entropy x{fmt(ev['entropy_ratio'])} of its baseline"),
            (
                "reward_fall",
                f"reward {100 * ev['reward_fall_frac']:.0f}% below its peak {ev['reward_peak']:.3f}"
                if math.isfinite(ev.get("reward_fall_frac", _NAN)) and not reward_told
                else "",
            ),
        ):
            if ev.get(flag):
                hits.append(text)
            elif text and "n/a" not in text:
                others.append(text)
        parts.extend(hits)
        if others:
            parts.append("not (yet) past threshold: " + ", ".join(others))
    if math.isfinite(fdw):
        parts.append(f"{100 * fdw:.0f}% of correct responses displaced (recent mean)")
    dcw = ev.get("delta_correct_window", _NAN)
    if phase != "collapse" and math.isfinite(dcw):
        parts.append(f"mean change of correct responses {dcw:+.3f} nats")
    severity = "critical" if phase == "collapse" else "warning"
    title = {"stagnation": "Phase I (stagnation)", "decay": "Phase II (steady decay)"}.get(
        phase, "Phase III (accelerated collapse)"
    )
    return Alert(step, phase, severity, f"{title} at step {step}: " + "; ".join(parts), evidence)


def phase_left_alert(step: int, old: str, new: str, held: float) -> Alert:
    """The info alert of leaving ``old`` for ``new`` after ``held`` steps without support."""
    return Alert(
        step,
        "phase",
        "info",
        f"phase {old} -> {new} at step {step}: the {old} conditions "
        f"have not held for {held:.0f} steps",
        {"phase_from": old, "phase_to": new},
    )


def level_shift_phase_alert(
    step: int, old: str, shift: Alert, s: Signals, trend_level: int, lld: Alert | None
) -> Alert:
    """The collapse alert of a level shift of the reward (``checks/level_shift.py``), entered
    from ``old``. With the LLD columns it is said with the likelihood evidence first: ``lld``
    is the phase alert the LLD evidence makes (built by the caller), the level shift follows."""
    evidence = dict(shift.evidence)
    evidence["phase_from"] = old
    evidence["phase_to"] = "collapse"
    if lld is None:
        return Alert(step, "collapse", "critical", shift.message, evidence)
    tail = shift.message.split(": ", 1)[-1]  # (without its "Phase III ... at step N: ")
    merged = {**lld.evidence, **evidence}
    return Alert(step, "collapse", "critical", f"{lld.message}; {tail}", merged)


#: The alert kinds whose advice is LLDS (analysis.advice): they carry the row's LLDS state.
LLDS_ADVICE_KINDS: frozenset[str] = frozenset({"stagnation", "decay", "displacement", "collapse"})


def with_llds_state(alert: Alert, enabled: float, lam: float) -> Alert:
    """``alert`` with the LLDS state of its row in the evidence (``llds_on`` 0/1, and
    ``llds_lambda`` when on) where its advice is LLDS: "switch LLDS on" is no advice when it is
    on. Other alerts as they are."""
    if alert.kind not in LLDS_ADVICE_KINDS or "llds_on" in alert.evidence:
        return alert
    state: dict[str, Any] = {"llds_on": int(enabled > 0.5)}
    if enabled > 0.5 and lam == lam:
        state["llds_lambda"] = float(lam)
    return replace(alert, evidence={**alert.evidence, **state})
