"""Overhead of the LLD monitor on a real TRL GRPOTrainer (tiny Qwen2 models, CPU or GPU).

Four configurations per model size, same seed, run interleaved (A B C D A B C D ...) so that
machine noise hits all of them alike:

- ``none``: no monitor;
- ``capture``: monitor with the post-update probe off (``probe_fraction=0``);
- ``probe``: default monitor (``probe_fraction=0.25``, detector on);
- ``llds``: default monitor with LLDS enabled (two updates per generation batch, so it acts).

The figures judged against the targets are measured inside each run, so the load other
processes put on a shared machine does not move them: the process CPU time spent in the
monitor's hooks (``adapter.hook_cpu_seconds``: capture, the in-batch counting in the loss, the
per-step reductions, the row written, the probe's forward) as a share of the run's CPU time per
optimizer step, and for LLDS what it adds to the default monitor: its hooks' CPU time plus the
CPU time its term adds to ``accelerator.backward`` (timed in every run), per step of the
``probe`` arm. Targets: capture <= 3%, probe <= 10%, LLDS <= 2% of the step.

Beside them, the side-by-side ratios of mean CPU and wall time per step (capture/none,
probe/none, llds/probe; first step of each run dropped), with their spread over the rounds
(each round's ratio, min-max): on a shared CPU these move by several percent from round to
round, so they are reported, not judged.

    python benchmarks/bench_monitor.py [--sizes 128x2,512x6] [--steps 12] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from transformers import TrainerCallback

from lld_monitor import LLDMonitor, LLDSConfig

CONFIGS = ("none", "capture", "probe", "llds")
#: Ratios of the side by side step times, reported with their spread.
RATIOS = (("capture", "none"), ("probe", "none"), ("llds", "probe"))
#: Targets: share of the step's CPU time the monitor adds, measured in-run.
TARGETS = {"capture": 0.03, "probe": 0.10, "llds": 0.02}


class _StepTimer(TrainerCallback):
    """Wall and process-CPU time of each optimizer step (generation included)."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._t0 = self._c0 = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._t0, self._c0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.wall.append(time.perf_counter() - self._t0)
        self.cpu.append(time.process_time() - self._c0)


