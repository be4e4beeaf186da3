"""``lld-monitor simulate OUT``: write labelled SIMULATED runs as run folders (never trained)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register OUT and the generator's options."""
    from lld_monitor.datasets import KINDS, STANDARD_KINDS

    parser.add_argument("out", help="folder to write the run folders into")
    parser.add_argument("--n", type=int, default=20, help="number of runs (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the suite (default 0)")
    parser.add_argument(
        "--kind",
        choices=KINDS + STANDARD_KINDS,
        help="write N runs of this kind only (default: a mixed suite, 40%% collapsing); "
        f"with --standard one of {', '.join(STANDARD_KINDS)}",
    )
    parser.add_argument(
        "--with-failures",
        action="store_true",
        help="mix non-LLD failure runs (nonfinite, dead_signal, ...) into the suite",
    )
    parser.add_argument("--n-steps", type=int, default=None, help="steps per run (with --kind)")
    parser.add_argument(
        "--standard-only", action="store_true", help="drop the LLD columns (with --kind)"
    )
    parser.add_argument(
        "--log-every", type=int, default=1, help="log one row every K steps (with --kind)"
    )
    parser.add_argument(
        "--noise", type=float, default=1.0, help="multiply every noise scale (with --kind)"
    )
    parser.add_argument(
        "--wide",
        action="store_true",
        help="draw runs from the widened ranges real runs measure: phases of ~30-1000 steps, "
        "rows every 1-10 steps, probes on every 1st-8th rollout batch, 1-8 rows per rollout "
        "batch, low/medium/high AR(1) noise, binomial displacement counts, warm-up and "
        "small-batch healthy runs (with --kind: N such runs of that kind)",
    )
    parser.add_argument(
        "--phase-steps",
        type=float,
        default=None,
        help="mean phase length in steps (time scale = phase steps / 60; with --kind)",
    )
    parser.add_argument(
        "--probe-every",
        type=int,
        default=1,
        help="probe columns on every K-th rollout batch only (with --kind)",
    )
    parser.add_argument(
        "--rows-per-batch",
        type=int,
        default=1,
        help="consecutive steps of one rollout batch repeat its reward and logp (with --kind)",
    )
    parser.add_argument(
        "--noise-level",
        choices=("low", "medium", "high"),
        default=None,
        help="per-row noise matched to measured runs (with --kind)",
    )
    parser.add_argument(
        "--standard",
        action="store_true",
        help="standard-metric-only runs of the collapses seen in foreign logs (level drops with "
        "and without corroboration, dead after the drop, mode collapse, slow spirals, early "
        "deaths) and their hard negatives, a third of them short logs of 30-60 rows every 5-10 "
        "steps (N runs of each kind; with --kind: of that kind only)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="responses probed per rollout batch: n_correct and displaced counts (with --kind)",
    )


def run(args: argparse.Namespace) -> int:
    """Generate and write the runs; print one line per run; 2 on bad arguments or a clash."""
    from lld_monitor.datasets import (
        CLASSIC_KINDS,
        COLLAPSE_KINDS,
        FAILURE_KINDS,
        HEALTHY_KINDS,
        KINDS,
        make_run,
        make_suite,
        make_wide_suite,
        wide_knobs,
        write_run,
    )

    if args.n < 1:
        print("lld-monitor simulate: --n must be >= 1", file=sys.stderr)
        return 2
    from lld_monitor.datasets import STANDARD_KINDS, make_standard_suite

    if args.standard and args.kind and args.kind not in STANDARD_KINDS:
        print(
            f"lld-monitor simulate: --standard takes --kind from {', '.join(STANDARD_KINDS)}",
            file=sys.stderr,
        )
        return 2
    if not args.standard and args.kind in STANDARD_KINDS and args.kind not in KINDS:
        print(f"lld-monitor simulate: kind {args.kind!r} needs --standard", file=sys.stderr)
        return 2
    try:
        if args.standard:
            kinds = (args.kind,) if args.kind else STANDARD_KINDS
            runs = make_standard_suite(args.n, args.seed, kinds=kinds)
        elif args.kind:
            import numpy as np

            rng = np.random.default_rng([args.seed, 0xC11])
            runs = []
            for i in range(args.n):
                given = {
                    "log_every": args.log_every,
                    "probe_every": args.probe_every,
                    "rows_per_batch": args.rows_per_batch,
                }
                for key in ("phase_steps", "noise_level", "batch_size"):
                    if getattr(args, key) is not None:
                        given[key] = getattr(args, key)
                if args.wide:  # draw what was not given on the command line
                    defaults = {"log_every": 1, "probe_every": 1, "rows_per_batch": 1}
                    fixed = {k: v for k, v in given.items() if defaults.get(k) != v}
                    given = wide_knobs(rng, args.kind, **fixed)
                r = make_run(
                    args.kind,
                    args.n_steps,
                    seed=args.seed * 100_003 + i,
                    standard_only=args.standard_only,
                    noise=args.noise,
                    **given,
                )
                r.labels["name"] = f"{i:03d}_{r.labels['name']}"
                runs.append(r)
        elif args.wide:
            kinds = COLLAPSE_KINDS + HEALTHY_KINDS + (FAILURE_KINDS if args.with_failures else ())
            runs = make_wide_suite(args.n, args.seed, kinds=kinds)
        else:
            kinds = CLASSIC_KINDS + (FAILURE_KINDS if args.with_failures else ())
            runs = make_suite(args.n, args.seed, kinds=kinds)
    except ValueError as exc:
        print(f"lld-monitor simulate: {exc}", file=sys.stderr)
        return 2
    from pathlib import Path

    out = Path(args.out)
    for r in runs:
        try:
            write_run(r, out / r.name)
        except FileExistsError:  # the writer's hint (resume=True) is for the Python API
            print(
                f"lld-monitor simulate: {out / r.name} already holds a run; "
                "pass another OUT folder or delete it",
                file=sys.stderr,
            )
            return 2
        except OSError as exc:  # OUT is a file, or a folder that cannot be created
            print(f"lld-monitor simulate: cannot write under {out}: {exc}", file=sys.stderr)
            return 2
        lab = r.labels
        collapse = lab["collapse_step"] if lab.get("collapse_step") is not None else "-"
        print(
            f"{out / r.name}  kind={lab['kind']}  steps={lab['n_steps']}  "
            f"collapse_step={collapse}"
            + (f"  time_scale={lab['time_scale']:g}" if lab.get("time_scale", 1) != 1 else "")
        )
    print(f"wrote {len(runs)} SIMULATED runs (meta: simulated=true, labels) under {out}")
    return 0
