"""The one mapping table: foreign metric names -> the canonical columns of ``lld_monitor.columns``.

Every format goes through this table (``canonical_name``); no torch, no pandas.
"""

from __future__ import annotations

import re

from lld_monitor import columns as C

#: canonical column -> foreign names, highest priority first. Every format goes through this one
#: table. Besides these, every canonical ``<col>`` is reached from ``<col>``, ``lld/<col>``,
#: ``actor/lld/<col>`` (our verl loss's metrics after verl prefixes ``actor/``), ``train/lld/<col>``
#: and ``train/<col>``; and ``train/<name>`` maps like ``<name>`` (transformers' W&B and
#: TensorBoard callbacks prefix training metrics with ``train/``).
FOREIGN_NAMES: dict[str, tuple[str, ...]] = {
    C.STEP: ("global_step", "train/global_step", "trainer/global_step", "_step", "Step"),
    C.TIME: ("_timestamp", "timestamp", "wall_time"),
    # TRL: reward; verl: critic/score/mean (the task score, before any in-reward KL penalty)
    C.REWARD_MEAN: ("reward", "critic/score/mean", "critic/rewards/mean"),
    # TRL's stock accuracy_reward returns 1/0 per completion: its mean is the accuracy
    C.ACCURACY: ("rewards/accuracy_reward/mean", "rewards/accuracy_reward"),
    C.LOSS: ("actor/pg_loss",),
    C.LEARNING_RATE: ("lr", "actor/lr"),
    C.GRAD_NORM: ("actor/grad_norm",),
    C.ENTROPY: ("actor/entropy", "actor/entropy_loss"),
    # KL to the reference first (verl's kl_loss), then verl's old-vs-current ppo_kl
    C.KL: ("actor/kl_loss", "actor/ppo_kl"),
    C.COMPLETION_LENGTH: ("completions/mean_length", "response_length/mean"),
    # TRL: share of completions that hit max_completion_length; verl: of max_response_length
    C.FRAC_TRUNCATED: ("completions/clipped_ratio", "response_length/clip_ratio"),
    C.NUM_SEARCHES: ("tools/call_frequency", "env/number_of_valid_search"),
    C.FRAC_ZERO_STD_GROUPS: ("frac_reward_zero_std",),
    # the paper authors' verl fork (Search-R1 + LLDS): the lambda in force
    C.LLDS_LAMBDA: ("actor/loss_noreduce_coef",),
    # ... and its sampling-policy confidence (AUTHORS_VERL_NAMES: what these mean)
    C.LOGP_CORRECT: ("actor/pos_avg_old_log_prob",),
    C.LOGP_INCORRECT: ("actor/neg_avg_old_log_prob",),
}

#: The paper authors' verl fork (``dp_actor.py``): metric -> what it is and how it is imported.
#: ``pos/neg_avg_old_log_prob`` are ``masked_mean(old_log_prob * (A > 0 | A < 0), response_mask)``:
#: the group's log-prob sum over ALL response tokens of the batch, so the level is the per-token
#: mean times the group's share of tokens; the trend carries over (the detector reads trends).
#: Our own ``actor/lld/logp_*`` win when both are logged. The others have no canonical column.
AUTHORS_VERL_NAMES: dict[str, str] = {
    "actor/pos_avg_old_log_prob": C.LOGP_CORRECT + " (level scaled by the A>0 token share)",
    "actor/neg_avg_old_log_prob": C.LOGP_INCORRECT + " (level scaled by the A<0 token share)",
    "actor/pos_avg_ref_log_prob": "not imported (reference policy, not the sampling policy)",
    "actor/neg_avg_ref_log_prob": "not imported (reference policy, not the sampling policy)",
    "actor/lowest_prob_avg_mean": "not imported (no canonical column)",
    "actor/lowest_prob_avg_min": "not imported (no canonical column)",
    "actor/loss_noreduce_coef": C.LLDS_LAMBDA,
}

_NON_TRAINING = frozenset({C.STEP, C.TIME, C.LEARNING_RATE})

#: Per-reward-function means: ours (``reward_fn/<name>``, also under ``lld/``) and TRL's
#: ``rewards/<name>/mean`` (``rewards/<name>`` before TRL 0.15) -> ``C.REWARD_FN_PREFIX + name``.
_REWARD_FN_RE = re.compile(
    r"^(?:train/)?(?:(?:(?:actor/)?lld/)?" + re.escape(C.REWARD_FN_PREFIX) + r"(?P<ours>.+)"
    r"|rewards/(?P<trl>(?!.*/std$).+?)(?:/mean)?)$"
)


def _build_lookup() -> dict[str, tuple[str, int]]:
    """Source name -> (canonical column, priority); lower priority numbers win."""
    lookup: dict[str, tuple[str, int]] = {}

    def add(name: str, col: str, prio: int) -> None:
        if name not in lookup or lookup[name][1] > prio:
            lookup[name] = (col, prio)

    for col in C.STEP_COLUMNS:
        names = (col, f"lld/{col}", f"actor/lld/{col}", f"train/lld/{col}", f"train/{col}")
        for prio, name in enumerate(names):
            add(name, col, prio)
    for col, names in FOREIGN_NAMES.items():
        for i, name in enumerate(names):
            add(name, col, 10 + i)
            add(f"train/{name}", col, 50 + i)
    return lookup


_LOOKUP = _build_lookup()


def canonical_name(source: str) -> str | None:
    """The canonical column a foreign metric name maps to, or None when it maps to none."""
    hit = _LOOKUP.get(str(source).strip())
    if hit is not None:
        return hit[0]
    return _reward_fn_name(str(source).strip())


def _reward_fn_name(source: str) -> str | None:
    """``reward_fn/<name>`` for a per-reward-function mean column, else None."""
    m = _REWARD_FN_RE.match(source)
    if m is None:
        return None
    return C.REWARD_FN_PREFIX + (m.group("ours") or m.group("trl"))


def _is_training_key(key: str) -> bool:
    hit = _LOOKUP.get(key)
    return hit is not None and hit[0] not in _NON_TRAINING
