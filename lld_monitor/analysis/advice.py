"""What an alert says to a person: a one-line headline, what to do now, repeats merged.

An ``Alert``'s ``message`` keeps every number behind the decision (the evidence in words, shown
under an expandable section and in ``--json``); this module phrases the rest from the alert's kind
and evidence, so the analyzer's checks stay the one place that decides:

- ``headline(alert)``: one line, at most ``HEADLINE_CHARS`` characters: what was seen, since when
  (the step the change began where the evidence has it), how sure (the test statistic against its
  threshold, or the false-alarm rate it was calibrated for).
- ``actions(alert)``: "what to do now" for its kind, grounded in the paper (LLDS, lambda 0.2) and
  the trainers' own knobs (TRL ``GRPOConfig`` and verl names), with the alert's own steps filled in.
- ``merge_repeats(alerts)``: an alert of the same kind raised again within ``REPEAT_WINDOW_STEPS``
  steps of the last one becomes a count on the first (``evidence["repeats"]``,
  ``evidence["repeat_steps"]``), so a re-arming check does not say the same thing three times.
- ``alert_record(alert)``: the JSON record of an alert with all of the above.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from lld_monitor import columns as C
from lld_monitor.events import Alert

#: A repeat of one kind (and, for ``phase``, of one transition; for ``spike``, of one signal)
#: within this many steps of its last raise is merged into the first alert as a count.
REPEAT_WINDOW_STEPS = 50
#: The longest headline (a terminal line, a dashboard header, a GitHub issue title).
HEADLINE_CHARS = 160

_TITLES = {
    "stagnation": "LLD Phase I (stagnation)",
    "decay": "LLD Phase II (steady decay)",
    "collapse": "Collapse",
    "displacement": "LLD indicator",
    "nonfinite": "Non-finite training values",
    "dead_signal": "No learning signal",
    "entropy_collapse": "Entropy collapse",
    "length_blowup": "Completion length blow-up",
    "reward_decline": "Reward declining",
    "kl_blowup": "KL blow-up",
    "truncation": "Completions truncated",
    "spike": "One-row spike",
    "mode_collapse": "Mode collapse",
    "no_update": "The update did nothing",
    "sampler_mismatch": "Sampler and trainer disagree",
    "llds_inert": "LLDS is on but adds nothing",
    "zero_grad": "Grad norm exactly 0",
    "phase": "Phase change",
}
#: The alert kinds this module phrases (an event of another kind keeps its own message).
ALERT_KINDS: tuple[str, ...] = tuple(_TITLES)

_LLDS_ON = (
    "switch LLDS on at lambda 0.2 (the paper's; 0.3 for 7B): LLDMonitor(..., "
    "llds=LLDSConfig(lam=0.2)) or auto_llds=True; verl: policy_loss.loss_mode=llds"
)
_LLDS_REUSE = (
    "LLDS acts only when a rollout batch is reused: TRL num_iterations > 1 or "
    "steps_per_generation > gradient_accumulation_steps; verl ppo_mini_batch_size < the batch"
)
_LLDS_MORE = (
    "if LLDS is already on, raise its lambda (the paper: 0.01 still collapsed, 0.2 held for "
    "500 steps) and check that its loss is not zero (llds_loss, llds_frac_gated)"
)


_RESUME_LARGER = (
    "resume with a larger lambda: LLDS was on when it collapsed (check first that it acted: "
    "llds_loss and llds_frac_gated above 0)"
)


def _llds_is_on(alert: Alert) -> str | None:
    """The advice when the alert's row says LLDS was on (``messages.with_llds_state``), else
    None: raising lambda and checking that it acts, not switching it on."""
    if alert.evidence.get("llds_on") != 1:
        return None
    lam = alert.evidence.get("llds_lambda")
    at = f" at lambda {lam:g}" if isinstance(lam, int | float) else ""
    return (
        f"LLDS is already on{at} and this still happened: check that it acts (llds_loss and "
        "llds_frac_gated above 0; it needs a reused rollout batch), then raise lambda (0.3 for "
        "7B in the paper; monitor.llds.enable(lam), or llds_watchdog=True raises it in steps)"
    )


def _f(ev: dict[str, Any], key: str) -> float:
    v = ev.get(key)
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _g(v: float) -> str:
    return "n/a" if v != v else f"{v:.3g}"


def since_step(alert: Alert) -> int:
    """The step the alert's change began: the level shift's change step, the trend window's
    start, the first step a held condition held; else the alert's own step."""
    ev = alert.evidence
    for key in ("change_step", "window_start", "since_step"):
        v = _f(ev, key)
        if math.isfinite(v):
            return int(v)
    held = _f(ev, "held_steps")
    if math.isfinite(held) and held > 0:
        return int(alert.step - held)
    return int(alert.step)


