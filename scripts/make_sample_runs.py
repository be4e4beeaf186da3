"""Regenerate ``sample_runs/``: real toy GRPO runs (LLDS off / on / auto, several seeds) and
clearly labelled SIMULATED runs following the paper's Qwen2.5-3B-Instruct timeline.

    python scripts/make_sample_runs.py                 # everything (about 10 min on 2 CPU cores)
    python scripts/make_sample_runs.py --table-only    # rebuild the README table from the runs
    python scripts/make_sample_runs.py --auto-check    # automatic LLDS vs off, 2 presets x 3 seeds
                                                       # (sample_runs/auto/, about 8 min)

Each real run folder holds the monitor's run log plus ``toy_summary.json``; ``manifest.json``
records, per run, the exact command, seed, versions and wall time. The table in
``sample_runs/README.md`` between the ``table:start`` / ``table:end`` markers is rewritten;
the hand-written text around it is kept.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROOT = Path(__file__).resolve().parent.parent
MARK_START, MARK_END = "<!-- table:start -->", "<!-- table:end -->"
SPIRAL_START, SPIRAL_END = "<!-- spiral:start -->", "<!-- spiral:end -->"
PROV_START, PROV_END = "<!-- provenance:start -->", "<!-- provenance:end -->"
AUTO_START, AUTO_END = "<!-- auto:start -->", "<!-- auto:end -->"
DEMO_START, DEMO_END = "<!-- demo:start -->", "<!-- demo:end -->"
#: The automatic-LLDS check of issue 10: preset -> GRPO updates (the demo's defaults otherwise).
AUTO_PRESETS = {"s1-small-32upd-lr3e-3": 400, "default": 400}
#: The paper's Qwen2.5-3B-Instruct timeline (PAPER.md): stagnation to ~60, decay to ~120,
#: collapse by ~200. The simulated runs use it; they are generated, never trained.
SIM_TIMELINE = {"stagnation_end": 60, "collapse_start": 120, "collapse_step": 190}


def versions() -> dict[str, str]:
    """Versions of the software that made the runs."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("lld_monitor", "torch", "transformers", "trl", "accelerate"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    import torch

    # float results (and so the trajectories) can differ between CPU instruction sets
    out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def make_real_runs(
    out: Path, seeds: list[int], modes: list[str], steps: int, progress: bool
) -> list[dict[str, Any]]:
    """One warm start per seed, then one paired GRPO run per LLDS mode from the same start."""
    from lld_monitor.toy.train import ToyGRPOConfig, build_setup, monitored_run

    entries = []
    for seed in seeds:
        cfg = ToyGRPOConfig(steps=steps, seed=seed)
        t0 = time.time()
        base = build_setup(cfg, progress=progress)
        sft_s = time.time() - t0
        for mode in modes:
            name = f"toy-llds-{mode}-seed{seed}"
            run_dir = out / "real" / name
            if run_dir.exists():
                raise SystemExit(f"{run_dir} exists; delete sample_runs/real first")
            setup = copy.copy(base)
            setup.model = copy.deepcopy(base.model)
            setup.retriever = copy.deepcopy(base.retriever)  # same tool feedback stream: paired
            cmd = (
                f"python scripts/make_sample_runs.py --skip-simulated --seeds {seed} "
                f"--modes {mode} --steps {steps}"
            )
            t1 = time.time()
            res = monitored_run(
                cfg,
                run_dir,
                llds=mode,
                progress=progress,
                token_samples_per_step=2,
                meta={"command": cmd, "sample_run": name},
                setup=setup,
            )
            entries.append(
                {
                    "name": name,
                    "path": f"real/{name}",
                    "simulated": False,
                    "llds_mode": mode,
                    "seed": seed,
                    "steps": steps,
                    "command": cmd,
                    "warm_start_seconds": round(sft_s, 1),
                    "grpo_seconds": round(time.time() - t1, 1),
                    "start_eval": res["start_eval"],
                    "final_eval": res["final_eval"],
                }
            )
            print(f"{name}: {entries[-1]['grpo_seconds']} s, final {res['final_eval']}")
    return entries


