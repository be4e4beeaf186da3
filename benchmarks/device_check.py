"""The one prepared check for a GPU machine: monitor overhead, peak memory, LLDS on the device.

    python benchmarks/device_check.py                         # on a GPU: Qwen2.5-0.5B/1.5B shapes
    python benchmarks/device_check.py --device cpu --quick    # the CPU rehearsal (CI runs it)

Needs nothing from the internet: the models are random-initialised Qwen2 models from a config
(shaped like Qwen2.5-0.5B and -1.5B: hidden size, layers, heads, KV heads, MLP width, vocabulary;
bf16), the tokenizer is trained in-process, and TRL's GRPOTrainer generates with transformers.
It prints, and writes as JSON under ``--out`` (``device_check_<device>_<date>.json``; default
``benchmarks/results/``, where a GPU run's file is committed):

1. the device, torch / transformers / TRL versions;
2. LLDS on the device equals its CPU value on the same (bf16) tensors (|diff| <= 1e-3), for
   every gate and normalisation;
3. per model: mean optimizer-step time of four arms (``none``: no monitor; ``capture``: the
   monitor without its post-update probe; ``probe``: the default monitor; ``llds``: the monitor
   with LLDS on), run interleaved in rounds (A B C D, A B C D, ...), each step timed with
   ``torch.cuda.synchronize`` on both ends; the ratios capture/none, probe/none, llds/probe
   with the spread over rounds; the share of wall time inside the monitor's hooks; the peak GPU
   memory of each arm (``torch.cuda.max_memory_allocated``) and the probe's extra over the
   capture arm (target: within 10% of the step's peak);
4. the CUDA-marked tests (``pytest -m gpu``) and their outcome.

A time budget (``--budget-s``, default 420 s) stops starting new rounds so that the whole check
ends within 8 minutes; what was skipped is said in the output and the JSON. Exit 1 when LLDS
differs or the marked tests fail; the overhead figures are reported against their targets but
do not fail the check (they are measurements).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

ARMS = ("none", "capture", "probe", "llds")
TARGETS = (("capture", "none", 1.03), ("probe", "none", 1.10), ("llds", "probe", 1.02))
PROBE_MEMORY_TARGET = 0.10  # the probe's extra peak memory, as a share of the step's peak
LLDS_TOLERANCE = 1e-3

#: Model shapes: (hidden, layers, heads, kv heads, MLP width, vocabulary).
SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151936),
    # the CPU rehearsal: the same code path, a vocabulary larger than the tokenizer's as on GPU
    "tiny": (32, 2, 4, 2, 64, 4096),
}


def _say(msg: str) -> None:
    print(msg, flush=True)


def environment(device: str) -> dict[str, Any]:
    import torch
    import transformers
    import trl

    env = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "cpu_count": os.cpu_count(),
    }
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        env["bf16_supported"] = bool(torch.cuda.is_bf16_supported())
    return env


def llds_check(device: str) -> dict[str, Any]:
    """LLDS on ``device`` vs CPU, on the same bf16 tensors, for every gate and normalisation."""
    import torch

    from lld_monitor.llds import llds_loss

    g = torch.Generator().manual_seed(0)
    batch, length = 16, 512
    old = (-3.0 * torch.rand(batch, length, generator=g)).to(torch.bfloat16)  # [B, L]
    new = (old.float() + 0.3 * torch.randn(batch, length, generator=g)).to(torch.bfloat16)
    adv = torch.randn(batch, generator=g)  # [B]
    lengths = torch.randint(length // 4, length, (batch,), generator=g)  # [B]
    mask = torch.arange(length)[None, :] < lengths[:, None]  # [B, L]
    mask &= torch.rand(batch, length, generator=g) > 0.1  # holes: several actions per response
    rows = []
    worst = 0.0
    for gate in ("action", "response", "token"):
        for normalize in ("paper", "token_mean"):
            vals = {}
            for dev in ("cpu", device):
                out = llds_loss(
                    logp_new=new.to(dev).requires_grad_(True),
                    logp_old=old.to(dev),
                    advantages=adv.to(dev),
                    mask=mask.to(dev),
                    gate=gate,
                    normalize=normalize,
                )
                vals[dev] = float(out.loss.detach().float().cpu())
            diff = abs(vals[device] - vals["cpu"])
            worst = max(worst, diff)
            rows.append({"gate": gate, "normalize": normalize, "cpu": vals["cpu"],
                         device: vals[device], "abs_diff": diff})  # fmt: skip
    ok = worst <= LLDS_TOLERANCE
    for r in rows:
        _say(
            f"  LLDS {r['gate']:>8}/{r['normalize']:<10} cpu {r['cpu']:.6f}  {device} "
            f"{r[device]:.6f}  |diff| {r['abs_diff']:.2e}"
        )
    _say(f"LLDS {device} vs cpu: max |diff| {worst:.2e} (<= {LLDS_TOLERANCE:g}) "
         + ("PASS" if ok else "FAIL"))  # fmt: skip
    return {"rows": rows, "max_abs_diff": worst, "tolerance": LLDS_TOLERANCE, "pass": ok}


def build_model(tok: Any, shape: str, dtype: Any, seed: int) -> Any:
    from lld_monitor.toy.tiny import build_tiny_model

    hidden, layers, heads, kv, mlp, vocab = SHAPES[shape]
    model = build_tiny_model(
        tok,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=mlp,
        vocab_size=vocab,
        max_position_embeddings=4096,
        seed=seed,
    )
    return model.to(dtype)


def reward_parity(
    completions: list[str], completion_ids: list[list[int]], **kw: Any
) -> list[float]:
    """1.0 for an even sum of the generated token ids: a reward that varies within every group
    whatever a random model writes (most of a 151,936-token vocabulary decodes to nothing with
    the in-process tokenizer), so advantages, the gradient and LLDS are not zero."""
    return [float(sum(ids) % 2 == 0) for ids in completion_ids]


class _StepTimer:
    """Per optimizer step: wall time with the device synchronised on both ends."""

    def __init__(self, sync: Any) -> None:
        from transformers import TrainerCallback

        timer = self

        class _CB(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                sync()
                timer._t0 = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                sync()
                timer.steps.append(time.perf_counter() - timer._t0)

        self.steps: list[float] = []
        self._t0 = 0.0
        self.callback = _CB()


def run_arm(arm: str, shape: str, device: str, steps: int, completion: int, seed: int) -> dict:
    """One training run of ``arm``: mean step time (first step dropped), hook share, peak
    memory (GPU: max allocated; CPU: None)."""
    import torch
    from datasets import Dataset
    from lld_grpo_script import PROMPTS, build_tokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from lld_monitor import LLDMonitor, LLDSConfig

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = torch.bfloat16
    tok = build_tokenizer()
    with tempfile.TemporaryDirectory(prefix="lld-device-check-") as tmp:
        model = build_model(tok, shape, dtype, seed)
        args = GRPOConfig(
            output_dir=str(Path(tmp) / "trainer"),
            per_device_train_batch_size=8,
            num_generations=4,
            steps_per_generation=2,  # a reused batch: LLDS acts
            max_completion_length=completion,
            generation_kwargs={"min_new_tokens": completion},  # same tokens in every arm
            max_steps=steps,
            learning_rate=1e-5,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=not cuda,
            bf16=cuda,
            disable_dropout=True,
            seed=seed,
            beta=0.0,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward_parity],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
            processing_class=tok,
        )
        for cb in (PrinterCallback, ProgressCallback):  # (no per-step log lines)
            trainer.remove_callback(cb)
        monitor = None
        if arm != "none":
            monitor = LLDMonitor(
                Path(tmp) / "run",
                probe_fraction=0.0 if arm == "capture" else 0.25,
                detector=arm != "capture",
                llds=LLDSConfig(enabled=True) if arm == "llds" else None,
            )
            monitor.attach(trainer)
        timer = _StepTimer(sync)
        trainer.add_callback(timer.callback)  # after the monitor: its step-end work is timed
        if cuda:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        trainer.train()
        sync()
        total = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() if cuda else None
        share = monitor.adapter.hook_seconds / total if monitor is not None else 0.0
        if monitor is not None:
            monitor.close()
        del trainer, model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    kept = timer.steps[1:] or timer.steps
    return {"step_s": sum(kept) / len(kept), "share": share, "peak_bytes": peak}


def overhead(shape: str, device: str, a: argparse.Namespace, deadline: float) -> dict[str, Any]:
    per: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    skipped = 0
    for r in range(a.rounds):
        if r and time.monotonic() > deadline:
            skipped = a.rounds - r
            _say(f"  {shape}: time budget spent, {skipped} round(s) skipped")
            break
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:  # interleaved, order alternating
            per[arm].append(run_arm(arm, shape, device, a.steps, a.completion, a.seed))
        _say(
            f"  {shape} round {r + 1}/{a.rounds}: "
            + ", ".join(f"{arm} {per[arm][-1]['step_s'] * 1000:.1f} ms" for arm in ARMS)
        )
    step = {arm: statistics.median(x["step_s"] for x in per[arm]) for arm in ARMS}
    share = {arm: statistics.median(x["share"] for x in per[arm]) for arm in ARMS[1:]}
    out: dict[str, Any] = {"rounds": len(per["none"]), "rounds_skipped": skipped,
                           "median_step_s": step, "hook_share": share, "ratios": {}}  # fmt: skip
    for num, den, target in TARGETS:
        per_round = [x["step_s"] / y["step_s"] for x, y in zip(per[num], per[den])]
        ratio = step[num] / step[den]
        out["ratios"][f"{num}/{den}"] = {
            "ratio": ratio,
            "per_round": per_round,
            "target": target,
            "pass": ratio <= target,
        }
        _say(
            f"  {shape} {num}/{den}: {ratio:.3f} (rounds {min(per_round):.3f}-"
            f"{max(per_round):.3f}; target <= {target:.2f}) "
            + ("PASS" if ratio <= target else "over target")
        )
    _say(f"  {shape} hook share of wall time: "
         + ", ".join(f"{arm} {100 * v:.1f}%" for arm, v in share.items()))  # fmt: skip
    if device == "cuda":
        peak = {arm: max(x["peak_bytes"] for x in per[arm]) for arm in ARMS}
        extra = (peak["probe"] - peak["capture"]) / peak["capture"]
        out["peak_gib"] = {arm: v / 2**30 for arm, v in peak.items()}
        out["probe_extra_memory"] = {"share": extra, "target": PROBE_MEMORY_TARGET,
                                     "pass": extra <= PROBE_MEMORY_TARGET}  # fmt: skip
        _say(
            f"  {shape} peak GPU memory: "
            + ", ".join(f"{arm} {v / 2**30:.2f} GiB" for arm, v in peak.items())
            + f"; probe over capture {100 * extra:+.1f}% (target <= "
            f"{100 * PROBE_MEMORY_TARGET:.0f}%) "
            + ("PASS" if extra <= PROBE_MEMORY_TARGET else "FAIL")
        )
    return out


def marked_tests(device: str) -> dict[str, Any]:
    """``pytest -m gpu`` (skipped without CUDA): its exit code and summary line."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-200:]
    ok = proc.returncode in (0, 5) and (device != "cuda" or "passed" in summary)
    _say(f"CUDA-marked tests (pytest -m gpu): {summary} " + ("PASS" if ok else "FAIL"))
    return {"command": " ".join(cmd[1:]), "exit": proc.returncode, "summary": summary, "pass": ok}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if any")
    p.add_argument("--shapes", default=None, help="comma-separated of " + ", ".join(SHAPES))
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the four arms")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per run")
    p.add_argument("--completion", type=int, default=64, help="generated tokens per completion")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=420.0, help="no new round after this")
    p.add_argument("--quick", action="store_true", help="the CPU rehearsal: 1 round, 3 steps")
    p.add_argument("--no-tests", action="store_true", help="skip pytest -m gpu")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="JSON folder")
    a = p.parse_args(argv)
    import torch

    t_start = time.monotonic()
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible to torch")
    if a.quick:
        a.rounds, a.steps, a.completion = 1, 3, 8
    shapes = (a.shapes or ("qwen2.5-0.5b,qwen2.5-1.5b" if device == "cuda" else "tiny")).split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        p.error(f"unknown shape(s) {unknown}; choose from {list(SHAPES)}")
    if device == "cpu":
        torch.set_num_threads(1)  # stable CPU timings
    deadline = t_start + a.budget_s
    result: dict[str, Any] = {"environment": environment(device), "settings": {
        "shapes": shapes, "rounds": a.rounds, "steps": a.steps, "completion_tokens": a.completion,
        "seed": a.seed, "budget_s": a.budget_s}}  # fmt: skip
    _say(f"device check on {device}: " + json.dumps(result["environment"]))
    result["llds"] = llds_check(device)
    result["overhead"] = {}
    for shape in shapes:
        if time.monotonic() > deadline:
            _say(f"  {shape}: skipped (time budget spent)")
            result["overhead"][shape] = {"skipped": "time budget spent"}
            continue
        result["overhead"][shape] = overhead(shape, device, a, deadline)
    result["tests"] = {"skipped": "--no-tests"} if a.no_tests else marked_tests(device)
    result["wall_s"] = time.monotonic() - t_start
    ok = result["llds"]["pass"] and result["tests"].get("pass", True)
    result["pass"] = ok
    a.out.mkdir(parents=True, exist_ok=True)
    stamp = result["environment"]["date"][:10]
    path = a.out / f"device_check_{device}_{stamp}.json"
    path.write_text(json.dumps(result, indent=2))
    _say(f"wrote {path} ({result['wall_s']:.0f} s); " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