def _sure(alert: Alert) -> str:
    """How sure, in a few words, from the evidence."""
    ev, kind = alert.evidence, alert.kind
    if ev.get("detector") == "level_shift":
        z, c = _f(ev, "z"), _f(ev, "threshold")
        p = _f(ev, "p_false_run")
        rows = _f(ev, "rows_per_false_alarm")
        rate = (
            f"~1 false alarm in {1 / p:,.0f} runs this short"
            if ev.get("threshold_for_rows") == 64 and p > 0
            else f"~1 false alarm per {rows:,.0f} rows"
            if math.isfinite(rows)
            else ""
        )
        return f"z {z:.1f} vs {c:.2f}" + (f", {rate}" if rate else "")
    if kind in ("stagnation", "decay"):
        t, tc = _f(ev, "logp_t"), _f(ev, "logp_t_crit")
        span = _f(ev, "window_steps")
        out = f"over {span:.0f} steps" if math.isfinite(span) else ""
        if kind == "decay" and math.isfinite(t):
            out += f", t {t:.1f}" + (f" vs {-abs(tc):.1f}" if math.isfinite(tc) else "")
        return out.lstrip(", ")
    if kind == "collapse":
        names = ("grad_surge", "entropy_rise", "reward_fall")
        if not any(k in ev for k in names):
            return ""
        return f"{sum(bool(ev.get(k)) for k in names)} of 3 signals"
    if kind == "displacement":
        return f"z {_f(ev, 'displaced_z'):.1f} against 50%"
    if kind == "spike":
        return "one row, not a trend"
    if kind == "nonfinite":
        return ""
    held = _f(ev, "held_steps")
    rows = _f(ev, "rows")
    if math.isfinite(held):
        return f"held {held:.0f} steps"
    if math.isfinite(rows):
        return f"held {rows:.0f} row{'' if rows == 1 else 's'}"
    return ""


