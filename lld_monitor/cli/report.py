"""``lld-monitor report PATH [--out DIR] [--run N] [--json]``: an issue-ready bundle of one run
(``report/bundle.py``): summary.md, report.html, report.json and charts/*.png in one folder."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register PATH, --out, --run and --json."""
    parser.add_argument(
        "path",
        help="one run: a run folder, or any log lld-monitor analyze reads (TRL, W&B, "
        "TensorBoard, verl, console logs, notebooks)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="the folder to write (created; files in it are replaced); default: "
        "NAME-report in the current folder",
    )
    parser.add_argument(
        "--run",
        metavar="N",
        default=None,
        help="one run of a file that holds several (as lld-monitor analyze --run)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print report.json's document on stdout (schema_version 1, docs/report.md)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the bundle. Exit 0: written; 2: the input could not be read or analysed, it holds
    several runs (pick one), or the folder could not be written."""
    from lld_monitor.importers import ImportFormatError
    from lld_monitor.report.bundle import write_bundle

    path = Path(args.path)
    if path.is_dir():
        from lld_monitor.analysis.triage import folder_runs, one_run_in

        entries = folder_runs(path) if args.run is None else []
        if len(entries) > 1:
            print(
                f"lld-monitor report: {path} holds {len(entries)} runs; a report is of one run: "
                "pass one of them (lld-monitor analyze lists them)",
                file=sys.stderr,
            )
            return 2
        only = one_run_in(path, entries) if entries else None
        if only is not None:
            path, args.run = only[0], only[1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", path.name or "run").strip("_") or "run"
    out = Path(args.out) if args.out else Path.cwd() / f"{name}-report"
    try:
        doc = write_bundle(path, out, run=args.run, jobs=2)  # (the command owns its process)
    except ImportFormatError as exc:
        print(f"lld-monitor report: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"lld-monitor report: cannot analyse {args.path}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"lld-monitor report: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    said = f"lld-monitor report: {doc['verdict_word']}; wrote {out}/ ({', '.join(doc['files'])})"
    if args.json:
        print(said, file=sys.stderr)
        print(json.dumps(doc))
    else:
        print(said)
        print(f"paste {out / 'summary.md'} into an issue; attach the charts/*.png it names")
    return 0
