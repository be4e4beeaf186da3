"""Search the toy GRPO testbed for the paper's early phases (issue 11), and tabulate what it found.

    python scripts/spiral_sweep.py run --configs g1 g2 --seeds 0 1 2 --steps 2000 --out DIR
    python scripts/spiral_sweep.py table --out DIR        # markdown sweep table (results.jsonl)
    python scripts/spiral_sweep.py alerts DIR [DIR ...]   # analyzer alerts vs the reward's fall

``run`` trains, per configuration and seed, one warm start and then paired GRPO runs from copies
of it: ``vanilla``, ``no-neg-adv`` (advantages clamped at 0) and ``llds`` (LLDS from the first
step); each run folder gets the monitor's run log (no token samples) and one line of
``results.jsonl`` with the shape measures of :func:`spiral_shape`. ``alerts`` calls the analyzer
through its command line (``python -m lld_monitor.cli analyze RUN --json``), so that the table
can be regenerated against whatever detector the checkout holds; it prints that commit.

The shape the issue asks for ("the early phases"): a stretch of >= 100 updates ending where the
reward starts to fall, over which the reward rises or holds, ``logp_correct`` stays flat or
declines, and the displaced share of correct responses climbs toward and past 0.5; then the
reward falls (its smoothed value drops below half of its running peak).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("vanilla", "no-neg-adv", "llds")
#: ``auto``: the monitor's automatic LLDS with the shipped defaults (not a column of the tables)
RUN_VARIANTS = (*VARIANTS, "auto")
LLDS_MODE = {"llds": "on", "auto": "auto"}  # variant -> monitored_run(llds=...); else "off"
# the fall from the peak: the one definition is the demo's (lld_monitor.toy.compare)
from lld_monitor.toy.compare import FALL_SHARE as FALL_FRAC  # noqa: E402  (below this share ...)
from lld_monitor.toy.compare import MIN_PEAK  # noqa: E402  (... of a running peak of at least)
from lld_monitor.toy.compare import PEAK_WINDOW as SMOOTH  # noqa: E402  (trailing window, updates)

ONSET_FRAC = 0.9  # the fall starts at the last step the smoothed reward was >= 90% of its peak
MIN_STRETCH = 100  # updates of the early phases before the fall
HOLD_TOL = 0.03  # "rises or holds": the smoothed reward ends the stretch >= its start - this
FLAT_TOL = 0.02  # "flat or declines": logp_correct (nats/token) ends <= its start + this


def candidates(steps: int, seed: int) -> dict[str, Any]:
    """The configurations of the sweep (gentler than s1; the theory's axes, one or two at once)."""
    from lld_monitor.toy.rollout import RolloutConfig
    from lld_monitor.toy.sft import SFTConfig
    from lld_monitor.toy.task import ToyTaskConfig
    from lld_monitor.toy.train import preset_configs

    p = preset_configs(steps, seed)
    s1 = p["s1-small-32upd-lr3e-3"]
    g1 = replace(s1, learning_rate=1e-3)
    return {
        **p,
        "g1-32upd-lr1e-3": g1,
        "g2-32upd-lr5e-4": replace(s1, learning_rate=5e-4),
        "g3-32upd-lr1e-3-kl1e-3": replace(g1, beta=1e-3),
        "g4-64upd-lr5e-4": replace(s1, learning_rate=5e-4, steps_per_generation=16),
        "g5-32upd-lr1e-3-G8": replace(g1, num_generations=8),
        "g6-32upd-lr1e-3-think2-vocab300-h96": replace(
            g1,
            hidden_size=96,
            extra_vocab=300,
            sft=SFTConfig(think_words=2),
            rollout=RolloutConfig(max_action_tokens=12, max_completion_tokens=112),
        ),
        "g7-32upd-lr1e-3-2word-2hop80": replace(
            g1, task=ToyTaskConfig(n_values=12, answer_words=2, two_hop_frac=0.8)
        ),
        "g8-32upd-lr2e-3": replace(s1, learning_rate=2e-3),
        "d1-8upd-lr2e-4": p["default"],
        "d2-32upd-lr2e-4": replace(s1, learning_rate=2e-4),
        "d3-16upd-lr4e-4": replace(s1, learning_rate=4e-4, num_iterations=2),
        "d5-16upd-lr6e-4": replace(s1, learning_rate=6e-4, num_iterations=2),
        # the s3 preset: replace(s1, learning_rate=8e-4, num_iterations=2)
        "d6-16upd-lr8e-4": p["s3-16upd-lr8e-4"],
        # third attempt: d6 plus one axis each. G=8 keeps the 16 prompts per rollout batch
        # (prompts_per_update 2 x steps_per_generation 8) and the 16 updates per rollout batch,
        # so each rollout batch holds 16 x 8 = 128 responses instead of 80 (mini-batches of 16)
        "d7-16upd-lr8e-4-G8": p["s4-16upd-lr8e-4-G8"],  # = replace(s3, num_generations=8)
        "d8-16upd-lr8e-4-kl1e-3": replace(p["s3-16upd-lr8e-4"], beta=1e-3),
        "d4-16upd-lr4e-4-G8": replace(s1, learning_rate=4e-4, num_iterations=2, num_generations=8),
        "g9-32upd-lr1.5e-3": replace(s1, learning_rate=1.5e-3),
    }


def spiral_shape(df, updates_per_rollout: int = 32) -> dict[str, Any]:
    """Shape measures of one run's step table (see the module docstring for the definitions)."""
    import numpy as np

    from lld_monitor import columns as C

    df = df.sort_values(C.STEP).reset_index(drop=True)
    steps = df[C.STEP].to_numpy()
    w = min(SMOOTH, len(df))
    sm = df[C.REWARD_MEAN].rolling(w, min_periods=w).mean().to_numpy()  # NaN before a full window
    disp = (
        df[C.FRAC_CORRECT_DISPLACED].rolling(SMOOTH, min_periods=1).mean().to_numpy()
        if C.FRAC_CORRECT_DISPLACED in df
        else np.full(len(df), np.nan)
    )
    disp = np.asarray(disp, dtype=float)
    lpc = df[C.LOGP_CORRECT].rolling(SMOOTH, min_periods=1).mean().to_numpy()
    first = float(sm[w - 1])  # the first full window
    out: dict[str, Any] = {
        "reward_first": first,
        "reward_peak": float(np.nanmax(sm)),
        "reward_peak_step": int(steps[int(np.nanargmax(sm))]),
        "reward_final": float(sm[-1]),
        "fall_step": None,
        "onset_step": None,
        "shape": False,
    }
    run_peak = np.maximum.accumulate(np.nan_to_num(sm, nan=0.0))
    fallen = np.where((sm < FALL_FRAC * run_peak) & (run_peak >= MIN_PEAK))[0]
    crossed = np.where(disp >= 0.5)[0]
    out["disp_cross_step"] = int(steps[crossed[0]]) if len(crossed) else None
    out["disp_first"] = _f(disp[w - 1])
    if not len(fallen):
        out["disp_final"] = _f(disp[-1])
        out["logp_correct_first_final"] = [_f(lpc[w - 1]), _f(lpc[-1])]
        return out
    f = int(fallen[0])
    peak_before = run_peak[f]
    onset = int(np.where(sm[: f + 1] >= ONSET_FRAC * peak_before)[0][-1])

    def dmax(a: int) -> float:
        seg = disp[a : f + 1]
        return float(np.nanmax(seg)) if np.isfinite(seg).any() else float("nan")

    def early_phases(a: int) -> bool:
        return bool(
            steps[onset] - steps[a] >= MIN_STRETCH
            and sm[onset] >= sm[a] - HOLD_TOL  # reward rose or held
            and lpc[onset] <= lpc[a] + FLAT_TOL  # logp_correct flat or declining
            and disp[a] < 0.5  # displaced share climbs from below 0.5 ...
            and dmax(a) >= 0.5  # ... to 0.5 or more before the fall
        )

    # the longest stretch ending at the onset (from the first full window of the smoothed reward)
    # with the early phases; failing that, the longest over which the reward rose or held
    found = [a for a in range(w - 1, onset + 1) if early_phases(a)]
    held = [a for a in range(w - 1, onset + 1) if sm[onset] >= sm[a] - HOLD_TOL]
    start = found[0] if found else (held[0] if held else onset)
    length = int(steps[onset] - steps[start])
    lp0, lp1 = _f(lpc[start]), _f(lpc[onset])
    d0, d_on, d_f = _f(disp[start]), _f(disp[onset]), _f(disp[f])
    d_max = _f(dmax(start))
    out.update(
        fall_step=int(steps[f]),
        onset_step=int(steps[onset]),
        stretch_start=int(steps[start]),
        stretch_len=length,
        reward_stretch=[_f(sm[start]), _f(sm[onset])],
        logp_correct_stretch=[lp0, lp1],
        disp_stretch=[d0, d_on, d_f],
        disp_max_to_fall=d_max,
        recovered=bool(sm[-1] >= ONSET_FRAC * peak_before),
    )
    out["shape"] = bool(found)
    return out


def _f(x: Any) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if not math.isfinite(x) else round(x, 3)


def run_sweep(args: argparse.Namespace) -> None:
    from lld_monitor.runlog import load_run
    from lld_monitor.toy.train import build_setup, monitored_run

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    for cname in args.configs:
        for seed in args.seeds:
            cands = candidates(args.steps, seed)
            if cname not in cands:
                raise SystemExit(f"unknown configuration {cname!r}; known: {sorted(cands)}")
            cfg = cands[cname]
            t0 = time.time()
            base = build_setup(cfg, progress=False)
            sft_s = round(time.time() - t0, 1)
            for variant in args.variants:
                name = f"{cname}-seed{seed}-{variant}"
                run_dir = out / name
                if (run_dir / "steps.jsonl").exists():
                    print(f"{name}: exists, skipped", flush=True)
                    continue
                vcfg = replace(cfg, zero_negative_advantages=(variant == "no-neg-adv"))
                setup = copy.copy(base)
                setup.model = copy.deepcopy(base.model)
                setup.retriever = copy.deepcopy(base.retriever)  # paired tool feedback
                cmd = (
                    f"python scripts/spiral_sweep.py run --configs {cname} --seeds {seed} "
                    f"--variants {variant} --steps {args.steps} --out {args.out}"
                )
                t1 = time.time()
                res = monitored_run(
                    vcfg,
                    run_dir,
                    llds=LLDS_MODE.get(variant, "off"),
                    progress=False,
                    token_samples_per_step=0,  # no token samples: the folders stay small
                    response_samples_per_step=0,
                    meta={"command": cmd, "spiral_config": cname, "variant": variant},
                    setup=setup,
                )
                shape = spiral_shape(load_run(run_dir).steps, cfg.updates_per_rollout)
                row = {
                    "name": name,
                    "config": cname,
                    "seed": seed,
                    "variant": variant,
                    "steps": args.steps,
                    "command": cmd,
                    "warm_start_seconds": sft_s,
                    "grpo_seconds": round(time.time() - t1, 1),
                    "start_eval": res["start_eval"],
                    "final_eval": res["final_eval"],
                    **shape,
                }
                with results.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(
                    f"{name}: {row['grpo_seconds']} s acc {res['start_eval']['accuracy']:.2f}"
                    f"->{res['final_eval']['accuracy']:.2f} reward {shape['reward_first']:.2f}->"
                    f"{shape['reward_peak']:.2f}->{shape['reward_final']:.2f} fall "
                    f"{shape['fall_step']} shape {shape['shape']}",
                    flush=True,
                )


def load_results(out: Path) -> list[dict[str, Any]]:
    """``results.jsonl`` of a sweep folder, the last line per run (reruns replace)."""
    rows: dict[str, dict[str, Any]] = {}
    for line in (out / "results.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows[r["name"]] = r
    return list(rows.values())


def _n(x: Any, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def describe(r: dict[str, Any]) -> str:
    """One run's outcome in a few words."""
    acc = f"acc {_n(r['start_eval']['accuracy'])}->{_n(r['final_eval']['accuracy'])}"
    rew = f"{_n(r['reward_first'])}->{_n(r['reward_peak'])}->{_n(r['reward_final'])}"
    if r["fall_step"] is None:
        return f"{rew}, {acc}, no fall"
    lp = r.get("logp_correct_stretch") or [None, None]
    d = r.get("disp_stretch") or [None, None, None]
    return (
        f"{rew}, {acc}, fell at {r['fall_step']} (onset {r['onset_step']}, "
        f"{r['stretch_len']}-update stretch; logp_c {_n(lp[0])}->{_n(lp[1])}; "
        f"displaced {_n(d[0])}->{_n(d[1])}, max {_n(r.get('disp_max_to_fall'))})"
        + (", recovered" if r.get("recovered") else "")
        + (" **shape**" if r["shape"] else "")
    )


def table(out: Path) -> str:
    """Markdown: one row per configuration and seed, the three variants side by side."""
    from lld_monitor.runlog import load_run

    rows = load_results(out)
    for r in rows:
        if (out / r["name"] / "steps.jsonl").exists():  # the current definitions, not the stored
            r.update(spiral_shape(load_run(out / r["name"]).steps))
    by: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["config"], r["seed"]), {})[r["variant"]] = r
    lines = [
        "| configuration | seed | updates | vanilla: reward first -> peak -> final (96-update "
        "mean), eval acc, fall; logp_correct and displaced share over the stretch before it "
        "| no-neg-adv ablation | LLDS from the start |",
        "|---|---|---|---|---|---|",
    ]
    for (cname, seed), v in sorted(by.items()):
        steps = next(iter(v.values()))["steps"]
        cells = [describe(v[k]) if k in v else "(not run)" for k in VARIANTS]
        lines.append(f"| {cname} | {seed} | {steps} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detector_commit() -> str:
    """HEAD of the checkout whose analyzer is used, and the last commit that changed the
    analyzer's code (``lld_monitor/`` less the toy testbed); ``+dirty`` if it has changes."""
    detector = [
        "--",
        "lld_monitor/analysis",
        "lld_monitor/cli/analyze.py",
        "lld_monitor/cli/__init__.py",
    ]

    def git(*a: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *a], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        last = git("log", "-1", "--format=%h", *detector)
        dirty = git("status", "--porcelain", *detector)
        return f"HEAD {head}, analyzer last changed in {last}" + (" +dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def alerts_table(run_dirs: list[Path]) -> str:
    """Per run: each analyzer alert (kind@step) and its distance to the reward's fall."""
    from lld_monitor.runlog import load_run

    lines = [
        f"Analyzer: {detector_commit()} (`python -m lld_monitor.cli analyze RUN "
        f"--json`); fall = first step the {SMOOTH}-update mean reward is below "
        f"{FALL_FRAC:.0%} of its running peak; onset = last step before it at >= "
        f"{ONSET_FRAC:.0%} of that peak.",
        "",
        "| run | reward onset / fall | analyzer collapse step | alerts: kind@step (steps relative "
        "to the fall) |",
        "|---|---|---|---|",
    ]
    for d in run_dirs:
        shape = spiral_shape(load_run(d).steps)
        proc = subprocess.run(
            [sys.executable, "-m", "lld_monitor.cli", "analyze", str(d), "--json"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        if proc.returncode not in (0, 1, 2) or not proc.stdout.strip():
            lines.append(f"| {d.name} | - | - | analyzer failed: {proc.stderr.strip()[-200:]} |")
            continue
        an = json.loads(proc.stdout)
        fall = shape["fall_step"]
        parts = []
        for a in an.get("alerts", []):
            rel = "" if fall is None else f" ({a['step'] - fall:+d})"
            parts.append(f"{a['kind']}@{a['step']}{rel}")
        lines.append(
            f"| {d.name} | {shape['onset_step'] or '-'} / {fall or '-'} "
            f"| {an.get('collapse_step') or '-'} | {', '.join(parts) or 'none'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train configurations x seeds x variants")
    r.add_argument("--configs", nargs="+", required=True)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--variants", nargs="+", choices=RUN_VARIANTS, default=list(VARIANTS))
    r.add_argument("--steps", type=int, default=2000)
    r.add_argument("--out", default=str(ROOT / "sample_runs" / "spiral2"))
    t = sub.add_parser("table", help="the markdown sweep table of a sweep folder")
    t.add_argument("--out", default=str(ROOT / "sample_runs" / "spiral2"))
    a = sub.add_parser("alerts", help="analyzer alerts relative to the reward's fall")
    a.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        run_sweep(args)
    elif args.cmd == "table":
        print(table(Path(args.out)))
    else:
        missing = [str(d) for d in args.runs if not (d / "steps.jsonl").exists()]
        if missing:
            raise SystemExit(f"not run folders (no steps.jsonl): {missing}")
        print(alerts_table(args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