def _what(alert: Alert) -> str:
    """What was seen, in the fewest words, from the evidence."""
    ev, kind = alert.evidence, alert.kind
    if kind == "collapse" and ev.get("detector") == "level_shift":
        what = f"reward {_g(_f(ev, 'reward_held'))} -> {_g(_f(ev, 'reward_recent'))}"
        drop = _f(ev, "short_drop")
        if math.isfinite(drop) and drop > 0:
            what += f", correct-response logp -{drop:.3g} nats/token"
        return what
    if kind == "collapse":
        drop = _f(ev, "short_drop")
        parts = []
        if math.isfinite(drop) and drop > 0:
            parts.append(f"correct-response logp -{drop:.3g} nats/token")
        fall = _f(ev, "reward_fall_frac")
        if ev.get("reward_fall") and math.isfinite(fall):
            parts.append(f"reward {100 * fall:.0f}% below its peak")
        if ev.get("grad_surge"):
            parts.append(f"grad norm x{_g(_f(ev, 'grad_ratio'))}")
        if ev.get("entropy_rise"):
            parts.append(f"entropy x{_g(_f(ev, 'entropy_ratio'))}")
        return ", ".join(parts)
    if kind == "stagnation":
        return (
            f"correct-response logp flat ({_f(ev, 'logp_change'):+.3g} nats/token) while reward "
            f"{_g(_f(ev, 'reward_start'))} -> {_g(_f(ev, 'reward_end'))}"
        )
    if kind == "decay":
        return f"correct-response logp {_f(ev, 'logp_change'):+.3g} nats/token"
    if kind == "displacement":
        share, n = _f(ev, "displaced_pooled_share"), _f(ev, "displaced_pooled_n")
        return f"{100 * share:.0f}% of {n:.0f} probed correct responses lost likelihood"
    if kind == "nonfinite":  # (the evidence stores NaN as null: the message has the values)
        told = alert.message.split(": ", 1)[-1].split(";")[0]
        return told if "=" in told else "a non-finite value"
    if kind == "dead_signal":
        share = _f(ev, "frac_zero_std_groups")
        if math.isfinite(share):
            return f"{100 * share:.0f}% of groups get one reward"
        return f"reward std {_g(_f(ev, 'reward_std'))} (every group one reward)"
    if kind == "entropy_collapse":
        h, h0 = _f(ev, "entropy"), _f(ev, "entropy_early")
        return f"entropy {_g(h)}, {100 * h / h0:.0f}% of its early {_g(h0)}"
    if kind == "length_blowup":
        ln, l0 = _f(ev, "completion_length"), _f(ev, "completion_length_early")
        return f"completion length {_g(ln)}, x{ln / l0:.1f} its early {_g(l0)}"
    if kind == "reward_decline":
        return f"reward {_g(_f(ev, 'reward_start'))} -> {_g(_f(ev, 'reward_end'))}"
    if kind == "kl_blowup":
        kl, ref = _f(ev, "kl"), _f(ev, "kl_settled")
        return f"KL {_g(kl)}, x{kl / ref:.0f} its settled level"
    if kind == "truncation":
        return f"{100 * _f(ev, 'frac_truncated'):.0f}% of completions hit the length cap"
    if kind == "spike":
        name = "KL" if ev.get("signal") == C.KL else "grad norm"
        x, base = _f(ev, "value"), _f(ev, "baseline")
        return f"{name} {_g(x)}, x{x / base:.0f} its baseline" if base else f"{name} {_g(x)}"
    if kind == "mode_collapse":
        ln, l0 = _f(ev, "completion_length"), _f(ev, "completion_length_early")
        share = _f(ev, "frac_zero_std_groups")
        return f"{100 * share:.0f}% identical groups, completions {_g(ln)} tokens (early {_g(l0)})"
    if kind == "phase":
        return f"{ev.get('phase_from', '?')} -> {ev.get('phase_to', '?')}"
    if kind == "no_update":
        return (
            f"no probed log-prob moved on {ev.get('rows')} probed rows, loss "
            f"{_g(_f(ev, 'loss'))}, grad norm {_g(_f(ev, 'grad_norm'))}"
        )
    if kind == "zero_grad":
        return f"grad norm 0 on {ev.get('rows')} rows while groups had unequal rewards"
    if kind == "llds_inert":
        reason = str(ev.get("reason", "?")).replace("_", " ")
        return f"loss exactly 0 on {ev.get('rows')} rows ({reason})"
    if kind == "sampler_mismatch":
        parts = []
        for key, name in (
            (C.IS_RATIO_MEAN, "IS-ratio mean"),
            (C.SAMPLER_LOGP_DIFF, "|logp diff|"),
            (C.SAMPLER_PROB_DIFF, "|prob diff|"),
        ):
            v = _f(ev, key)
            if math.isfinite(v):
                parts.append(f"{name} {_g(v)}")
        return ", ".join(parts)
    return alert.message.split(";")[0]


def headline(alert: Alert) -> str:
    """One line, at most ``HEADLINE_CHARS`` characters: what, since when, how sure."""
    title = _TITLES.get(alert.kind, alert.kind)
    if alert.kind == "collapse" and alert.evidence.get("detector") != "level_shift":
        title = "Collapse (Phase III)"
    start = since_step(alert)
    when = f"since step {start}" if start != alert.step else f"at step {alert.step}"
    what = _what(alert)
    sure = _sure(alert)
    if not what or "nan" in what or "n/a" in what:
        # (an event logged without its evidence: the first clause of its own words)
        what = alert.message.split(f"at step {alert.step}: ", 1)[-1].split(";")[0]
        sure = "" if "nan" in sure or "n/a" in sure else sure
    n = alert.evidence.get("repeats")
    line = f"{title} {when}: {what}" + (f" ({sure})" if sure else "")
    if isinstance(n, int) and n > 1:
        line += f" [x{n}]"
    line = " ".join(line.split())
    if len(line) > HEADLINE_CHARS:
        line = line[: HEADLINE_CHARS - 3].rstrip() + "..."
    return line


