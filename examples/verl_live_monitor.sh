#!/usr/bin/env bash
# The live LLD monitor in a verl 0.9.x Search-R1 GRPO run (GPU; NOT RUN in this project: it needs
# GPUs, a rollout engine (SGLang or vLLM), verl's TransferQueue and a retrieval server). See
# docs/verl.md, "Live monitor".
#
# - VERL_USE_EXTERNAL_MODULES makes every verl process (the TaskRunner that builds the trainer,
#   and the workers) import our trainer module, which registers trainer_mode "lld_monitor"
#   (verl's PPOTrainerSync + the monitor in the driver). Export it before `ray start` when you use
#   a running Ray cluster; a local cluster started by main_ppo inherits it.
# - The llds loss overrides let the driver switch LLDS at runtime (it starts off here and
#   auto_llds switches it on at a stagnation/decay alert).
# - Run from a checkout of verl 0.9.1 (its examples/ hold the Search-R1 config, tool config and
#   data preprocessing: python examples/data_preprocess/preprocess_search_r1_dataset.py) with a
#   retriever serving http://127.0.0.1:8000/retrieve.
# - Follow it live: lld-monitor dashboard "$RUN_DIR" (on the driver machine).
set -euo pipefail

RUN_DIR=${RUN_DIR:-$PWD/lld_runs/search_r1_qwen2.5-3b}
CONFIG_PATH=${CONFIG_PATH:-$PWD/examples/sglang_multiturn/config}
TOOL_CONFIG=${TOOL_CONFIG:-$CONFIG_PATH/tool_config/search_tool_config.yaml}
DATA_DIR=${DATA_DIR:-$HOME/data/searchR1_processed_direct}
export VERL_USE_EXTERNAL_MODULES=lld_monitor.integrations.verl_trainer

python3 -m verl.trainer.main_ppo \
    --config-path="$CONFIG_PATH" \
    --config-name=search_multiturn_grpo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=512 \
    data.max_prompt_length=4096 \
    data.max_response_length=3000 \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.rollout.name=sglang \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOL_CONFIG" \
    actor_rollout_ref.actor.policy_loss._target_=lld_monitor.integrations.verl.LLDSPolicyLossConfig \
    actor_rollout_ref.actor.policy_loss.loss_mode=llds \
    +actor_rollout_ref.actor.policy_loss.llds_enabled=false \
    +actor_rollout_ref.actor.policy_loss.llds_lambda=0.2 \
    trainer.v1.trainer_mode=lld_monitor \
    +lld_monitor.run_dir="$RUN_DIR" \
    +lld_monitor.auto_llds=true \
    +lld_monitor.probe_fraction=0.25 \
    trainer.n_gpus_per_node=8 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name=search_r1_lld \
    trainer.experiment_name=qwen2.5-3b-it-grpo-lld-monitor \
    "$@"
