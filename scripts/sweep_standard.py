"""Score the detector on standard-metric-only simulated runs (``make_standard_suite``).

    python scripts/sweep_standard.py --seed 1 [--n-per-kind 30] [--json OUT]

Per kind: caught = a warning or critical alert at or after the onset (``collapse_start``; for
spirals, their fast fall ``fall_start`` too is reported), delay in logged rows and in steps
from the onset, caught before the reward halves (``collapse_step``); for healthy kinds, runs
with a critical alert and runs with any warning (by kind). Runs are SIMULATED; the suite is a
check of the detector on the shapes of real logs, not a measurement of trained runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from typing import Any

import numpy as np

from lld_monitor.analysis.detector import PhaseDetector
from lld_monitor.analysis.offline import prepare_steps, replay
from lld_monitor.testing import (
    STANDARD_COLLAPSE_KINDS,
    STANDARD_HEALTHY_KINDS,
    STANDARD_KINDS,
    make_standard_suite,
)

SEVERE = ("warning", "critical")


def score(run: Any) -> dict[str, Any]:
    """One run's record: its labels and what the detector said."""
    df = prepare_steps(run.steps)
    alerts, _, _ = replay(df, PhaseDetector())
    lab = run.labels
    steps = df["step"].to_numpy()
    rec: dict[str, Any] = {
        "name": run.name,
        "kind": lab["kind"],
        "rows": len(df),
        "log_every": lab["log_every"],
        "noise_frac": lab["noise_frac"],
        "alerts": [[a.step, a.kind, a.severity] for a in alerts],
    }
    onset = lab.get("collapse_start")
    if onset is not None:
        hits = [a for a in alerts if a.severity in SEVERE and a.step >= onset]
        rec["caught"] = bool(hits)
        if hits:
            first = hits[0].step
            rec["delay_steps"] = int(first - onset)
            rec["delay_rows"] = int(np.searchsorted(steps, first) - np.searchsorted(steps, onset))
            half = lab.get("collapse_step")
            rec["before_half"] = half is not None and first <= half
            rec["first_kind"] = hits[0].kind
        rec["early_severe"] = [a.kind for a in alerts if a.severity in SEVERE and a.step < onset]
    else:
        rec["critical"] = sorted({a.kind for a in alerts if a.severity == "critical"})
        rec["warnings"] = sorted({a.kind for a in alerts if a.severity == "warning"})
    return rec


def table(records: list[dict[str, Any]]) -> str:
    """Markdown tables: collapsing kinds, then healthy kinds."""
    out = [
        "| kind | runs | caught | median delay (rows) | max delay (rows) | median delay (steps) "
        "| before half | severe alert before onset | first alert kinds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in STANDARD_COLLAPSE_KINDS:
        rs = [r for r in records if r["kind"] == kind]
        if not rs:
            continue
        c = [r for r in rs if r.get("caught")]
        dr = [r["delay_rows"] for r in c]
        ds = [r["delay_steps"] for r in c]
        kinds = Counter(r["first_kind"] for r in c)
        out.append(
            f"| {kind} | {len(rs)} | {len(c)} | {statistics.median(dr) if dr else '-'} | "
            f"{max(dr) if dr else '-'} | {statistics.median(ds) if ds else '-'} | "
            f"{sum(r['before_half'] for r in c)} | {sum(bool(r['early_severe']) for r in rs)} | "
            f"{', '.join(f'{k} {v}' for k, v in kinds.most_common())} |"
        )
    out += ["", "| kind | runs | with a critical alert | with a warning | warning kinds |"]
    out.append("|---|---|---|---|---|")
    for kind in STANDARD_HEALTHY_KINDS:
        rs = [r for r in records if r["kind"] == kind]
        if not rs:
            continue
        w = Counter(k for r in rs for k in r["warnings"])
        out.append(
            f"| {kind} | {len(rs)} | {sum(bool(r['critical']) for r in rs)} | "
            f"{sum(bool(r['warnings']) for r in rs)} | "
            f"{', '.join(f'{k} {v}' for k, v in w.most_common()) or '-'} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n-per-kind", type=int, default=30)
    ap.add_argument("--kind", action="append", choices=STANDARD_KINDS, help="only these kinds")
    ap.add_argument("--json", metavar="OUT", help="write every run's record to OUT")
    args = ap.parse_args(argv)
    t0 = time.time()
    runs = make_standard_suite(args.n_per_kind, args.seed, kinds=args.kind or STANDARD_KINDS)
    records = []
    for i, run in enumerate(runs):
        records.append(score(run))
        if (i + 1) % 50 == 0:
            print(f"  {i + 1}/{len(runs)} runs", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(records, fh, indent=1)
    print(
        f"Standard-metric-only SIMULATED runs, seed {args.seed}, {args.n_per_kind} per kind "
        f"({time.time() - t0:.0f} s)\n"
    )
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