def actions(alert: Alert) -> tuple[str, ...]:
    """What to do now, for the alert's kind, with its steps filled in (empty for ``phase``)."""
    kind, step = alert.kind, alert.step
    start = since_step(alert)
    back = (
        f"roll back to the last checkpoint saved before step {start} (lld-monitor report "
        "names it) rather than training on from the collapsed weights"
    )
    on = _llds_is_on(alert)  # (LLDS on at the alert's row: raise it, do not switch it on)
    if kind == "stagnation":
        return (
            on or _LLDS_ON,
            _LLDS_REUSE,
            "keep the checkpoints from now on: in the paper, stagnation came 60+ steps before the "
            "collapse",
            "watch frac_correct_displaced: above 0.5 is the paper's sign that LLD has set in",
        )
    if kind in ("decay", "displacement"):
        return (
            *((on,) if on else (_LLDS_ON, _LLDS_MORE)),
            _LLDS_REUSE,
            "lower the learning rate (TRL learning_rate, verl actor_rollout_ref.actor.optim.lr) "
            "or the number of updates per rollout batch",
            f"keep the checkpoint from before step {start}",
        )
    if kind == "collapse":
        return (
            back,
            _RESUME_LARGER if on else "resume with LLDS on: " + _LLDS_ON,
            "lower the learning rate, keep the clip range at 0.2 (TRL epsilon, verl "
            "clip_ratio) and the gradient clip on (max_grad_norm 1.0 or lower)",
            "filter prompt groups whose rewards are all equal (verl "
            "algorithm.filter_groups.enable=True; they carry no advantage)",
        )
    if kind == "nonfinite":
        return (
            f"look at the batch of step {step}: the first non-finite value is a numerical "
            "failure, not LLD",
            "lower the learning rate, keep gradient clipping on (max_grad_norm), prefer bf16 to "
            "fp16, and check the reward function for NaN or inf on odd outputs",
            back,
        )
    if kind == "dead_signal":
        return (
            "give the groups a chance to differ: more samples per prompt (TRL num_generations, "
            "verl actor_rollout_ref.rollout.n), a higher temperature, a denser reward",
            "drop all-equal groups from the batch (verl algorithm.filter_groups.enable=True) or "
            "choose prompts the model solves sometimes, not always or never",
            "check that the reward function runs (a constant 0 is often a parsing failure)",
        )
    if kind == "entropy_collapse":
        return (
            "keep exploration: a higher sampling temperature, a larger upper clip (TRL "
            "epsilon_high, verl clip_ratio_high, as in DAPO), or a KL term (TRL beta)",
            f"keep the checkpoint from before step {start}",
        )
    if kind == "length_blowup":
        return (
            "cap the length (TRL max_completion_length, verl data.max_response_length) and mask "
            "truncated completions (TRL mask_truncated_completions=True)",
            "check the reward for rewarding length (repetition, padding the answer)",
        )
    if kind == "truncation":
        return (
            "raise the completion length cap (TRL max_completion_length, verl "
            "data.max_response_length) or make the task's answers shorter",
            "mask truncated completions from the loss (TRL mask_truncated_completions=True)",
        )
    if kind == "reward_decline":
        return (
            f"compare samples from before step {start} with recent ones (reward hacking, a "
            "changed data mix, a drifting reference)",
            "lower the learning rate; keep the checkpoint of the reward's peak",
        )
    if kind == "kl_blowup":
        return (
            "raise the KL coefficient (TRL beta, verl actor_rollout_ref.actor.kl_loss_coef) or "
            "lower the learning rate",
            "check that the reference model is the one you meant (not the policy, not reloaded)",
        )
    if kind == "spike":
        return (
            f"look at the batch of step {step} (an outlier sample, a numerical blip); act only if "
            "it repeats",
        )
    if kind == "no_update":
        return (
            "check the learning rate in force (a schedule at 0, warm-up that never ends) and "
            "that the optimizer holds the trainable parameters (requires_grad, the adapter "
            "attached and trainable: PEFT print_trainable_parameters)",
            "look for skipped optimizer steps (fp16 loss scaling, NaN gradients) and, under "
            "torch.compile or a weight-sync engine, that the trained weights are the ones sampled",
        )
    if kind == "llds_inert":
        return (
            {
                "zero_variance": "give the groups a chance to differ: num_generations (TRL) or "
                "actor_rollout_ref.rollout.n (verl) >= 4, a higher temperature",
                "gate_never_fires": "reuse each generation batch (TRL num_iterations > 1 or "
                "steps_per_generation > gradient_accumulation_steps; verl ppo_mini_batch_size "
                "below the batch) and keep groups of 4 or more (num_generations)",
            }.get(
                str(alert.evidence.get("reason")),
                "reuse each generation batch: TRL num_iterations > 1 or steps_per_generation > "
                "gradient_accumulation_steps; verl ppo_mini_batch_size below the batch",
            ),
            "the monitor's attach-time checks name the setting (llds_check_reuse, "
            "llds_check_generations lifecycle events)",
        )
    if kind == "sampler_mismatch":
        return (
            "compare the engine's and the trainer's dtypes (vLLM dtype, TRL/verl model dtype, "
            "fp8 rollouts) and check that weights are synced to the engine after each update",
            "keep the importance-sampling correction on (TRL vllm_importance_sampling_correction, "
            "verl algorithm.rollout_correction) and look for log-probs padded with 0.0 or "
            "misaligned masks",
        )
    if kind == "zero_grad":
        return (
            "check that the loss reaches the trainable weights (not detached, the adapter "
            "trainable) and the gradient clipping / scaling",
            "compare with the learning signal: frac_zero_std_groups below 1 means some "
            "advantages were not zero",
        )
    if kind == "mode_collapse":
        return (
            "check the reward for a short degenerate answer it accepts (format-only credit, an "
            "empty answer that matches)",
            "raise the sampling temperature and keep the KL term (TRL beta); " + back,
        )
    return ()


