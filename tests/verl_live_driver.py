"""A verl driver on CPU with real Ray: two FSDP2 actor workers (gloo), the live monitor in it.

Run as ``python tests/verl_live_driver.py OUT`` (tests/test_verl_live.py does): a local Ray cluster,
verl's ``TrainingWorker`` x2 in a ``RayWorkerGroup``, the ``llds`` loss with a runtime control,
4 steps driven the way verl's trainer drives the actor (``infer_batch`` for ``old_log_prob`` and
the probe, ``train_mini_batch`` for the update), :class:`VerlLiveMonitor` writing ``OUT/run``.
Each step's update is split into its two mini-batches with a forward in between, so that the test
can recompute every loss from the log-probs the workers saw. ``OUT/result.json`` holds the tensors
and metrics. verl's full trainer loop needs a rollout engine (vLLM/SGLang) and TransferQueue: see
docs/verl.md. The CPU platform shim is ``tests/verl_cpu_platform.py``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
ENV = {
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",
    "VERL_USE_EXTERNAL_MODULES": "verl_cpu_platform,lld_monitor.integrations.verl",
    "PYTHONPATH": f"{REPO}{os.pathsep}{TESTS}",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "WANDB_MODE": "offline",
}
N_STEPS = 4
LAM = 0.2
B, P, R = 8, 3, 6  # responses, prompt tokens, response tokens
MINI = 4  # rows per mini-batch (global): two mini-batches per step, two rows per worker each


class ScriptedDetector:
    """A detector with the monitor's interface (``update(row) -> alerts``) that raises a
    stagnation warning after step 2 and a critical collapse after step 3: the real
    PhaseDetector needs 20+ steps, which a CPU test cannot afford."""

    phase = "healthy"

    def update(self, row):
        from lld_monitor.events import Alert

        step = int(row["step"])
        if step == 2:
            self.phase = "stagnation"
            return [Alert(step, "stagnation", "warning", "scripted stagnation at step 2")]
        if step == 3:
            self.phase = "collapse"
            return [Alert(step, "collapse", "critical", "scripted collapse at step 3")]
        return []


def main(out: Path) -> None:
    t_start = time.perf_counter()
    sys.path.insert(0, str(TESTS))
    os.environ.update(ENV)
    import ray
    import torch
    import verl_cpu_platform  # noqa: F401  (the driver needs the CPU platform too)

    ray.init(num_cpus=2, runtime_env={"env_vars": ENV}, include_dashboard=False)
    import verl
    from hydra import compose, initialize_config_dir
    from verl import DataProto
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from lld_monitor import LLDSConfig
    from lld_monitor.integrations.verl_live import FlightRecorder, VerlLiveMonitor
    from lld_monitor.toy.tiny import build_tiny_model, build_tokenizer

    run_dir = out / "run"
    control = "lld_monitor_llds:test"
    model_dir = tempfile.mkdtemp()
    tok = build_tokenizer(["the cat sat on the mat search answer info"] * 4)
    build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cfg_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(cfg_dir), version_base=None):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[
                "actor_rollout_ref.actor.policy_loss._target_="
                "lld_monitor.integrations.verl.LLDSPolicyLossConfig",
                "actor_rollout_ref.actor.policy_loss.loss_mode=llds",
                # the config says off; the driver's control overrides it at runtime
                "+actor_rollout_ref.actor.policy_loss.llds_enabled=false",
                f"+actor_rollout_ref.actor.policy_loss.llds_control={control}",
                f"actor_rollout_ref.model.path={model_dir}",
                "+actor_rollout_ref.model.override_config.attn_implementation=eager",
                "actor_rollout_ref.model.use_remove_padding=false",
                "actor_rollout_ref.actor.strategy=fsdp2",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.actor.use_dynamic_bsz=false",
                "actor_rollout_ref.actor.use_kl_loss=false",
                "actor_rollout_ref.actor.optim.lr=0.05",
                "actor_rollout_ref.rollout.n=1",
            ],
        )
    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor_config.model_config = model_config
    engine = actor_config.engine
    engine.use_dynamic_bsz, engine.use_remove_padding = False, False
    engine.micro_batch_size_per_gpu, engine.infer_micro_batch_size_per_gpu = 1, 2
    worker_config = TrainingWorkerConfig(
        model_type="language_model",
        model_config=model_config,
        engine_config=engine,
        optimizer_config=actor_config.optim,
        checkpoint_config=actor_config.checkpoint,
    )
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
    wg = RayWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=RayClassWithInitArgs(
            cls=ray.remote(TrainingWorker), config=worker_config
        ),
        use_gpu=False,
    )
    wg.reset()
    wg.set_loss_fn(partial(ppo_loss, config=actor_config))  # as ActorRolloutRefWorker does
    t_ready = time.perf_counter()

    # The batch: rows 4, 5 repeat rows 1, 3 (pushed down in mini-batch 1) with A >= 0, so the
    # first mini-batch displaces them and LLDS has something to act on in the second.
    torch.manual_seed(0)
    vocab = len(tok)
    prompts = torch.randint(5, vocab, (B, P))
    responses = torch.randint(5, vocab, (B, R))
    for dst, src in ((4, 1), (5, 3)):
        prompts[dst], responses[dst] = prompts[src], responses[src]
    attention_mask = torch.ones(B, P + R, dtype=torch.long)
    response_mask = attention_mask[:, P:].clone()
    response_mask[::2, 2:4] = 0  # a tool observation in every other response: two actions
    adv_row = torch.tensor([1.0, -1.0, 0.5, -1.0, 0.5, 0.0, -0.5, 1.0])
    rewards = (adv_row > 0).float()  # 1 = correct
    scores = torch.zeros(B, R)
    last = response_mask.cumsum(1).argmax(1)
    scores[torch.arange(B), last] = rewards
    base = {
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
    }
    advantages = adv_row[:, None] * response_mask

    def td(rows, **extra):
        data = {k: v[rows] for k, v in base.items()}
        data.update({k: v[rows] for k, v in extra.items()})
        return left_right_2_no_padding(
            DataProto.from_dict(tensors=data, meta_info={"temperature": 1.0}).to_tensordict()
        )

    def log_prob(rows):
        """verl's compute_log_prob path (the trainer's old_log_prob and our probe)."""
        data = td(rows)
        tu.assign_non_tensor(data, calculate_entropy=True, compute_loss=False)
        outs = wg.infer_batch(data)
        outs = ray.get(outs) if isinstance(outs, list) else outs
        outs = outs.get() if hasattr(outs, "get") and not isinstance(outs, dict) else outs
        return no_padding_2_padding(tu.get(outs, "log_probs"), data).float()

    def update(rows, old):
        data = td(rows, old_log_probs=old, advantages=advantages)
        tu.assign_non_tensor(  # as the trainer's _update_actor does
            data,
            calculate_entropy=False,
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=MINI,
            mini_batch_size=MINI,
            epochs=1,
            seed=1,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
        )
        out = wg.train_mini_batch(data)
        out = out.get() if hasattr(out, "get") and not isinstance(out, dict) else out
        metrics = tu.get(out, "metrics")
        return {k: float(v) for k, v in reduce_metrics(rename_dict(metrics, "actor/")).items()}

    live = VerlLiveMonitor(
        run_dir,
        llds=LLDSConfig(lam=LAM, enabled=False),
        control=control,
        probe_fraction=0.5,
        detector=ScriptedDetector(),
        auto_llds=True,
        flight_recorder=FlightRecorder(run_dir, before=2, after=1, max_rows=4),
        tokenizer=tok,
        strict=True,
    )
    steps = []
    all_rows = torch.arange(B)
    mb1, mb2 = all_rows[:MINI], all_rows[MINI:]
    for step in range(1, N_STEPS + 1):
        if step == 4:
            live.llds.disable(reason="test: manual off")
        t0 = time.perf_counter()
        old = log_prob(all_rows)
        t_old = time.perf_counter() - t0
        version = live.before_update(step)
        first = update(mb1, old)
        mid = log_prob(all_rows)  # only for the test's recomputation of mini-batch 2's loss
        second = update(mb2, old)
        t1 = time.perf_counter()
        rows = live.probe_rows(B, multiple=4)  # 2 workers x infer micro-batch 2
        new = log_prob(rows)
        t_probe = time.perf_counter() - t1
        metrics = {k: (first[k] + second[k]) / 2 for k in first if k in second}  # verl's mean
        batch = {
            "responses": responses,
            "response_mask": response_mask,
            "old_log_probs": old,
            "advantages": advantages,
            "token_level_scores": scores,
        }
        row = live.end_step(step, batch, metrics, probe_log_probs=new, probe_rows=rows)
        steps.append(
            {
                "step": step,
                "control_version": version,
                "llds_enabled_after": live.llds.enabled,
                "first": first,
                "second": second,
                "old": old.tolist(),
                "mid": mid.tolist(),
                "probe_rows": rows.tolist(),
                "probe": new.tolist(),
                "row": {k: v for k, v in row.items() if isinstance(v, int | float)},
                "seconds": time.perf_counter() - t0,
                "seconds_old_log_prob": t_old,
                "seconds_probe": t_probe,
                "monitor_seconds": live.monitor_seconds[-1],
                "run_rows_on_disk": sum(1 for _ in open(run_dir / "steps.jsonl")),
            }
        )
    live.close()
    result = {
        "steps": steps,
        "mask": response_mask.tolist(),
        "adv": advantages.tolist(),
        "rewards": rewards.tolist(),
        "setup_seconds": t_ready - t_start,
        "total_seconds": time.perf_counter() - t_start,
    }
    (out / "result.json").write_text(json.dumps(result))
    ray.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
