"""When must LLDS be switched on to save the s1 spiral? (issue 10, part 3: trigger timing)

    python scripts/auto_llds_timing.py --seeds 0 1 2 --at 1 33 65 97 --lam 0.2

Trains ``lld-monitor demo --preset s1-small-32upd-lr3e-3 --steps 400`` with LLDS switched on by
hand at the start of update ``k`` (``--at``; 1 = from the start) at lambda ``--lam``, no
automatic switch, and prints the final sampled accuracy per seed and ``k`` as a markdown table;
``--json PATH`` also writes the figures. The monitor and its detector still run (run folders in
a temporary directory, not kept), so the same code path as the demo trains.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

PRESET = "s1-small-32upd-lr3e-3"


def run_one(seed: int, at: int, lam: float, steps: int, root: Path) -> dict[str, Any]:
    """One s1 run with LLDS switched on at the start of update ``at``; its final accuracy."""
    from transformers import TrainerCallback

    from lld_monitor import LLDMonitor, LLDSConfig
    from lld_monitor.toy.train import preset_configs, train_toy

    cfg = preset_configs(steps, seed)[PRESET]
    monitor = LLDMonitor(
        root / f"seed{seed}-at{at}-lam{lam}",
        llds=LLDSConfig(lam=lam, enabled=False),
        probe_fraction=1.0,
        token_samples_per_step=0,
        response_samples_per_step=0,
    )

    class SwitchAt(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step + 1 == at and not monitor.llds.enabled:
                monitor.llds.enable(lam, reason=f"scripted at update {at}")

    def attach(trainer: Any) -> None:
        monitor.attach(trainer)
        trainer.add_callback(SwitchAt())

    t0 = time.time()
    try:
        res = train_toy(cfg, attach=attach, progress=False)
    finally:
        monitor.close()
    return {
        "seed": seed,
        "at": at,
        "lam": lam,
        "start_accuracy": res["start_eval"]["accuracy"],
        "final_accuracy": res["final_eval"]["accuracy"],
        "final_searches": res["final_eval"]["searches"],
        "seconds": round(time.time() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--at", type=int, nargs="+", default=[1, 33, 65, 97])
    ap.add_argument("--lam", type=float, nargs="+", default=[0.2])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    if any(a < 1 for a in args.at):
        ap.error("--at takes update numbers >= 1 (1 = LLDS from the start)")
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="lld_timing_") as tmp:
        for lam in args.lam:
            for at in args.at:
                for seed in args.seeds:
                    r = run_one(seed, at, lam, args.steps, Path(tmp))
                    out.append(r)
                    print(json.dumps(r), flush=True)
    print("\n| LLDS on at update | lambda | " + " | ".join(f"seed {s}" for s in args.seeds) + " |")
    print("|---|---|" + "---|" * len(args.seeds))
    for lam in args.lam:
        for at in args.at:
            accs = [
                next(
                    r["final_accuracy"]
                    for r in out
                    if (r["seed"], r["at"], r["lam"]) == (s, at, lam)
                )
                for s in args.seeds
            ]
            print(f"| {at} | {lam:g} | " + " | ".join(f"{a:.2f}" for a in accs) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