def make_simulated_runs(out: Path, seeds: list[int]) -> list[dict[str, Any]]:
    """SIMULATED runs from ``lld_monitor.testing``: a collapse on the paper's timeline + healthy."""
    from lld_monitor.testing import make_run, write_run

    entries = []
    for seed in seeds:
        for kind, n_steps, timeline in (
            ("collapse", 260, SIM_TIMELINE),
            ("healthy", 260, {}),
        ):
            run = make_run(kind, n_steps, seed=seed, **timeline)
            name = f"SIMULATED-{kind}-seed{seed}"
            cmd = (
                f'python -c "from lld_monitor.testing import make_run, write_run; '
                f"write_run(make_run({kind!r}, {n_steps}, seed={seed}"
                + "".join(f", {k}={v}" for k, v in timeline.items())
                + f"), 'sample_runs/simulated/{name}')\""
            )
            if (out / "simulated" / name).exists():
                raise SystemExit(f"{out / 'simulated' / name} exists: delete, or --skip-simulated")
            write_run(run, out / "simulated" / name, meta={"command": cmd})
            entries.append(
                {
                    "name": name,
                    "path": f"simulated/{name}",
                    "simulated": True,
                    "kind": kind,
                    "seed": seed,
                    "steps": n_steps,
                    "command": cmd,
                    "labels": run.labels,
                }
            )
    return entries


def spiral_configs(steps: int) -> dict[str, Any]:
    """The first bounded spiral attempt: the aggressive presets of ``lld_monitor.toy.train`` (the
    second attempt, ``s3``, is made by ``scripts/spiral_sweep.py``)."""
    from lld_monitor.toy.train import preset_configs

    first = ("s1-small-32upd-lr3e-3", "s2-big-vocab-think-2word")
    return {k: v for k, v in preset_configs(steps).items() if k in first}


def make_spiral_runs(
    out: Path, steps: int, names: list[str] | None, seeds: list[int], progress: bool
) -> list:
    """Each spiral configuration as vanilla GRPO, with negative-advantage gradients zeroed
    (the ablation that tells LLD from generic instability), and with LLDS from the start."""
    from dataclasses import replace

    from lld_monitor.toy.train import build_setup, monitored_run

    entries = []
    for cname, cfg0, seed in [(n, c, sd) for n, c in spiral_configs(steps).items() for sd in seeds]:
        if names and cname not in names:
            continue
        cfg = replace(cfg0, seed=seed)
        t0 = time.time()
        base = build_setup(cfg, progress=progress)
        sft_s = time.time() - t0
        print(f"{cname}: warm start {sft_s:.0f} s, start eval {base.start_eval}", flush=True)
        for variant, vcfg, mode in (
            ("vanilla", cfg, "off"),
            ("no-neg-adv", replace(cfg, zero_negative_advantages=True), "off"),
            ("llds", cfg, "on"),
        ):
            name = f"{cname}-seed{seed}-{variant}"
            setup = copy.copy(base)
            setup.model = copy.deepcopy(base.model)
            setup.retriever = copy.deepcopy(base.retriever)  # same tool feedback stream: paired
            cmd = (
                f"python scripts/make_sample_runs.py --spiral {cname} --spiral-steps {steps} "
                f"--seeds {seed}"
            )
            t1 = time.time()
            res = monitored_run(
                vcfg,
                out / "spiral" / name,
                llds=mode,
                progress=progress,
                token_samples_per_step=0,
                meta={"command": cmd, "spiral_config": cname, "variant": variant},
                setup=setup,
            )
            entries.append(
                {
                    "name": name,
                    "path": f"spiral/{name}",
                    "simulated": False,
                    "spiral": cname,
                    "variant": variant,
                    "llds_mode": mode,
                    "seed": cfg.seed,
                    "steps": steps,
                    "command": cmd,
                    "warm_start_seconds": round(sft_s, 1),
                    "grpo_seconds": round(time.time() - t1, 1),
                    "start_eval": res["start_eval"],
                    "final_eval": res["final_eval"],
                }
            )
            print(f"{name}: {entries[-1]['grpo_seconds']} s, final {res['final_eval']}", flush=True)
    return entries


