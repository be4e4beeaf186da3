"""The one mapping table: foreign metric names -> the canonical columns of ``lld_monitor.columns``.

Every format goes through this table (``canonical_name``); no torch, no pandas.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from lld_monitor import columns as C

#: canonical column -> foreign names, highest priority first. Every format goes through this one
#: table. Besides these, every canonical ``<col>`` is reached from ``<col>``, ``lld/<col>``,
#: ``actor/lld/<col>`` (our verl loss's metrics after verl prefixes ``actor/``), ``train/lld/<col>``
#: and ``train/<col>``; and ``train/<name>`` maps like ``<name>`` (transformers' W&B and
#: TensorBoard callbacks prefix training metrics with ``train/``).
FOREIGN_NAMES: dict[str, tuple[str, ...]] = {
    # transformers / W&B; a hosted service's metrics.jsonl numbers its batches progress/batch
    C.STEP: (
        # Open-Instruct logs global_step = episodes seen and training_step = the step
        "training_step",
        "global_step",
        "train/global_step",
        "trainer/global_step",
        "_step",
        "Step",
        "progress/batch",
        "rollout/step",  # slime's W&B / TensorBoard x-axis
    ),
    C.TIME: ("_timestamp", "timestamp", "wall_time"),
    # TRL: reward; verl: critic/score/mean (the task score, before any in-reward KL penalty);
    # a hosted service's metrics.jsonl (Tinker cookbook): env/all/reward/total
    # hand-written loops print avg_reward / mean_reward
    C.REWARD_MEAN: (
        "reward",
        "critic/score/mean",
        "critic/rewards/mean",
        "env/all/reward/total",
        "avg_reward",
        "mean_reward",
        "reward/mean",
        "rollout/reward_mean",  # OpenRLHF (before dynamic filtering)
        "rollout/raw_reward",  # slime
        "reward/avg_raw_reward",  # SkyRL
        "ppo_actor/task_reward/avg",  # AReaL
        "scores",  # Open-Instruct
    ),
    # slash-namespaced loggers (a hosted-training cookbook's metrics.jsonl: reward/mean,
    # reward/std, policy/entropy, policy/kl, optim/lr, progress/*)
    C.REWARD_STD: ("reward/std", "rollout/reward_std", "reward_std_dev"),
    # TRL's stock accuracy_reward returns 1/0 per completion: its mean is the accuracy;
    # env/all/correct: the share of episodes graded correct (Tinker cookbook)
    # acc: what hand-written loops print
    C.ACCURACY: (
        "rewards/accuracy_reward/mean",
        "rewards/accuracy_reward",
        "env/all/correct",
        "acc",
    ),
    C.LOSS: (
        "actor/pg_loss",
        "policy_loss",  # OpenRLHF
        "pg_loss",  # slime (train/pg_loss)
        "policy/policy_loss",  # SkyRL
        "loss/policy_avg",  # Open-Instruct
        "loss/mean",  # prime-rl
    ),
    C.LEARNING_RATE: ("lr", "actor/lr", "optim/lr", "actor_lr", "policy/policy_lr"),
    C.GRAD_NORM: (
        "actor/grad_norm",
        "gnorm",
        "policy/grad_norm",  # SkyRL
        "optim/grad_norm",  # Open-Instruct, prime-rl
        "actor_grad_norm",  # OpenRLHF
        "ppo_actor/update/grad_norm",  # AReaL
    ),
    # verl's actor/entropy_loss is the mean entropy (not scaled by a coefficient); TRL's
    # entropy_loss is the entropy bonus term, the mean per-token entropy it acts on
    C.ENTROPY: (
        "actor/entropy",
        "actor/entropy_loss",
        "optim/entropy",
        "entropy_loss",
        "policy/entropy",
        "policy/policy_entropy",  # SkyRL
        "policy/entropy_avg",  # Open-Instruct
        "ppo_actor/update/entropy/avg",  # AReaL
        "entropy/all/mean",  # prime-rl
    ),
    # KL to the reference first (verl's kl_loss), then verl's old-vs-current ppo_kl, then the
    # sampler-vs-learner KL of a hosted service (Tinker cookbook's optim/kl_sample_train_v1)
    C.KL: (
        "actor/kl_loss",
        "actor/ppo_kl",
        "optim/kl_sample_train_v1",
        "policy/kl",
        "kl_loss",  # slime (train/kl_loss)
        "policy/policy_kl",  # SkyRL (use_kl_loss)
        "loss/kl_avg",  # Open-Instruct
        "ppo_actor/update/approx_kl/avg",  # AReaL (old vs current policy)
        "mismatch_kl/all/mean",  # prime-rl (sampler vs trainer)
    ),
    C.COMPLETION_LENGTH: (
        "completions/mean_length",
        "response_length/mean",
        "response_length",
        "rollout/response_length_mean",  # OpenRLHF
        "rollout/response_len/mean",  # slime
        "generate/avg_num_tokens",  # SkyRL
        "avg_response_length",  # SkyRL's console line
        "ppo_actor/seq_len/avg",  # AReaL
        "val/sequence_lengths",  # Open-Instruct (training rollouts, despite val/)
        "mean_gen_tokens_per_sample",  # NeMo-RL
        "generation_length",  # NeMo-RL's console line (Mean Generation Length: ...)
    ),
    # TRL: share of completions that hit max_completion_length; verl: of max_response_length
    C.FRAC_TRUNCATED: (
        "completions/clipped_ratio",
        "response_length/clip_ratio",
        "rollout/truncated_rate",  # OpenRLHF
        "rollout/truncated_ratio",  # slime
        "ppo_actor/no_eos_ratios/avg",  # AReaL
        "truncation",  # prime-rl's console line (Truncation 5.0%)
    ),
    C.NUM_SEARCHES: ("tools/call_frequency", "env/number_of_valid_search"),
    C.FRAC_ZERO_STD_GROUPS: ("frac_reward_zero_std",),
    # sampler vs trainer: TRL (grpo_trainer.py, with vllm_importance_sampling_correction) and
    # verl (trainer/ppo/rollout_corr_helper.py: rollout_corr/*; utils/debug/metrics.py:
    # training/rollout_probs_diff_*, the absolute difference of the two token probabilities)
    C.IS_RATIO_MEAN: ("sampling/importance_sampling_ratio/mean", "rollout_corr/rollout_is_mean"),
    C.SAMPLER_LOGP_DIFF: ("sampling/sampling_logp_difference/mean",),
    C.SAMPLER_PROB_DIFF: ("training/rollout_probs_diff_mean",),
    # the paper authors' verl fork (Search-R1 + LLDS): the lambda in force; a public
    # reimplementation's actor/lld_coef
    C.LLDS_LAMBDA: ("actor/loss_noreduce_coef", "loss_noreduce_coef", "actor/lld_coef", "lld_coef"),
    # the reimplementation's L_LLD before its coefficient (its README: L_total = L_GRPO +
    # lld_coef * L_LLD), normalised over all valid tokens as the authors' code does
    C.LLDS_LOSS: ("actor/lld_loss", "lld_loss"),
    # the reimplementation's share of valid tokens inside an active action gate
    C.LLDS_FRAC_GATED: ("actor/lld_active_ratio", "lld_active_ratio"),
    # ... and the authors' sampling-policy confidence (AUTHORS_VERL_NAMES: what these mean)
    C.LOGP_CORRECT: ("actor/pos_avg_old_log_prob", "pos_avg_old_log_prob"),
    C.LOGP_INCORRECT: ("actor/neg_avg_old_log_prob", "neg_avg_old_log_prob"),
    C.LOGP_REF_CORRECT: ("actor/pos_avg_ref_log_prob", "pos_avg_ref_log_prob"),
    C.LOGP_REF_INCORRECT: ("actor/neg_avg_ref_log_prob", "neg_avg_ref_log_prob"),
    C.LLDS_LOSS_WEIGHTED: ("actor/loss_noreduce", "loss_noreduce"),
    C.LLDS_ACTIONS_GATED: ("actor/mean_reduce_chunk", "mean_reduce_chunk"),
}

#: The paper authors' verl fork (``dp_actor.py``): metric -> what it is and how it is imported.
#: ``pos/neg_avg_old_log_prob`` are ``masked_mean(old_log_prob * (A >= 0 | A < 0),
#: response_mask)``: the group's log-prob sum over ALL response tokens of the micro-batch, so the
#: level is the per-token mean times the group's share of tokens; the trend carries over (the
#: detector reads trends). "pos" is A >= 0: it includes the groups whose samples all got the same
#: reward (A = 0), all-wrong groups too. Each is set with ``metrics[...] =`` per micro-batch, so a
#: step holds rank 0's LAST micro-batch only. Our own ``actor/lld/logp_*`` win when both are logged.
AUTHORS_VERL_NAMES: dict[str, str] = {
    "actor/pos_avg_old_log_prob": C.LOGP_CORRECT
    + " (A >= 0 incl. zero-advantage groups; level scaled by their token share; last micro-batch)",
    "actor/neg_avg_old_log_prob": C.LOGP_INCORRECT
    + " (A < 0; level scaled by their token share; last micro-batch)",
    "actor/pos_avg_ref_log_prob": C.LOGP_REF_CORRECT
    + " (reference policy, not the sampling policy; same scaling)",
    "actor/neg_avg_ref_log_prob": C.LOGP_REF_INCORRECT
    + " (reference policy, not the sampling policy; same scaling)",
    "actor/loss_noreduce": C.LLDS_LOSS_WEIGHTED
    + " (lambda x the penalty as added to the loss, token mean over all response tokens)",
    "actor/loss_noreduce_coef": C.LLDS_LAMBDA,
    "actor/mean_reduce_chunk": C.LLDS_ACTIONS_GATED
    + " (mean gated actions per A >= 0 response; logged with chunk_noreduce only)",
    "actor/lowest_prob_avg_mean": "not imported (no canonical column)",
    "actor/lowest_prob_avg_min": "not imported (no canonical column)",
}

#: The authors' names whose presence marks a log as made with their code (``authors_note``).
_AUTHORS_MARKERS = frozenset(
    {"actor/pos_avg_old_log_prob", "actor/loss_noreduce", "actor/loss_noreduce_coef"}
)


def authors_note(sources: Iterable[str]) -> str | None:
    """A sentence on what a log made with the paper authors' verl fork supports, when its
    column names (``sources``) say it is one; else None."""
    names = {str(s).strip() for s in sources}
    if not names & _AUTHORS_MARKERS:
        return None
    return (
        "read as the paper authors' verl fork: logp_correct / logp_incorrect are their "
        "pos/neg_avg_old_log_prob (pos = advantage >= 0, zero-advantage groups included; rank "
        "0's last micro-batch of the step; level diluted by the token share, the trend is read); "
        "no per-response displacement (delta_*, frac_correct_displaced): the displacement "
        "alerts cannot be raised, stagnation and decay come from the confidence trend"
    )


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
