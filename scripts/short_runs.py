"""Short runs (20-60 logged rows): how many collapses the analyzer calls, how many healthy runs it
alarms on. SIMULATED, with a generator of its own (not ``lld_monitor.testing``'s), so that the
detector is not judged on the runs it was built on.

    python scripts/short_runs.py --seed 1 --n 200 [--out FILE.json]

Tune on one seed, report on another. A run is:

- a reward per row: the mean of k sampled 0/1 rewards (k = 4-32 completions a row), whose
  success probability follows a curve: rising to a plateau, flat, starting near the plateau, or
  slowly drifting; optional one-row spikes (a bad batch) and an AR(1) wobble;
- a collapse: from a row at 45-80% of the run on, the probability falls to 0-30% of its
  plateau and stays there (``delta``: the fall in row-sd, the binomial sd of a row at the
  plateau; ``after``: the rows after);
  some collapses are corroborated (completion length down to a few tokens, grad norm up x10).

Counted: a collapse is caught when an alert of kind ``collapse`` (any severity) comes at or
after its first fallen row; a healthy run alarms when it gets a critical alert or an LLD-phase
alert (stagnation, decay, displacement, collapse) of warning or critical severity.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LLD_KINDS = {"stagnation", "decay", "displacement", "collapse"}
HEALTHY_SHAPES = ("rising", "flat", "near_plateau", "drift", "noisy", "spikes", "wobble")
START_SHAPES = ("rising", "flat", "near_plateau")


def _curve(shape: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """The success probability of each row of a healthy run."""
    t = np.arange(n) / max(n - 1, 1)
    lo, hi = rng.uniform(0.05, 0.35), rng.uniform(0.45, 0.9)
    if shape == "rising":
        tau = rng.uniform(0.15, 0.5)
        return lo + (hi - lo) * (1 - np.exp(-t / tau))
    if shape == "flat":
        return np.full(n, rng.uniform(0.1, 0.8))
    if shape == "near_plateau":
        return hi - rng.uniform(0.0, 0.08) * np.exp(-t / 0.2)
    if shape == "drift":
        return np.clip(rng.uniform(0.3, 0.6) + rng.uniform(-0.1, 0.15) * t, 0.02, 0.98)
    return np.full(n, rng.uniform(0.3, 0.7))


def simulate(kind: str, rng: np.random.Generator) -> dict:
    """One run: {"df", "kind", "shape", "k", "fall_row", "fall_step", "delta", "after"}."""
    n = int(rng.integers(20, 61))
    k = int(rng.choice([4, 8, 16, 32]))
    every = int(rng.choice([1, 1, 5, 10]))
    if kind == "collapse":
        shape = str(rng.choice(START_SHAPES))
    else:
        shape = str(rng.choice(HEALTHY_SHAPES))
    p = _curve(shape, n, rng)
    if shape == "wobble":
        e = np.zeros(n)
        for i in range(1, n):
            e[i] = 0.8 * e[i - 1] + rng.normal(0, 0.04)
        p = p + e
    p = np.clip(p, 0.01, 0.99)
    fall_row = None
    delta = None
    corroborated = False
    if kind == "collapse":
        fall_row = round(rng.uniform(0.45, 0.8) * n)
        fall_row = min(fall_row, n - 2)
        plateau = float(np.mean(p[max(0, fall_row - 5) : fall_row]))
        row_sd = math.sqrt(plateau * (1 - plateau) / k)
        # to near the floor (a collapse, not a degradation): the fall in row-sd is what the
        # noise makes of it (4 samples a row at a low plateau: a small one)
        low = plateau * float(rng.uniform(0.0, 0.3))
        delta = (plateau - low) / row_sd
        p[fall_row:] = low
        corroborated = bool(rng.random() < 0.5)
    successes = rng.binomial(k, np.clip(p, 0, 1))
    reward = successes / k
    if shape == "spikes" or (kind == "healthy" and shape == "noisy"):
        for i in rng.choice(n, size=max(1, n // 15), replace=False):
            if i > 3:
                reward[i] = rng.uniform(0.0, 0.1)  # a one-row bad batch
    length = rng.normal(300, 15, n)
    grad = np.abs(rng.normal(1.0, 0.15, n))
    if fall_row is not None and corroborated:
        length[fall_row:] = rng.normal(6, 1, n - fall_row)
        grad[fall_row:] = np.abs(rng.normal(12.0, 2.0, n - fall_row))
    steps = every * np.arange(1, n + 1)
    df = pd.DataFrame(
        {
            "step": steps,
            "reward_mean": reward,
            "reward_std": np.sqrt(np.clip(reward * (1 - reward), 0, None)),
            "completion_length": length,
            "grad_norm": grad,
        }
    )
    return {
        "df": df,
        "kind": kind,
        "shape": shape,
        "k": k,
        "n": n,
        "fall_row": fall_row,
        "fall_step": None if fall_row is None else int(steps[fall_row]),
        "delta": delta,
        "after": None if fall_row is None else n - fall_row,
        "corroborated": corroborated,
    }


def judge(run: dict, config: object = None) -> dict:
    from lld_monitor.analysis import analyze_run

    a = analyze_run(run["df"], config=config, jobs=1)
    alerts = list(a.alerts)
    out = {k: v for k, v in run.items() if k != "df"}
    if run["kind"] == "collapse":
        hits = [x for x in alerts if x.kind == "collapse" and x.step >= run["fall_step"]]
        out["caught"] = bool(hits)
        out["delay_rows"] = (
            None
            if not hits
            else int(np.searchsorted(run["df"]["step"], hits[0].step)) - run["fall_row"]
        )
    else:
        bad = [
            x
            for x in alerts
            if x.severity == "critical"
            or (x.kind in LLD_KINDS and x.severity in ("warning", "critical"))
        ]
        out["alarm"] = [f"{x.kind}@{x.step}" for x in bad]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n", type=int, default=200, help="runs of each class")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a detector setting (level_shift.floor_sd=1.0); repeatable",
    )
    args = ap.parse_args(argv)
    from lld_monitor.analysis.config import DetectorConfig

    overrides = {k: float(v) for k, v in (c.split("=", 1) for c in args.config)}
    config = DetectorConfig().with_overrides(**overrides) if overrides else None
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    results = [
        judge(simulate(kind, rng), config)
        for kind in ("collapse", "healthy")
        for _ in range(args.n)
    ]
    col = [r for r in results if r["kind"] == "collapse"]
    hea = [r for r in results if r["kind"] == "healthy"]
    big = [r for r in col if r["delta"] >= 3 and r["after"] >= 6]
    summary = {
        "seed": args.seed,
        "collapses": len(col),
        "caught": sum(r["caught"] for r in col),
        "big_falls": len(big),
        "big_caught": sum(r["caught"] for r in big),
        "healthy": len(hea),
        "healthy_alarmed": sum(bool(r["alarm"]) for r in hea),
        "by_delta": {
            f"{lo}-{hi}": f"{sum(r['caught'] for r in col if lo <= r['delta'] < hi)}/"
            f"{sum(1 for r in col if lo <= r['delta'] < hi)}"
            for lo, hi in ((0, 2), (2, 3), (3, 5), (5, 8), (8, 1000))
        },
        "by_after": {
            f"{lo}-{hi}": f"{sum(r['caught'] for r in col if lo <= r['after'] < hi)}/"
            f"{sum(1 for r in col if lo <= r['after'] < hi)}"
            for lo, hi in ((0, 6), (6, 10), (10, 20), (20, 100))
        },
        "alarms": [(r["shape"], r["n"], r["k"], r["alarm"]) for r in hea if r["alarm"]][:20],
        "seconds": round(time.time() - t0, 1),
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