def make_auto_runs(
    out: Path, seeds: list[int], presets: list[str], progress: bool
) -> list[dict[str, Any]]:
    """``lld-monitor demo --preset P --steps N --llds off|auto --seed S`` with the shipped
    defaults (triggers, lambda), run by the same code path, token samples off to stay small."""
    from lld_monitor.monitor import AUTO_LLDS_KINDS
    from lld_monitor.toy.train import monitored_run, preset_configs

    entries = []
    for preset in presets:
        steps = AUTO_PRESETS[preset]
        for seed in seeds:
            cfg = preset_configs(steps, seed)[preset]
            for mode in ("off", "auto"):
                name = f"{preset}-seed{seed}-{mode}"
                run_dir = out / "auto" / name
                if run_dir.exists():
                    raise SystemExit(f"{run_dir} exists; delete sample_runs/auto first")
                demo = (
                    f"lld-monitor demo --preset {preset} --steps {steps} --llds {mode} "
                    f"--seed {seed}"
                )
                cmd = (
                    f"python scripts/make_sample_runs.py --auto-check --auto-presets {preset} "
                    f"--seeds {seed}"
                )
                t1 = time.time()
                res = monitored_run(
                    cfg,
                    run_dir,
                    llds=mode,
                    progress=progress,
                    token_samples_per_step=0,
                    meta={"command": cmd, "demo_command": demo, "auto_check": name},
                )
                # token samples are not needed for this table: dropped to keep the folder small
                shutil.rmtree(run_dir / "tokens", ignore_errors=True)
                entries.append(
                    {
                        "name": name,
                        "path": f"auto/{name}",
                        "simulated": False,
                        "preset": preset,
                        "llds_mode": mode,
                        "seed": seed,
                        "steps": steps,
                        "auto_llds_on": list(AUTO_LLDS_KINDS) if mode == "auto" else [],
                        "command": cmd,
                        "demo_command": demo,
                        "warm_start_seconds": round(res["sft_seconds"], 1),
                        "grpo_seconds": round(time.time() - t1 - res["sft_seconds"], 1),
                        "start_eval": res["start_eval"],
                        "final_eval": res["final_eval"],
                    }
                )
                print(f"{name}: final {res['final_eval']}", flush=True)
    return entries


def _first_alerts(run_dir: Path) -> dict[str, int]:
    """Step of the first online alert of each kind (``toy.compare.first_alerts``)."""
    from lld_monitor.runlog import load_run
    from lld_monitor.toy.compare import first_alerts

    return {kind: step for kind, step, _ in first_alerts(load_run(run_dir).events)}


def _llds_switch(run_dir: Path) -> tuple[int, str] | None:
    """(step, alert kind) at which automatic LLDS switched on (``toy.compare.llds_switch``)."""
    from lld_monitor.runlog import load_run
    from lld_monitor.toy.compare import llds_switch

    step, kind = llds_switch(load_run(run_dir).events)
    return None if step is None else (step, kind)


