#!/usr/bin/env bash
# LLDS in a verl 0.9.x GRPO run (e.g. Search-R1): add these overrides to your usual
# `python -m verl.trainer.main_ppo ...` command. See docs/verl.md.
#
# - `_target_` swaps verl's PolicyLossConfig for ours (a subclass with the LLDS keys); verl's
#   workers instantiate it, which imports lld_monitor.integrations.verl and registers "llds".
# - LLDS acts only when a rollout batch is reused: several mini-batches per batch
#   (train_batch_size > ppo_mini_batch_size) or ppo_epochs > 1. Keep dropout off.
set -euo pipefail

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.actor.policy_loss._target_=lld_monitor.integrations.verl.LLDSPolicyLossConfig \
    actor_rollout_ref.actor.policy_loss.loss_mode=llds \
    +actor_rollout_ref.actor.policy_loss.base_loss_mode=vanilla \
    +actor_rollout_ref.actor.policy_loss.llds_lambda=0.2 \
    +actor_rollout_ref.actor.policy_loss.llds_gate=action \
    +actor_rollout_ref.actor.policy_loss.llds_normalize=paper \
    "$@"
