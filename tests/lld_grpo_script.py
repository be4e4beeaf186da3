"""Tiny GRPOTrainer factory for the monitor tests, and the script test_multiprocess.py launches.

``make_grpo_trainer(tmp, **config)`` builds a real TRL GRPOTrainer on a tiny Qwen2 model and an
in-process word-level tokenizer (offline, CPU). Run as a script (under ``accelerate launch``) it
trains a few steps with an ``LLDMonitor`` in strict mode and dumps each rank's local sums.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WORDS = "a b c d e f g h i j k l m n o p q r s t u v w x y z".split()
PROMPTS = [f"say {w} {v}" for w in WORDS[:8] for v in WORDS[8:12]]


def reward_has_a(completions: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the completion contains the word 'a' (a random tiny model hits it sometimes)."""
    return [1.0 if " a " in f" {c} " or c.strip().startswith("a") else 0.0 for c in completions]


def reward_length(completions: list[str], **kwargs: Any) -> list[float]:
    """A second reward function: short completions score higher (per-function columns)."""
    return [1.0 / (1 + len(c.split())) for c in completions]


def build_tokenizer() -> Any:
    from lld_monitor.toy.tiny import build_tokenizer as build

    return build(PROMPTS + [" ".join(WORDS)] * 4, vocab_size=64)


def make_grpo_trainer(
    tmp: str | Path,
    *,
    hidden_size: int = 32,
    num_layers: int = 1,
    max_steps: int = 3,
    seed: int = 0,
    callbacks: list[Any] | None = None,
    reward_funcs: list[Any] | None = None,
    **config: Any,
) -> Any:
    """A real GRPOTrainer on a tiny model; ``config`` overrides GRPOConfig fields."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from lld_monitor.toy.tiny import build_tiny_model

    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    settings: dict[str, Any] = {
        "output_dir": str(tmp),
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 6,
        "max_steps": max_steps,
        "learning_rate": 5e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "disable_dropout": True,
        "seed": seed,
        "temperature": 1.0,
        "beta": 0.0,
        "dataloader_num_workers": 0,
    }
    settings.update(config)
    args = GRPOConfig(**settings)
    data = Dataset.from_dict({"prompt": PROMPTS})
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs or [reward_has_a],
        args=args,
        train_dataset=data,
        processing_class=tok,
        callbacks=callbacks,
    )


def _collective_layers(model: Any, fail_in_probe: Any) -> None:
    """Every decoder layer's forward runs an all_reduce first (as under ZeRO-3/FSDP).

    ``fail_in_probe()`` True makes rank 1 raise in the second layer, after the first layer's
    collective: the other rank is then waiting in the second layer's.
    """
    import torch

    dist = torch.distributed
    for i, layer in enumerate(model.model.layers):

        def pre_hook(module: Any, args: Any, i: int = i) -> None:
            if i == 1 and dist.get_rank() == 1 and fail_in_probe():
                raise RuntimeError("injected: out of memory in the probe forward")
            dist.all_reduce(torch.zeros(1))

        layer.register_forward_pre_hook(pre_hook)


def main(out_dir: str, mode: str = "ok") -> None:
    """Distributed run: train with a monitor, dump each rank's local sums and rows per step.

    ``mode``: ``ok`` (strict monitor); ``recover`` (layer collectives, rank 1 fails preparing the
    first probe and packing step 3's sums); ``forward`` (layer collectives, rank 1 fails inside
    the probe forward).
    """
    import torch
    from transformers import TrainerCallback

    from lld_monitor import LLDMonitor
    from lld_monitor.monitor.step_metrics import StepMetrics

    out = Path(out_dir)
    dumps: list[dict[str, Any]] = []

    class Dump(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            probes = [
                {
                    "logp_old": r.logp_old.tolist(),
                    "logp_new": r.logp_new.tolist(),
                    "mask": r.mask.tolist(),
                    "correct": r.correct.tolist(),
                }
                for r in monitor.adapter.probe_records
            ]
            local = monitor.last_local_sums
            dumps.append(
                {
                    "step": state.global_step,
                    "local": local.tolist() if local is not None else None,
                    "probes": probes,
                    "row": monitor.last_row,
                }
            )

    strict = mode == "ok"
    monitor = LLDMonitor(out / "run", strict=strict, detector=None, probe_fraction=0.5)
    config: dict[str, Any] = {"max_steps": 3, "steps_per_generation": 2}
    if mode != "ok":  # every rank runs the same number of forwards: no early EOS
        steps = 4 if mode == "recover" else 2
        config = {"max_steps": steps, "steps_per_generation": 2, "num_layers": 2}
        config["generation_kwargs"] = {"min_new_tokens": 6}
    trainer = make_grpo_trainer(out / "trainer", **config)
    monitor.attach(trainer)
    trainer.add_callback(Dump())
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if mode != "ok":
        adapter = monitor.adapter
        probing = {"on": False}
        _collective_layers(trainer.model, lambda: mode == "forward" and probing["on"])
        forward = adapter._probe_forward

        def probe_forward(plan: Any) -> Any:
            probing["on"] = True
            try:
                return forward(plan)
            finally:
                probing["on"] = False

        adapter._probe_forward = probe_forward
        if mode == "recover" and rank == 1:
            prepare, pack = adapter._prepare_probe, StepMetrics.pack
            calls = {"prepare": 0}

            def prepare_probe(*args: Any) -> Any:
                calls["prepare"] += 1
                if calls["prepare"] == 1:
                    raise RuntimeError("injected: preparing the probe failed")
                return prepare(*args)

            def failing_pack(self: Any, device: Any, names: Any) -> Any:
                if monitor.step == 3:
                    raise RuntimeError("injected: packing step 3 failed")
                return pack(self, device, names)

            adapter._prepare_probe = prepare_probe
            StepMetrics.pack = failing_pack
    trainer.train()
    (out / f"rank{rank}.json").write_text(json.dumps({"world": world, "steps": dumps}))


if __name__ == "__main__":
    main(*sys.argv[1:])
