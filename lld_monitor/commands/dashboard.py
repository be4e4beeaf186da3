"""``lld-monitor dashboard [ROOT | RUN ...]``: start the Streamlit dashboard on 127.0.0.1.

Runs ``python -m streamlit run dashboard/app.py -- PATHS``. The app lives in the top-level
``dashboard/`` folder beside the package (an editable install or a source checkout); another
listen address than loopback is used only when asked, with a warning.
"""

from __future__ import annotations

import argparse
import ipaddress
import subprocess
import sys
from pathlib import Path

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
DEFAULT_PORT = 8501


def find_app() -> Path:
    """Path of ``dashboard/app.py`` beside the ``lld_monitor`` package; a clear error without it."""
    package_dir = Path(__file__).resolve().parent.parent  # .../lld_monitor
    app = package_dir.parent / "dashboard" / "app.py"
    if app.is_file():
        return app
    raise FileNotFoundError(
        f"dashboard app not found at {app}: the dashboard ships with the source tree; install "
        "lld_monitor in editable mode from a checkout (pip install -e .) or run "
        "`streamlit run <checkout>/dashboard/app.py -- ROOT`"
    )


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"port must be an integer, got {text!r}") from exc
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, got {port}")
    return port


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from exc
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="ROOT | RUN",
        help="a folder of runs (default: the current folder), or one or more run folders / "
        "foreign logs to show side by side",
    )
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port (default 8501)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="listen address (default 127.0.0.1; anything else exposes your runs to the network)",
    )
    parser.add_argument(
        "--refresh", type=_positive, default=3.0, help="live refresh interval, s (default 3)"
    )
    parser.add_argument(
        "--stale",
        type=_positive,
        default=60.0,
        help="mark a run finished after this many seconds without new rows (default 60)",
    )
    parser.add_argument(
        "--open-browser",
        action="store_true",
        help="let Streamlit open a browser tab (default: print the URL only)",
    )


def is_loopback(host: str) -> bool:
    """True for 127.0.0.1, ::1, localhost and the rest of 127.0.0.0/8."""
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_command(args: argparse.Namespace, app: Path) -> list[str]:
    """The streamlit command line for ``args`` (paths resolved, stats off, no file watcher)."""
    paths = [str(Path(p).resolve()) for p in (args.paths or ["."])]
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.address",
        args.host,
        "--server.port",
        str(args.port),
        "--server.headless",
        "false" if args.open_browser else "true",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--browser.gatherUsageStats",
        "false",
        "--",
        *paths,
        "--refresh",
        str(args.refresh),
        "--stale",
        str(args.stale),
    ]


def run(args: argparse.Namespace) -> int:
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        print(
            f"lld-monitor dashboard: no such run or folder: {', '.join(missing)}", file=sys.stderr
        )
        return 2
    for p in args.paths:
        if Path(p).is_file():
            from lld_monitor.importers import ImportFormatError, detect_format

            try:  # fail here, not in the page: a file named on the command line must be a log
                detect_format(p)
            except ImportFormatError as exc:
                print(f"lld-monitor dashboard: {' '.join(str(exc).split())}", file=sys.stderr)
                return 2
    try:
        app = find_app()
    except FileNotFoundError as exc:
        print(f"lld-monitor dashboard: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(args.host):
        print(
            f"lld-monitor dashboard: WARNING: listening on {args.host}, not 127.0.0.1: anyone who "
            "can reach this machine on port "
            f"{args.port} can read these runs (the dashboard has no login).",
            file=sys.stderr,
        )
    cmd = build_command(args, app)
    print(f"lld-monitor dashboard: http://{args.host}:{args.port}  (Ctrl+C to stop)", flush=True)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0
