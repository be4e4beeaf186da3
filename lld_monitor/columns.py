"""Canonical column names of a run's step log: the one definition of every name.

Every module (metrics, monitor, run log, analyzer, importers, dashboard) refers to these
constants, never to string literals. Sign convention: ``delta = logp_new - logp_old``;
negative means the update *displaced* (lowered) the likelihood.
"""

from __future__ import annotations

# --- identity -------------------------------------------------------------------------------
STEP = "step"  # optimizer step (int), monotone within a run
TIME = "time"  # wall-clock UNIX seconds when the row was written

# --- standard training metrics (any trainer) ------------------------------------------------
REWARD_MEAN = "reward_mean"  # mean total reward over the step's completions
REWARD_STD = "reward_std"  # std of the total reward over the step's completions
ACCURACY = "accuracy"  # share of completions counted correct (reward >= threshold)
LOSS = "loss"  # training loss as the trainer reports it
LEARNING_RATE = "learning_rate"
GRAD_NORM = "grad_norm"  # pre-clip global grad norm (mean over the step's optimizer updates)
GRAD_NORM_MAX = "grad_norm_max"  # max pre-clip grad norm over the step's optimizer updates
ENTROPY = "entropy"  # mean per-token entropy of generated tokens
KL = "kl"  # mean per-token KL to the reference model
COMPLETION_LENGTH = "completion_length"  # mean number of generated (non-tool) tokens
# share of completions cut at the length cap (TRL max_completion_length, verl max_response_length)
FRAC_TRUNCATED = "frac_truncated"
NUM_SEARCHES = "num_searches"  # mean number of tool calls per completion
FRAC_ZERO_STD_GROUPS = "frac_zero_std_groups"  # share of prompt groups whose rewards are all equal
REWARD_FN_PREFIX = "reward_fn/"  # + reward function name: mean raw reward of that function (TRL)

# --- confidence under the sampling policy (free) --------------------------------------------
LOGP_CORRECT = "logp_correct"  # mean over correct responses of per-token mean logp_old
LOGP_INCORRECT = "logp_incorrect"  # same over incorrect responses
LOGP_FIRST_ACTION = "logp_first_action"  # mean over responses of first action's per-token logp_old
LOGP_LATER_ACTIONS = "logp_later_actions"  # same over the 2nd..last actions

# --- displacement (post-update minus pre-update log-prob, generated tokens only) ------------
DELTA_CORRECT = "delta_correct"  # mean over correct responses of summed change
DELTA_INCORRECT = "delta_incorrect"  # mean over incorrect responses of summed change
DELTA_CORRECT_PER_TOKEN = "delta_correct_per_token"  # mean over correct of per-token mean change
DELTA_INCORRECT_PER_TOKEN = "delta_incorrect_per_token"
# share of correct responses whose summed change is < 0, strictly (the paper's >50% indicator);
# a response whose likelihood did not move is not displaced
FRAC_CORRECT_DISPLACED = "frac_correct_displaced"
# share of the generated tokens of correct responses whose change is < 0
FRAC_TOKENS_DISPLACED = "frac_tokens_displaced"
# mean over correct responses of the first action's summed change
DELTA_FIRST_ACTION = "delta_first_action"
# mean over (correct response, later action) pairs of the summed change
DELTA_LATER_ACTIONS = "delta_later_actions"
N_CORRECT = "n_correct"  # number of correct responses measured this step
N_INCORRECT = "n_incorrect"  # number of incorrect responses measured this step

# --- in-batch displacement (a reused rollout batch, measured inside the loss) ---------------
# When a rollout batch is trained on for several updates (TRL: num_iterations > 1), each
# response is measured once per batch: the first time the loss sees it again after an update
# that included it, its summed change of log-prob since generation (generated tokens only).
# The same indicator as FRAC_CORRECT_DISPLACED, available while the batch is still trained on.
INBATCH_N_CORRECT = "inbatch_n_correct"  # correct responses measured this step
INBATCH_N_CORRECT_DISPLACED = "inbatch_n_correct_displaced"  # ... whose summed change is < 0
INBATCH_FRAC_CORRECT_DISPLACED = "inbatch_frac_correct_displaced"  # the ratio of the two