def run_once(
    config: str, hidden: int, layers: int, steps: int, seed: int, tmp: Path
) -> dict[str, list[float]]:
    """Per-step wall and CPU times of one training run in ``config`` (first step dropped)."""
    from lld_grpo_script import make_grpo_trainer

    device = {"use_cpu": not os.environ.get("BENCH_GPU")}
    trainer = make_grpo_trainer(
        tmp / "trainer",
        hidden_size=hidden,
        num_layers=layers,
        max_steps=steps,
        seed=seed,
        steps_per_generation=2,
        max_completion_length=16,
        # Every completion has the full length, so runs whose training differs (LLDS on) still
        # generate the same number of tokens per step: the ratio then measures the monitor.
        generation_kwargs={"min_new_tokens": 16},
        per_device_train_batch_size=8,
        num_generations=4,
        **device,
    )
    timer = _StepTimer()
    backward = [0.0]  # process CPU time in accelerator.backward (LLDS's share shows there)
    accelerate_backward = trainer.accelerator.backward

    def timed_backward(loss: Any, **kwargs: Any) -> Any:
        c0 = time.process_time()
        try:
            return accelerate_backward(loss, **kwargs)
        finally:
            backward[0] += time.process_time() - c0

    trainer.accelerator.backward = timed_backward
    monitor = None
    if config != "none":
        monitor = LLDMonitor(
            tmp / "run",
            probe_fraction=0.0 if config == "capture" else 0.25,
            detector=config != "capture",
            llds=LLDSConfig(enabled=True) if config == "llds" else None,
        )
        monitor.attach(trainer)
    trainer.add_callback(timer)  # after the monitor: its on_step_end work is timed too
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
    share = hook_cpu = 0.0
    if monitor is not None:
        share = monitor.adapter.hook_seconds / total  # in-run: immune to other processes
        hook_cpu = monitor.adapter.hook_cpu_seconds
        monitor.close()
    # one figure per run: the MEAN step time. Steps alternate between generating and reusing a
    # batch (and only some end with a probe), so per-step times are bimodal and their median
    # jumps between the two modes; the mean is the cost a user pays per step.
    wall, cpu = timer.wall[1:], timer.cpu[1:]
    n = len(timer.cpu)
    return {
        "wall": [sum(wall) / len(wall)],
        "cpu": [sum(cpu) / len(cpu)],
        "share": [share],
        "hook_cpu_share": [hook_cpu / total_cpu],
        "hook_cpu": [hook_cpu / n],  # per step
        "backward_cpu": [backward[0] / n],  # per step
        "step_cpu": [total_cpu / n],  # per step, the whole train() (first step included)
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="LLD monitor overhead on GRPOTrainer")
    p.add_argument("--sizes", default="128x2,512x6", help="hidden x layers, comma-separated")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the figures to this file")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: stable timings)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    results: dict[str, Any] = {}
    ok = True
    for hidden, layers in sizes:
        fields = ("wall", "cpu", "share", "hook_cpu_share", "hook_cpu", "backward_cpu", "step_cpu")
        times: dict[str, dict[str, list[float]]] = {c: {f: [] for f in fields} for c in CONFIGS}
        for rep in range(args.repeats):
            for config in CONFIGS:  # interleaved
                with tempfile.TemporaryDirectory() as tmp:
                    t = run_once(config, hidden, layers, args.steps, args.seed, Path(tmp))
                for f in fields:
                    times[config][f] += t[f]
            print(f"  size {hidden}x{layers} repeat {rep + 1}/{args.repeats} done", flush=True)
        key = f"{hidden}x{layers}"
        med = {f: {c: statistics.median(times[c][f]) for c in CONFIGS} for f in fields}
        # what LLDS adds, per round: its hooks' and its backward's CPU time over the probe arm's
        llds_extra = [
            (times["llds"]["hook_cpu"][r] - times["probe"]["hook_cpu"][r])
            + (times["llds"]["backward_cpu"][r] - times["probe"]["backward_cpu"][r])
            for r in range(args.repeats)
        ]
        added = {
            "capture": med["hook_cpu_share"]["capture"],
            "probe": med["hook_cpu_share"]["probe"],
            "llds": statistics.median(llds_extra) / med["step_cpu"]["probe"],
        }
        results[key] = {"median_step_s": med, "added": added, "ratios": {}, "targets": {}}
        for clock in ("wall", "cpu"):
            print(
                f"model hidden={hidden} layers={layers}: median over runs of mean {clock} s/step "
                + ", ".join(f"{c} {med[clock][c]:.4f}" for c in CONFIGS)
            )
        print(
            "  share of training wall time inside the monitor's hooks (same run): "
            + ", ".join(f"{c} {100 * med['share'][c]:.1f}%" for c in CONFIGS[1:])
        )
        for name, target in TARGETS.items():
            passed = added[name] <= target
            ok &= passed
            how = (
                "hooks' CPU share of the run"
                if name != "llds"
                else "its hooks + its backward, CPU per step of the probe arm"
            )
            results[key]["targets"][name] = {"value": added[name], "target": target, "pass": passed}
            print(
                f"  {name} adds {100 * added[name]:.2f}% ({how}; target <= {100 * target:.0f}%) "
                + ("PASS" if passed else "FAIL")
            )
        for num, den in RATIOS:
            entry: dict[str, Any] = {}
            for clock in ("wall", "cpu"):
                rounds = [a / b for a, b in zip(times[num][clock], times[den][clock])]
                entry[clock] = med[clock][num] / med[clock][den]
                entry[f"{clock}_rounds"] = [min(rounds), max(rounds)]
            results[key]["ratios"][f"{num}/{den}"] = entry
            print(
                f"  {num}/{den} side by side: cpu {entry['cpu']:.3f} (rounds "
                f"{entry['cpu_rounds'][0]:.3f}-{entry['cpu_rounds'][1]:.3f}), wall "
                f"{entry['wall']:.3f} (rounds {entry['wall_rounds'][0]:.3f}-"
                f"{entry['wall_rounds'][1]:.3f}; reported, not judged)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print("ALL PASS" if ok else "SOME FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
