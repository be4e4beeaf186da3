"""The LLDS watchdog on the testbed (issue 51, item 2): LLDS off, automatic LLDS at a fixed
lambda, and automatic LLDS with the watchdog, side by side per seed.

    .venv/bin/python scripts/watchdog_testbed.py --preset s1-small-32upd-lr3e-3 --steps 400 \\
        --seeds 0 1 2 3 4 5 --out /tmp/watchdog --jobs 2

Writes one run folder per (seed, arm) and ``results.jsonl`` (one line per run: preset, seed,
arm, start and final sampled accuracy, the watchdog's lambda changes, wall seconds) under
``--out``; prints the table. Toy CPU training is deterministic per machine and versions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ARMS = {"off": ("off", False), "auto": ("auto", False), "watchdog": ("auto", True)}


def one(preset: str, steps: int, seed: int, arm: str, out: str) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    from lld_monitor import columns as C
    from lld_monitor.runlog import load_run
    from lld_monitor.toy.train import monitored_run, preset_configs

    cfg = preset_configs(steps, seed)[preset]
    llds, dog = ARMS[arm]
    run_dir = Path(out) / f"{preset}-seed{seed}-{arm}"
    t0 = time.time()
    res = monitored_run(cfg, run_dir, llds=llds, progress=False, llds_watchdog=dog)
    ev = load_run(run_dir).events
    inter = ev[ev[C.EVENT_TYPE] == "intervention"] if len(ev) else ev
    changes = [
        (int(r[C.EVENT_STEP]), str(r[C.EVENT_KIND]), str(r[C.EVENT_MESSAGE])[:90])
        for r in inter.to_dict("records")
    ]
    return {
        "preset": preset,
        "seed": seed,
        "arm": arm,
        "start": res["start_eval"]["accuracy"],
        "final": res["final_eval"]["accuracy"],
        "interventions": changes,
        "wall_s": round(time.time() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="s1-small-32upd-lr3e-3")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(a.preset, a.steps, s, arm, str(out)) for s in a.seeds for arm in a.arms]
    rows = []
    with ProcessPoolExecutor(a.jobs) as pool, open(out / "results.jsonl", "a") as f:
        for row in pool.map(one, *zip(*jobs)):
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps(row), flush=True)
    print("\n| seed | " + " | ".join(a.arms) + " |")
    print("|---|" + "---|" * len(a.arms))
    for s in a.seeds:
        got = {r["arm"]: r for r in rows if r["seed"] == s}
        cells = [f"{got[x]['start']:.2f} -> {got[x]['final']:.2f}" for x in a.arms if x in got]
        print(f"| {s} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