def _repeat_key(alert: Alert) -> tuple[str, Any]:
    ev = alert.evidence
    if alert.kind == "phase":
        return alert.kind, (ev.get("phase_from"), ev.get("phase_to"))
    if alert.kind == "spike":
        return alert.kind, ev.get("signal")
    return alert.kind, None


def merge_repeats(alerts: Iterable[Alert], window: float = REPEAT_WINDOW_STEPS) -> list[Alert]:
    """``alerts`` (in step order) with each repeat of one kind within ``window`` steps of its
    last raise merged into the first: ``evidence["repeats"]`` (times raised) and
    ``evidence["repeat_steps"]`` (every step), the most severe severity of them; the message
    says "raised N times". A repeat later than ``window`` steps starts a new alert."""
    rank = {s: i for i, s in enumerate(C.SEVERITIES)}
    groups: list[list[Alert]] = []
    open_: dict[tuple[str, Any], list[Alert]] = {}
    for a in alerts:
        key = _repeat_key(a)
        group = open_.get(key)
        if group is not None and a.step - group[-1].step <= window:
            group.append(a)
            continue
        open_[key] = [a]
        groups.append(open_[key])
    out: list[Alert] = []
    for group in groups:
        first = group[0]
        if len(group) == 1:
            out.append(first)
            continue
        steps = [int(a.step) for a in group]
        out.append(
            replace(
                first,
                severity=max((a.severity for a in group), key=rank.__getitem__),
                message=f"{first.message} (raised {len(steps)} times, steps "
                f"{steps[0]}-{steps[-1]})",
                evidence={**first.evidence, "repeats": len(steps), "repeat_steps": steps},
            )
        )
    return out


def alert_record(alert: Alert) -> dict[str, Any]:
    """The JSON record of one alert: step, kind, severity, headline, since_step, actions,
    message (the evidence in words), evidence, repeats."""
    n = alert.evidence.get("repeats")
    return {
        "step": int(alert.step),
        "kind": alert.kind,
        "severity": alert.severity,
        "headline": headline(alert),
        "since_step": since_step(alert),
        "actions": list(actions(alert)),
        "message": alert.message,
        "evidence": alert.evidence,
        "repeats": n if isinstance(n, int) else 1,
    }
