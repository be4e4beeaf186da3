"""verl's v1 trainer with the live monitor: ``trainer.v1.trainer_mode=lld_monitor``.

verl 0.9.1's ``main_ppo`` builds its trainer with ``get_trainer_cls(trainer.v1.trainer_mode)``
from a registry (``verl.trainer.ppo.v1.trainer_base.register_trainer``). Importing this module
registers :class:`LLDMonitorTrainer` (verl's ``PPOTrainerSync`` plus the monitor) as
``lld_monitor``; verl imports it in its TaskRunner through ``VERL_USE_EXTERNAL_MODULES`` (see
docs/verl.md for the command). Settings come from a ``lld_monitor`` section of the Hydra config
(``+lld_monitor.run_dir=...``, keys in ``verl_live.TRAINER_SETTINGS``).

NOT RUN in this project's tests: verl's v1 trainer imports ``transfer_queue`` and needs a rollout
engine (vLLM/SGLang), neither of which runs on the CPU test machine. The parts it wires together
(:class:`~lld_monitor.integrations.verl_live.VerlLiveMonitor`, the Ray control, the probe through
the actor's ``compute_log_prob``) are tested with real Ray workers in tests/test_verl_live.py.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import transfer_queue as tq
from omegaconf import open_dict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from lld_monitor.integrations.verl_live import (
    VerlLiveMonitor,
    control_name_for,
    settings_from,
    sinks_from,
)
from lld_monitor.llds import LLDSConfig

#: ``trainer.v1.trainer_mode`` value that selects this trainer.
TRAINER_MODE = "lld_monitor"


@register_trainer(TRAINER_MODE)
class LLDMonitorTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer plus :class:`VerlLiveMonitor` in the driver."""

    def __init__(self, config: Any) -> None:
        settings = settings_from(config)
        run_dir = settings["run_dir"] or os.path.join(config.trainer.default_local_dir, "lld_run")
        policy_loss = config.actor_rollout_ref.actor.policy_loss
        uses_llds = policy_loss.get("loss_mode") == "llds"
        control = control_name_for(run_dir) if uses_llds else None
        if control is not None:  # before the workers are built from this config
            with open_dict(config):
                policy_loss.llds_control = control
        super().__init__(config)
        # the workers' LLDSPolicyLossConfig defaults (llds_enabled true) when the keys are absent
        enabled = bool(policy_loss.get("llds_enabled", True)) if uses_llds else False
        lam = float(policy_loss.get("llds_lambda", settings["llds_lambda"]))
        self.lld = VerlLiveMonitor(
            run_dir,
            llds=LLDSConfig(lam=lam, enabled=enabled),
            control=control,
            probe_fraction=float(settings["probe_fraction"]),
            flight_recorder=bool(settings["flight_recorder"]),
            auto_llds=bool(settings["auto_llds"]),
            auto_llds_on=tuple(settings["auto_llds_on"]),
            sinks=sinks_from(settings),
            meta={"verl_experiment": str(config.trainer.experiment_name)},
        )
        self._lld_probe: tuple[list[str], torch.Tensor] | None = None

    def fit(self, agent_loop_manager: Any) -> None:
        self.lld.tokenizer = getattr(self, "tokenizer", None)
        error: BaseException | None = None
        try:
            super().fit(agent_loop_manager)
        except BaseException as err:
            error = err
            raise
        finally:
            self.lld.close(error=error)

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        self.lld.before_update(self.global_steps)
        batch = super()._update_actor(batch, metrics)
        self._lld_probe = None
        with self.lld.monitor.guard("verl probe"):
            self._lld_probe = self._probe(batch)
        return batch

    def _probe(self, batch: KVBatchMeta) -> tuple[list[str], torch.Tensor] | None:
        """The sampled rows' keys and log-probs after the update, through the actor's
        compute_log_prob. By key: with ``parameter_sync_step > 1`` a step updates several
        sub-batches and the step's batch concatenates them; the last one's probe is kept."""
        rows = self.lld.probe_rows(len(batch.keys), multiple=self._probe_multiple())
        if rows is None:
            return None
        sub = KVBatchMeta(
            partition_id=batch.partition_id,
            keys=[batch.keys[i] for i in rows.tolist()],
            tags=[batch.tags[i] for i in rows.tolist()],
        )
        sub.extra_info.update(
            {
                "calculate_entropy": False,
                "compute_loss": False,
                "temperature": self.config.actor_rollout_ref.rollout.temperature,
            }
        )
        self.actor_rollout_wg.compute_log_prob(sub)
        data = tq.kv_batch_get(
            keys=sub.keys, partition_id=sub.partition_id, select_fields=["log_probs"]
        )
        from verl.workers.utils.padding import response_from_nested

        mask = tq.kv_batch_get(
            keys=sub.keys, partition_id=sub.partition_id, select_fields=["response_mask"]
        )["response_mask"]
        data["log_probs"] = response_from_nested(data["log_probs"], mask)
        return sub.keys, data.to_padded_tensor()["log_probs"].float()

    def _probe_multiple(self) -> int:
        """Rows of a compute_log_prob call must split evenly over the actor's data-parallel ranks
        and, without dynamic batch sizes, over their log-prob micro-batches."""
        wg = self.actor_rollout_wg
        info = getattr(wg, "_dispatch_info", {}).get("actor")
        dp = max(info) + 1 if info else int(getattr(wg, "world_size", 1))
        ref = self.config.actor_rollout_ref
        if ref.actor.get("use_dynamic_bsz", False):
            return dp
        return dp * int(ref.rollout.get("log_prob_micro_batch_size_per_gpu") or 1)

    def _compute_metrics(self, batch: KVBatchMeta, metrics, timing_raw, global_steps, epoch):
        out = super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        with self.lld.monitor.guard("verl step fetch"):
            fields = ["responses", "response_mask", "old_log_probs", "advantages"]
            fields.append("token_level_rewards")
            if self.use_reference_policy:
                fields.append("ref_log_prob")
            data = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=fields
            )
            padded = data.to_padded_tensor()
            keep = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
            idx = torch.tensor(keep, dtype=torch.long)
            tensors = {k: padded[k][idx] for k in fields}
            width = tensors["response_mask"].shape[1]
            probe_rows = probe = None
            if self._lld_probe is not None:
                keys, logp = self._lld_probe
                position = {batch.keys[i]: j for j, i in enumerate(keep)}
                pick = [k for k, key in enumerate(keys) if key in position]
                if pick:
                    probe_rows = torch.tensor([position[keys[k]] for k in pick])
                    probe = torch.nn.functional.pad(logp[pick], (0, width - logp.shape[1]))
            self._lld_probe = None
            self.lld.end_step(
                int(global_steps), tensors, metrics, probe_log_probs=probe, probe_rows=probe_rows
            )
        return out
