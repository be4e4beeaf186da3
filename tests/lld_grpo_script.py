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
    from lld_monitor.tiny import build_tokenizer as build

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

    from lld_monitor.tiny import build_tiny_model

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


def main(out_dir: str) -> None:
    """Distributed run: train with a strict monitor, dump each rank's local sums per step."""
    import torch
    from transformers import TrainerCallback

    from lld_monitor import LLDMonitor

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
            dumps.append(
                {
                    "step": state.global_step,
                    "local": monitor.last_local_sums.tolist(),
                    "probes": probes,
                    "row": monitor.last_row,
                }
            )

    monitor = LLDMonitor(out / "run", strict=True, detector=None, probe_fraction=0.5)
    trainer = make_grpo_trainer(out / "trainer", max_steps=3, steps_per_generation=2)
    monitor.attach(trainer)
    trainer.add_callback(Dump())
    trainer.train()
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    (out / f"rank{rank}.json").write_text(json.dumps({"world": world, "steps": dumps}))


if __name__ == "__main__":
    main(sys.argv[1])