# --- the probe's own health -----------------------------------------------------------------
# share (0-1) of the step's post-update probes in which no probed generated token's log-prob
# changed: the update did nothing to the policy (learning rate 0, frozen weights, an optimizer
# that does not step, an adapter not attached); absent when the step had no probe
PROBE_STILL = "probe_still"

# --- sampler vs trainer (vLLM / SGLang rollouts scored again by the trainer) ------------------
# mean importance-sampling ratio pi_trainer / pi_sampler over generated tokens (~1 when the two
# agree): TRL's sampling/importance_sampling_ratio/mean, verl's rollout_corr/rollout_is_mean
IS_RATIO_MEAN = "is_ratio_mean"
# mean |log pi_trainer - log pi_sampler| per generated token (nats): TRL's
# sampling/sampling_logp_difference/mean
SAMPLER_LOGP_DIFF = "sampler_logp_diff"
# mean |pi_trainer - pi_sampler| per token (probability units): verl's
# training/rollout_probs_diff_mean
SAMPLER_PROB_DIFF = "sampler_prob_diff"

# --- LLDS regularizer ------------------------------------------------------------------------
LLDS_ENABLED = "llds_enabled"  # 0/1
LLDS_LAMBDA = "llds_lambda"  # lambda in force (0 when disabled)
LLDS_LOSS = "llds_loss"  # unscaled L_LLDS (mean over the step's micro-batches)
LLDS_FRAC_GATED = "llds_frac_gated"  # share of preserving actions/responses/tokens gated on

STANDARD_COLUMNS: tuple[str, ...] = (
    REWARD_MEAN,
    REWARD_STD,
    ACCURACY,
    LOSS,
    LEARNING_RATE,
    GRAD_NORM,
    GRAD_NORM_MAX,
    ENTROPY,
    KL,
    COMPLETION_LENGTH,
    FRAC_TRUNCATED,
    NUM_SEARCHES,
    FRAC_ZERO_STD_GROUPS,
)
CONFIDENCE_COLUMNS: tuple[str, ...] = (
    LOGP_CORRECT,
    LOGP_INCORRECT,
    LOGP_FIRST_ACTION,
    LOGP_LATER_ACTIONS,
)
DISPLACEMENT_COLUMNS: tuple[str, ...] = (
    DELTA_CORRECT,
    DELTA_INCORRECT,
    DELTA_CORRECT_PER_TOKEN,
    DELTA_INCORRECT_PER_TOKEN,
    FRAC_CORRECT_DISPLACED,
    FRAC_TOKENS_DISPLACED,
    DELTA_FIRST_ACTION,
    DELTA_LATER_ACTIONS,
    N_CORRECT,
    N_INCORRECT,
)
INBATCH_COLUMNS: tuple[str, ...] = (
    INBATCH_FRAC_CORRECT_DISPLACED,
    INBATCH_N_CORRECT,
    INBATCH_N_CORRECT_DISPLACED,
)
LLDS_COLUMNS: tuple[str, ...] = (LLDS_ENABLED, LLDS_LAMBDA, LLDS_LOSS, LLDS_FRAC_GATED)
PROBE_COLUMNS: tuple[str, ...] = (PROBE_STILL,)
SAMPLER_COLUMNS: tuple[str, ...] = (IS_RATIO_MEAN, SAMPLER_LOGP_DIFF, SAMPLER_PROB_DIFF)

# --- imported only: what other tools log that lld_monitor itself does not write ---------------
# (docs/importers.md, "The mapping table": which foreign names fill them and what they mean)
ENTROPY_COEF = "entropy_coef"  # coefficient of an entropy bonus in force (TRL's entropy_coef)
# mean per-token log-prob under the REFERENCE policy of the preserving (A >= 0) / negative
# responses (the paper authors' actor/pos_avg_ref_log_prob, ..._neg_...: same dilution as theirs)
LOGP_REF_CORRECT = "logp_ref_correct"
LOGP_REF_INCORRECT = "logp_ref_incorrect"
# lambda x L_LLDS as added to the loss (the authors' actor/loss_noreduce), not the unscaled loss
LLDS_LOSS_WEIGHTED = "llds_loss_weighted"
# mean number of actions gated on per preserving response (the authors' actor/mean_reduce_chunk)
LLDS_ACTIONS_GATED = "llds_actions_gated"
IMPORTED_COLUMNS: tuple[str, ...] = (
    ENTROPY_COEF,
    LOGP_REF_CORRECT,
    LOGP_REF_INCORRECT,
    LLDS_LOSS_WEIGHTED,
    LLDS_ACTIONS_GATED,
)