def auto_rows(out: Path, entries: list[dict[str, Any]]) -> list[str]:
    """Per preset and seed: off vs auto final accuracy, when and on which alert LLDS switched on,
    and the first online alert of each kind in both runs; then the target verdict."""
    by = {(e["preset"], e["seed"], e["llds_mode"]): e for e in entries}
    rows = [
        "| preset | seed | steps | eval acc start | final acc, LLDS off | final acc, LLDS auto "
        "| auto: LLDS on at step (alert) | first alerts, off run | first alerts, auto run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    verdict: dict[str, list[str]] = {}
    for preset in AUTO_PRESETS:
        for seed in sorted({k[1] for k in by if k[0] == preset}):
            off, auto = by.get((preset, seed, "off")), by.get((preset, seed, "auto"))
            if off is None or auto is None:
                continue

            def alerts(e: dict[str, Any]) -> str:
                first = _first_alerts(out / e["path"])
                return ", ".join(f"{k} {s}" for k, s in sorted(first.items(), key=lambda x: x[1]))

            sw = _llds_switch(out / auto["path"])
            a_off, a_auto = off["final_eval"]["accuracy"], auto["final_eval"]["accuracy"]
            rows.append(
                f"| {preset} | {seed} | {auto['steps']} | {_fmt(auto['start_eval']['accuracy'])} "
                f"| {_fmt(a_off)} | {_fmt(a_auto)} "
                f"| {'off throughout' if sw is None else f'{sw[0]} ({sw[1]})'} "
                f"| {alerts(off) or 'none'} | {alerts(auto) or 'none'} |"
            )
            if preset == "s1-small-32upd-lr3e-3":
                if a_off >= 0.05:  # nothing to save: the criterion does not apply
                    said = f"n/a (off ended at {_fmt(a_off)})"
                else:
                    said = "yes" if a_auto >= 0.10 else "no"
                verdict.setdefault(preset, []).append(f"seed {seed}: {said}")
            else:
                verdict.setdefault(preset, []).append(
                    f"seed {seed}: {'switched on' if sw else 'stayed off'}, "
                    f"{_fmt(a_auto - a_off, 2)} accuracy vs off"
                )
    rows.append("")
    s1_all = verdict.get("s1-small-32upd-lr3e-3", [])
    target = ("seed 0:", "seed 1:", "seed 2:")  # the seeds; others are held out
    s1 = [v for v in s1_all if v.startswith(target)]
    held = [v for v in s1_all if not v.startswith(target)]
    n_ok = sum(v.endswith("yes") for v in s1)
    if s1:
        rows.append(
            f"Target (s1: auto >= 0.10 where off < 0.05, in at least 2 of 3 seeds): "
            f"{'MET' if n_ok >= 2 else 'NOT MET'} ({n_ok} of {len(s1)}: {'; '.join(s1)})."
        )
    if held:
        n_held = sum(v.endswith("yes") for v in held)
        n_apply = sum(not v.split(": ", 1)[1].startswith("n/a") for v in held)
        rows.append(
            f"Held-out s1 seeds (same criterion, not part of the target): {n_held} of the "
            f"{n_apply} where LLDS off ended below 0.05 ({'; '.join(held)})."
        )
    if verdict.get("default"):
        rows.append(f"Default preset (healthy): {'; '.join(verdict['default'])}.")
    return rows


def demo_rows(out: Path, entries: list[dict[str, Any]]) -> list[str]:
    """The demo preset's seeds as the demo compares them (``lld_monitor.toy.compare``), and the
    seed the demo's rule picks: the first whose LLDS-off run collapsed."""
    from lld_monitor.cli.demo import DEMO_PRESET, DEMO_SEED_CANDIDATES
    from lld_monitor.toy.compare import COLLAPSED_ACCURACY, read_arm

    by = {(e["seed"], e["llds_mode"]): e for e in entries if e["preset"] == DEMO_PRESET}
    rows = [
        "| seed | LLDS off: reward fell at | first alert, off run | automatic LLDS on at "
        "| final acc off -> auto | off run collapsed (< 0.05) |",
        "|---|---|---|---|---|---|",
    ]
    picked = None
    for seed in DEMO_SEED_CANDIDATES:
        if (seed, "off") not in by or (seed, "auto") not in by:
            rows.append(f"| {seed} | (not run) | | | | |")
            continue
        off = read_arm(out / by[(seed, "off")]["path"])
        auto = read_arm(out / by[(seed, "auto")]["path"])
        first = f"{off.alerts[0][0]} {off.alerts[0][1]}" if off.alerts else "none"
        collapsed = off.final_accuracy < COLLAPSED_ACCURACY
        if collapsed and picked is None:
            picked = seed
        rows.append(
            f"| {seed} | {off.fell_at if off.fell_at is not None else 'did not fall'} | {first} "
            f"| {auto.llds_on_at if auto.llds_on_at is not None else 'never'} "
            f"| {off.final_accuracy:.2f} -> {auto.final_accuracy:.2f} "
            f"| {'yes' if collapsed else 'no'} |"
        )
    rows += [
        "",
        f"The demo's seed by this rule: **{picked}** (`DEMO_SEED` in lld_monitor/cli/demo.py).",
    ]
    return rows


def spiral_rows(out: Path, entries: list[dict[str, Any]]) -> list[str]:
    """Per spiral run: reward, entropy, grad norm and LLD signals, early vs late."""
    from lld_monitor import columns as C
    from lld_monitor.analysis import analyze_run
    from lld_monitor.runlog import load_run

    rows = [
        "| run | reward first -> peak -> final (32-step mean) | eval acc start -> final "
        "| searches start -> final | entropy first -> last quarter | grad norm max "
        "| correct displaced (first / last quarter) | delta logp correct (first / last quarter) "
        "| analyzer: alerts; collapse |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        if not (out / e["path"]).exists():
            # folder dropped to keep sample_runs/ small: its row was computed when it existed
            rows.append(e.get("row", f"| {e['name']} | (folder not kept; rerun its command) |"))
            continue
        df = load_run(out / e["path"]).steps
        r = df[C.REWARD_MEAN].rolling(32, min_periods=1).mean()
        q = max(1, len(df) // 4)
        head, tail = df.iloc[:q], df.iloc[-q:]
        an = analyze_run(out / e["path"])
        kinds: dict[str, int] = {}
        for a in an.alerts:
            kinds[a.kind] = kinds.get(a.kind, 0) + 1
        alerts = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in kinds.items()) or "none"
        collapse = "none" if an.collapse_step is None else f"step {an.collapse_step}"
        s, f = e["start_eval"], e["final_eval"]
        e["row"] = (
            f"| {e['name']} | {_fmt(r.iloc[0])} -> {_fmt(r.max())} -> {_fmt(r.iloc[-1])} "
            f"| {_fmt(s['accuracy'])} -> {_fmt(f['accuracy'])} "
            f"| {_fmt(s['searches'])} -> {_fmt(f['searches'])} "
            f"| {_fmt(head[C.ENTROPY].mean())} -> {_fmt(tail[C.ENTROPY].mean())} "
            f"| {_fmt(df[C.GRAD_NORM_MAX].max())} "
            f"| {_fmt(head[C.FRAC_CORRECT_DISPLACED].mean())} / "
            f"{_fmt(tail[C.FRAC_CORRECT_DISPLACED].mean())} "
            f"| {_fmt(head[C.DELTA_CORRECT].mean(), 3)} / {_fmt(tail[C.DELTA_CORRECT].mean(), 3)} "
            f"| {alerts}; {collapse} |"
        )
        rows.append(e["row"])
    return rows


def provenance_rows(manifest: dict[str, Any]) -> list[str]:
    """Per run: the exact command, seed and wall time; then the versions and the machine."""
    rows = [
        "| run | seed | warm start (s) | GRPO + eval (s) | command |",
        "|---|---|---|---|---|",
    ]
    for e in manifest.get("runs", []) + manifest.get("spiral", []) + manifest.get("auto", []):
        rows.append(
            f"| {e['name']} | {e['seed']} | {e.get('warm_start_seconds', '-')} "
            f"| {e.get('grpo_seconds', '-')} | `{e['command']}` |"
        )
    vers = ", ".join(f"{k} {v}" for k, v in manifest.get("versions", {}).items())
    rows += [
        "",
        f"Versions: {vers}. Machine: {manifest.get('machine', '?')} (shared with other jobs, "
        "so wall times are upper bounds). Warm-start time is shared by the runs of one seed "
        "(one warm start, then paired GRPO runs from copies of it).",
    ]
    return rows


def _fmt(x: Any, nd: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{nd}f}"


def table_rows(out: Path, entries: list[dict[str, Any]]) -> list[str]:
    """One markdown row per run: reward, searches, LLD signals, LLDS switch, analyzer verdict."""
    from lld_monitor import columns as C
    from lld_monitor.analysis import analyze_run
    from lld_monitor.runlog import load_run

    rows = [
        "| run | steps | reward: first -> peak -> final (8-step mean) | eval acc start -> final "
        "| searches/answer start -> final | correct displaced (share, mean; last quarter) "
        "| delta logp correct (mean; last quarter) | LLDS on at "
        "| analyzer: phases; alerts; collapse |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        run = load_run(out / e["path"])
        df = run.steps
        r = df[C.REWARD_MEAN].rolling(8, min_periods=1).mean()
        tail = df.iloc[len(df) * 3 // 4 :]

        def col_mean(frame, col):
            return float(frame[col].mean()) if col in frame else float("nan")

        llds_on = "-"
        if C.LLDS_ENABLED in df and (df[C.LLDS_ENABLED] == 1).any():
            llds_on = str(int(df.loc[df[C.LLDS_ENABLED] == 1, C.STEP].iloc[0]))
        an = analyze_run(out / e["path"])
        phases = ", ".join(f"{p.phase} {p.start_step}-{p.end_step}" for p in an.phases) or "-"
        kinds: dict[str, int] = {}
        for a in an.alerts:
            kinds[a.kind] = kinds.get(a.kind, 0) + 1
        alerts = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in kinds.items()) or "none"
        collapse = "none" if an.collapse_step is None else f"step {an.collapse_step}"
        if e["simulated"]:
            acc = searches = "(simulated)"
            label = f"**SIMULATED** {e['name']}"
        else:
            s, f = e["start_eval"], e["final_eval"]
            acc = f"{_fmt(s['accuracy'])} -> {_fmt(f['accuracy'])}"
            searches = f"{_fmt(s['searches'])} -> {_fmt(f['searches'])}"
            label = e["name"]
        rows.append(
            f"| {label} | {len(df)} | {_fmt(r.iloc[0])} -> {_fmt(r.max())} -> {_fmt(r.iloc[-1])} "
            f"| {acc} | {searches} | {_fmt(col_mean(tail, C.FRAC_CORRECT_DISPLACED))} "
            f"| {_fmt(col_mean(tail, C.DELTA_CORRECT), 3)} | {llds_on} "
            f"| {phases}; {alerts}; {collapse} |"
        )
    return rows


def write_block(out: Path, rows: list[str], start: str, end: str) -> None:
    """Rewrite the README block between the markers (append the markers if absent)."""
    readme = out / "README.md"
    text = readme.read_text() if readme.exists() else "# Sample runs\n\n"
    block = "\n".join([start, *rows, end])
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    readme.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "sample_runs"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="+", default=["off", "on", "auto"])
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--skip-simulated", action="store_true")
    ap.add_argument("--table-only", action="store_true", help="only rebuild the README table")
    ap.add_argument(
        "--spiral", nargs="*", default=None, help="run the spiral attempt (configuration names)"
    )
    ap.add_argument("--spiral-steps", type=int, default=1000)
    ap.add_argument(
        "--auto-check",
        action="store_true",
        help="automatic LLDS vs LLDS off with the shipped defaults (sample_runs/auto/)",
    )
    ap.add_argument(
        "--auto-presets",
        nargs="+",
        default=list(AUTO_PRESETS),
        choices=list(AUTO_PRESETS),
        help="presets of --auto-check",
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"runs": []}
    if args.auto_check:  # its own README block (and the provenance), nothing else
        if not args.table_only:
            t0 = time.time()
            new = make_auto_runs(out, args.seeds, args.auto_presets, not args.quiet)
            names = {e["name"] for e in new}
            kept = [e for e in manifest.get("auto", []) if e["name"] not in names]
            manifest["auto"] = kept + new
            manifest["auto_wall_seconds"] = round(time.time() - t0, 1)
            manifest["auto_versions"] = versions()
            manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
        order = {"off": 0, "auto": 1}
        manifest["auto"].sort(
            key=lambda e: (list(AUTO_PRESETS).index(e["preset"]), e["seed"], order[e["llds_mode"]])
        )
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
        write_block(out, auto_rows(out, manifest["auto"]), AUTO_START, AUTO_END)
        write_block(out, demo_rows(out, manifest["auto"]), DEMO_START, DEMO_END)
        write_block(out, provenance_rows(manifest), PROV_START, PROV_END)
        print(f"wrote {out / 'README.md'} automatic-LLDS table ({len(manifest['auto'])} runs)")
        return 0
    if args.spiral is not None and not args.table_only:
        t0 = time.time()
        new = make_spiral_runs(out, args.spiral_steps, args.spiral, args.seeds, not args.quiet)
        names = {e["name"] for e in new}
        manifest["spiral"] = [e for e in manifest.get("spiral", []) if e["name"] not in names] + new
        manifest["spiral_wall_seconds"] = round(time.time() - t0, 1)
        manifest["versions"] = versions()
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    elif not args.table_only:
        t0 = time.time()
        new: list[dict[str, Any]] = []
        if not args.skip_real:
            new += make_real_runs(out, args.seeds, args.modes, args.steps, not args.quiet)
        if not args.skip_simulated:
            new += make_simulated_runs(out, [0])
        names = {e["name"] for e in new}
        manifest["runs"] = [e for e in manifest["runs"] if e["name"] not in names] + new
        manifest["versions"] = versions()
        manifest["last_command"] = " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
        manifest["last_wall_seconds"] = round(time.time() - t0, 1)
        manifest["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs"
        out.mkdir(parents=True, exist_ok=True)
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    order = {"off": 0, "on": 1, "auto": 2}
    runs = sorted(
        manifest["runs"],
        key=lambda e: (e["simulated"], e.get("seed", 0), order.get(e.get("llds_mode"), 9)),
    )
    if runs:
        write_block(out, table_rows(out, runs), MARK_START, MARK_END)
    if manifest.get("spiral"):
        vorder = {"vanilla": 0, "no-neg-adv": 1, "llds": 2}
        manifest["spiral"].sort(key=lambda e: (e["spiral"], vorder.get(e["variant"], 9), e["seed"]))
        write_block(out, spiral_rows(out, manifest["spiral"]), SPIRAL_START, SPIRAL_END)
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")  # keeps computed rows
    write_block(out, provenance_rows(manifest), PROV_START, PROV_END)
    print(f"wrote {out / 'README.md'} tables ({len(runs)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
