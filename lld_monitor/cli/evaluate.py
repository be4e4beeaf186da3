"""``lld-monitor eval DIR [--json]``: score our detector and two baselines on labelled runs."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register DIR, --json and --detectors."""
    parser.add_argument("dir", help="folder of labelled run folders (from `lld-monitor simulate`)")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
    parser.add_argument(
        "--detectors",
        default="ours,grad_spike,reward_drop",
        help="comma-separated detectors to score (default: ours,grad_spike,reward_drop)",
    )


def run(args: argparse.Namespace) -> int:
    """Load the labelled runs, score each detector, print a table (or JSON); 2 on bad input."""
    from lld_monitor.analysis.evaluation import DETECTORS, evaluate, load_labelled_runs
    from lld_monitor.runlog import RunFormatError

    names = [n.strip() for n in args.detectors.split(",") if n.strip()]
    unknown = [n for n in names if n not in DETECTORS]
    if unknown or not names:
        print(
            f"lld-monitor eval: unknown detectors {unknown}; choose from {sorted(DETECTORS)}",
            file=sys.stderr,
        )
        return 2
    try:
        runs = load_labelled_runs(args.dir)
    except RunFormatError as exc:
        print(f"lld-monitor eval: {exc}", file=sys.stderr)
        return 2
    if not runs:
        print(
            f"lld-monitor eval: no labelled runs under {args.dir} (run folders whose meta.json "
            "has 'labels'); write some with `lld-monitor simulate DIR`",
            file=sys.stderr,
        )
        return 2
    result = evaluate(runs, {n: DETECTORS[n] for n in names})
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    from lld_monitor.runlog import find_runs

    simulated = sum(bool(labels.get("simulated")) for _, labels in runs)
    skipped = len(find_runs(args.dir)) - len(runs)
    print(
        f"{len(runs)} labelled runs under {args.dir} ({simulated} simulated)"
        + (f"; {skipped} run folders without labels skipped" if skipped else "")
    )
    print(result.table())
    print(
        "caught before: warning (stagnation/decay/displacement/collapse) before the labelled "
        "collapse step; lead: (collapse_step - first warning) / collapse_step, 0 when not caught "
        "before; false-alarm runs: non-collapsing runs with a decay/collapse alert; early "
        "warning: stagnation/decay/displacement alert strictly before collapse_start (phase III "
        "onset), early lead: (collapse_start - first such alert) / collapse_start; any-LLD-alert "
        "runs: non-collapsing runs with any stagnation/decay/displacement/collapse alert "
        "(reward_decline, kl_blowup and other non-LLD alerts never count)."
    )
    return 0
