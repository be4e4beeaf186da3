"""``lld-monitor demo [--steps N] [--seed S] [--llds off|on|auto] [--out DIR]``.

Trains the toy tool-using GRPO run (a tiny model, invented facts, a noisy retriever) on CPU
with the monitor attached and, by default, automatic LLDS; then prints the analysis of the run
it wrote and the command that opens the dashboard on it. A couple of minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import warnings
from dataclasses import replace
from pathlib import Path

from lld_monitor.monitor import AUTO_LLDS_ACCEPTED, AUTO_LLDS_KINDS

DEFAULT_STEPS = 320
PRESETS: tuple[str, ...] = (
    "default",
    "s1-small-32upd-lr3e-3",
    "s3-16upd-lr8e-4",
    "s4-16upd-lr8e-4-G8",
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register --steps, --seed, --llds, --out, --quiet."""
    parser.add_argument(
        "--steps",
        type=_positive_int,
        default=DEFAULT_STEPS,
        help=f"GRPO optimizer updates (default {DEFAULT_STEPS}; 8 per rollout batch by default)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the model, warm start, retriever and sampling (the invented facts are fixed)",
    )
    parser.add_argument(
        "--llds",
        choices=("off", "on", "auto"),
        default="auto",
        help="LLDS regularizer: off (vanilla GRPO), on (from the start), or auto (switched on "
        "by the monitor at the first alert of a kind in --auto-on; the default)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="run folder to write (default: runs/demo-<llds>-seed<S>, numbered if it exists)",
    )
    parser.add_argument(
        "--sft-steps",
        type=int,
        default=None,
        help="warm-start (supervised) steps before GRPO (default 400; fewer is faster but "
        "starts from a weaker policy)",
    )
    parser.add_argument(
        "--preset",
        choices=PRESETS,
        default="default",
        help="default: a run that learns and stays healthy; s1-small-32upd-lr3e-3: an aggressive "
        "setting (lr 3e-3, 32 updates per rollout batch) on which vanilla GRPO collapses (see "
        "sample_runs/README.md); s3-16upd-lr8e-4: gentler (lr 8e-4, 16 updates per rollout "
        "batch), on which vanilla GRPO first learns a little and then decays over several hundred "
        "updates (try --steps 800; see sample_runs/README.md); s4-16upd-lr8e-4-G8: s3 with 8 "
        "responses per prompt, the third attempt's best: vanilla GRPO learns for about 2000 "
        "updates while the displaced share of correct responses climbs past one half, then its "
        "reward falls in some seeds (seed 0: --steps 2400, a few minutes)",
    )
    parser.add_argument(
        "--auto-on",
        default=",".join(AUTO_LLDS_KINDS),
        metavar="KINDS",
        help="with --llds auto: comma-separated alert kinds that switch LLDS on (from "
        f"{', '.join(AUTO_LLDS_ACCEPTED)}; default {','.join(AUTO_LLDS_KINDS)}: the early "
        "phases, the paper's >50%%-displaced indicator, and collapse as the last resort)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def default_out(llds: str, seed: int, root: Path = Path("runs")) -> Path:
    """``runs/demo-<llds>-seed<S>``, or the first free ``...-2``, ``-3`` when it exists."""
    base = root / f"demo-{llds}-seed{seed}"
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def run(args: argparse.Namespace) -> int:
    """Train, analyse, print. Exit 1 when the output folder already holds a run."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # transformers 5 deprecation notices raised from inside TRL, once per step: noise for a demo
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers(\.|$)")
    from lld_monitor.toy.train import monitored_run, preset_configs

    out = Path(args.out) if args.out else default_out(args.llds, args.seed)
    if (out / "steps.jsonl").exists():
        print(
            f"lld-monitor demo: {out} already holds a run; pass another --out or delete it",
            file=sys.stderr,
        )
        return 1
    cfg = preset_configs(args.steps, args.seed)[args.preset]
    if args.sft_steps is not None:
        if args.sft_steps < 0:
            print("lld-monitor demo: --sft-steps must be >= 0", file=sys.stderr)
            return 2
        cfg = replace(cfg, sft=replace(cfg.sft, steps=args.sft_steps))
    print(
        f"lld-monitor demo: toy Search-R1 task, tiny Qwen2 policy on CPU; warm start, then "
        f"{cfg.steps} GRPO updates ({cfg.updates_per_rollout} per rollout batch of "
        f"{cfg.prompts_per_update * cfg.steps_per_generation} prompts x {cfg.num_generations}), "
        f"LLDS {args.llds}, seed {args.seed}, preset {args.preset}\n  run folder: {out}"
    )
    auto_on = tuple(k.strip() for k in args.auto_on.split(",") if k.strip())
    bad = sorted(set(auto_on) - set(AUTO_LLDS_ACCEPTED))
    if bad or not auto_on:
        print(
            f"lld-monitor demo: --auto-on takes kinds from {', '.join(AUTO_LLDS_ACCEPTED)}; got "
            f"{args.auto_on!r}",
            file=sys.stderr,
        )
        return 2
    words = ["--steps", str(args.steps), "--seed", str(args.seed), "--llds", args.llds]
    if args.llds == "auto" and auto_on != AUTO_LLDS_KINDS:
        words += ["--auto-on", ",".join(auto_on)]
    if args.preset != "default":
        words += ["--preset", args.preset]
    if args.sft_steps is not None:
        words += ["--sft-steps", str(args.sft_steps)]
    command = "lld-monitor demo " + " ".join(shlex.quote(a) for a in words)
    result = monitored_run(
        cfg,
        out,
        llds=args.llds,
        progress=not args.quiet,
        meta={"command": command},
        auto_llds_on=auto_on,
    )
    start, final = result["start_eval"], result["final_eval"]
    print(
        f"\ntrained in {result['wall_seconds']:.0f} s (warm start {result['sft_seconds']:.0f} s)\n"
        f"sampled accuracy: {start['accuracy']:.2f} after warm start -> {final['accuracy']:.2f} "
        f"after GRPO (one-hop {final.get('accuracy_1hop', float('nan')):.2f}, two-hop "
        f"{final.get('accuracy_2hop', float('nan')):.2f})\n"
        f"searches per answer: {start['searches']:.2f} -> {final['searches']:.2f}\n"
    )
    _print_interventions(out, args.llds, auto_on)
    _print_analysis(out)
    print(
        f"\nOpen the dashboard on this run:\n  {_own_command()} dashboard {shlex.quote(str(out))}"
    )
    return 0


def _print_interventions(out: Path, llds: str, auto_on: tuple[str, ...]) -> None:
    """What the monitor did to the run (LLDS switched on or off, stop), from its event log."""
    from lld_monitor import columns as C
    from lld_monitor.runlog import load_run

    events = load_run(out).events
    if events.empty or C.EVENT_TYPE not in events:
        acts = events
    else:
        acts = events[events[C.EVENT_TYPE] == "intervention"]
    for _, ev in acts.iterrows():
        step, kind, msg = ev[C.EVENT_STEP], ev[C.EVENT_KIND], ev[C.EVENT_MESSAGE]
        print(f"monitor action at step {step}: {kind} ({msg})")
    if llds == "auto" and acts.empty:
        kinds = " or ".join(auto_on)
        print(
            f"monitor action: none; automatic LLDS stayed off (it switches on at a {kinds} "
            "alert, and none was raised)"
        )


def _print_analysis(out: Path) -> None:
    """The analyzer's summary of the run folder (the same text as ``lld-monitor analyze``)."""
    from lld_monitor.analysis import analyze_run
    from lld_monitor.cli.analyze import summary_text
    from lld_monitor.importers import load_table

    df = load_table(out)
    print("analysis (lld-monitor analyze " + shlex.quote(str(out)) + "):")
    print(summary_text(df, analyze_run(df)))


def _own_command() -> str:
    """How to run this command again as it was run: ``lld-monitor`` when that is what the
    shell finds, else the path it was started by (``.venv/bin/lld-monitor`` from ``make demo``)."""
    import shutil

    argv0 = Path(sys.argv[0])
    if argv0.name != "lld-monitor":
        return "lld-monitor"
    found = shutil.which("lld-monitor")
    if found and Path(found).resolve() == argv0.resolve():
        return "lld-monitor"
    return shlex.quote(str(argv0))