#: The LLD-specific columns: what foreign logs usually lack.
LLD_COLUMNS: tuple[str, ...] = CONFIDENCE_COLUMNS + DISPLACEMENT_COLUMNS

#: Every canonical step column, in display order.
STEP_COLUMNS: tuple[str, ...] = (
    STEP,
    TIME,
    *STANDARD_COLUMNS,
    *CONFIDENCE_COLUMNS,
    *DISPLACEMENT_COLUMNS,
    *INBATCH_COLUMNS,
    *PROBE_COLUMNS,
    *SAMPLER_COLUMNS,
    *LLDS_COLUMNS,
    *IMPORTED_COLUMNS,
)

# Comma-separated names of the row's columns whose logged value was non-finite (NaN, +-inf).
# The run log stores such values as null and names them here; importers name literal nan/inf
# cells. A row that carries this key (even empty) says which of its missing values were
# non-finite: a blank CSV cell is a missing value, not a NaN. Not a step column.
NONFINITE = "nonfinite"
#: The columns whose non-finite values are a numerical failure, and so are named in NONFINITE
#: (elsewhere a NaN is the monitor's "not measured", e.g. logp_incorrect with no incorrect
#: response).
NONFINITE_COLUMNS: tuple[str, ...] = (LOSS, GRAD_NORM)
#: ... and in a foreign log the reward too: a literal nan / inf reward cell is a failure (the
#: live monitor's input check raises it), a blank one a missing value. (Our run log does not
#: name a missing reward: the monitor raised the failure live, in events.jsonl.)
IMPORTED_NONFINITE_COLUMNS: tuple[str, ...] = (*NONFINITE_COLUMNS, REWARD_MEAN)

# --- event log fields -----------------------------------------------------------------------
EVENT_TYPE = "type"  # one of EVENT_TYPES
EVENT_STEP = "step"
EVENT_TIME = "time"
EVENT_KIND = "kind"  # alert kind, phase name, or action name
EVENT_SEVERITY = "severity"  # info | warning | critical
EVENT_MESSAGE = "message"
EVENT_EVIDENCE = "evidence"  # dict of numbers backing the message
EVENT_TYPES: tuple[str, ...] = ("alert", "phase", "intervention", "error", "lifecycle")

# --- token sample fields (drill-down) -------------------------------------------------------
TOK_STEP = "step"
TOK_RESPONSE = "response"  # index of the response within the step's probed batch
TOK_POSITION = "position"  # position within the completion
TOK_TOKEN_ID = "token_id"
TOK_TEXT = "text"  # decoded token text ('' when no tokenizer)
TOK_ACTION = "action"  # action index within the response (-1 on tool feedback)
TOK_GENERATED = "generated"  # 1 = model-generated, 0 = tool feedback
TOK_LOGP_OLD = "logp_old"
TOK_DELTA = "delta"  # logp_new - logp_old (NaN on tool feedback)
TOK_REWARD = "reward"
TOK_ADVANTAGE = "advantage"
TOK_CORRECT = "correct"
# which sample the row belongs to: "response" (every completion position of a sampled response)
# or "top_token" (one of the step's most displaced tokens, outside the sampled responses)
TOK_SAMPLE = "sample"
TOKEN_COLUMNS: tuple[str, ...] = (
    TOK_STEP,
    TOK_RESPONSE,
    TOK_POSITION,
    TOK_TOKEN_ID,
    TOK_TEXT,
    TOK_ACTION,
    TOK_GENERATED,
    TOK_LOGP_OLD,
    TOK_DELTA,
    TOK_REWARD,
    TOK_ADVANTAGE,
    TOK_CORRECT,
    TOK_SAMPLE,
)

PHASES: tuple[str, ...] = ("healthy", "stagnation", "decay", "collapse", "unknown")
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
