"""``lld-monitor dashboard [ROOT | RUN ...]``: start the Streamlit dashboard on 127.0.0.1.

Runs ``python -m streamlit run <package>/dashboard/app.py -- PATHS`` as a child process (the
page ships in the package: a wheel install has it); another listen address than loopback is used
only when asked, with a warning. The listen address is checked before Streamlit starts (a name
that does not resolve, a port in use: one line, exit 2). Ctrl+C, SIGTERM and SIGHUP sent to this
process stop the server: they are passed on to the child, which is killed if it has not exited
10 s later; on Linux the child also gets SIGTERM when this process dies without a word (SIGKILL).
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
DEFAULT_PORT = 8501
#: Seconds the server has to exit after a stop signal is passed on, before it is killed.
STOP_GRACE_S = 10.0
#: The signals that stop the server (Ctrl+C, ``kill PID``, a closed terminal).
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)  # no SIGHUP on Windows


def find_app() -> Path:
    """Path of the dashboard page, ``lld_monitor/report/dashboard/app.py``: part of the package,
    so an installed wheel has it as much as a checkout does; a clear error if it is missing."""
    from importlib import resources

    app = Path(str(resources.files("lld_monitor.report.dashboard") / "app.py"))
    if app.is_file():
        return app
    raise FileNotFoundError(
        f"dashboard page not found at {app}: the lld_monitor install is incomplete; reinstall "
        "it (pip install --force-reinstall lld_monitor)"
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
        # a viewer's toolbar: no Deploy button (nor rerun / clear cache) on a local monitor
        "--client.toolbarMode",
        "viewer",
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
    problem = check_listen(args.host, args.port)
    if problem is not None:
        print(f"lld-monitor dashboard: {problem}", file=sys.stderr)
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
    return serve(cmd)


def check_listen(host: str, port: int) -> str | None:
    """Why the server could not listen on ``host:port`` (one line), or None when it can."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return (
            f"--host {host!r} is not an address or host name of this machine ({reason}); "
            "use 127.0.0.1 (the default) or one of its interface addresses"
        )
    family, kind, proto, _, addr = infos[0]
    try:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return f"cannot listen on {host}:{port}: {reason} (port in use, or not this machine's?)"
    return None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the server gets SIGTERM when this process dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(cmd: list[str]) -> int:
    """Run the server ``cmd`` until it exits; pass Ctrl+C, SIGTERM and SIGHUP on to it."""
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    proc = subprocess.Popen(cmd, preexec_fn=preexec)  # single-threaded here: preexec is safe
    stop_at: list[float] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # Streamlit shuts its server down on SIGTERM
        if not stop_at:
            stop_at.append(time.monotonic() + STOP_GRACE_S)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stop_at and time.monotonic() > stop_at[0]:
                    proc.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # an exception here: never leave the server behind
            proc.kill()
            proc.wait()
    return 0 if stop_at else code
