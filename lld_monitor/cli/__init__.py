"""The ``lld-monitor`` command line: one subcommand per module, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# subcommand -> (module, one-line help). Each module defines
#   add_arguments(parser: argparse.ArgumentParser) -> None
#   run(args: argparse.Namespace) -> int   (the exit code)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "analyze": ("lld_monitor.cli.analyze", "analyze a logged run (ours or a foreign log)"),
    "report": (
        "lld_monitor.cli.report",
        "write an issue-ready bundle of one run (summary.md, PNGs)",
    ),
    "eval": ("lld_monitor.cli.evaluate", "score the detector on a folder of labelled runs"),
    "simulate": ("lld_monitor.cli.simulate", "write labelled simulated runs (clearly marked)"),
    "dashboard": ("lld_monitor.cli.dashboard", "open the live dashboard (127.0.0.1)"),
    "demo": ("lld_monitor.cli.demo", "train the toy tool-using GRPO run with the monitor"),
    "selfcheck": ("lld_monitor.cli.selfcheck", "check the install: metrics, LLDS, run log"),
}


def _load(name: str):
    return importlib.import_module(SUBCOMMANDS[name][0])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; ``only``: a subcommand whose module alone is imported to add its
    arguments (the others are listed with their help line: ``lld-monitor analyze`` does not
    import the simulator or the trainer's monitor, 10 MB and some time)."""
    from lld_monitor import __version__

    parser = argparse.ArgumentParser(
        prog="lld-monitor",
        description="Diagnose the Lazy Likelihood Displacement death spiral in GRPO training.",
    )
    parser.add_argument("--version", action="version", version=f"lld-monitor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is not None and name != only:
            continue
        try:
            _load(name).add_arguments(p)
        except ImportError as exc:  # a subcommand whose optional module is missing
            p.set_defaults(_unavailable=str(exc))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    # the subcommand named first: only its module is needed (anything else: the whole parser)
    first = args_in[0] if args_in else None
    parser = build_parser(first if first in SUBCOMMANDS else None)
    args = parser.parse_args(args_in)
    if args.command is None:
        parser.print_help()
        return 0
    unavailable = getattr(args, "_unavailable", None)
    if unavailable:
        print(f"lld-monitor {args.command}: not available: {unavailable}", file=sys.stderr)
        return 2
    try:
        return int(_load(args.command).run(args) or 0)
    except ImportError as exc:  # the training stack, left out of a log-analysis install
        from lld_monitor import missing_extra_hint

        # (the demo trains with TRL's GRPOTrainer: it needs the trl extra, whatever is missing)
        hint = missing_extra_hint(exc, "trl" if args.command == "demo" else None)
        if hint is None:
            raise
        print(f"lld-monitor {args.command}: {hint}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (``lld-monitor analyze RUN | head -3``): no traceback; stdout is
        # pointed at /dev/null so that the interpreter's final flush does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
