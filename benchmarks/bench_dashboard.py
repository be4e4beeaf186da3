"""Benchmark the dashboard: first render of a long run (and until its analysis is shown), and a
refresh after 100 new rows.

    python benchmarks/bench_dashboard.py                      # 10k and 100k steps
    python benchmarks/bench_dashboard.py --steps 10000 100000 --refreshes 5
    python benchmarks/bench_dashboard.py --browser            # also time Chromium (if installed)

The run is a SIMULATED collapsing run (``lld_monitor.testing``) written by ``RunWriter``. A render
is one full script run of ``dashboard/app.py`` through Streamlit's ``AppTest`` (reading the run,
the offline analysis, the plotly figure, the tables: everything but the browser's drawing); a run
of ``service.BACKGROUND_BYTES`` or more is analysed in a worker process, so its first render has
the charts and a second one, once the worker is done, the analysis too (both timed). The
refresh appends 100 rows to the run log, then reruns; its cost must not grow with the run's
length (the reader reads only the new rows, the analysis is not redone for them, the charts are
decimated to a fixed number of points). ``--browser`` also times a real headless Chromium from
navigation until the figure has its traces, against a server started on a free local port.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "dashboard" / "app.py"
NEW_ROWS = 100
#: A refresh at the longest length may cost at most this multiple of one at the shortest.
GROWTH_TARGET = 1.5
#: First render targets (seconds) by run length.
FIRST_TARGETS = {100_000: 2.0, 1_000_000: 5.0}


def write_long_run(path: Path, n_steps: int):
    """A simulated collapsing run of ``n_steps`` rows; its writer is returned open (a live run)."""
    import math

    from lld_monitor import columns as C
    from lld_monitor.runlog import RunWriter
    from lld_monitor.testing import make_run

    sim = make_run("collapse", n_steps=n_steps, seed=1)
    writer = RunWriter(path, meta={"simulated": True, "labels": sim.labels})
    for rec in sim.steps.to_dict("records"):
        row = {k: float(v) for k, v in rec.items() if not (isinstance(v, float) and math.isnan(v))}
        row[C.STEP] = int(rec[C.STEP])
        writer.log_step(row)
    return writer


def append_rows(writer, first_step: int, n: int) -> None:
    """Append ``n`` step rows to the live run log, as the trainer would."""
    from lld_monitor import columns as C

    for s in range(first_step, first_step + n):
        writer.log_step({C.STEP: s, C.REWARD_MEAN: 0.0, C.GRAD_NORM: 1.0, C.ENTROPY: 1.0})


class AppUnderTest:
    """The app on one run's ROOT through AppTest, with the run's writer left open."""

    def __init__(self, root: Path, writer, n_steps: int) -> None:
        from streamlit.testing.v1 import AppTest

        self.argv = [str(APP), str(root)]  # the app reads sys.argv on every run
        self.at = AppTest.from_file(str(APP), default_timeout=900)
        self.writer = writer
        self.rows = n_steps

    def first_render(self) -> tuple[float, float]:
        """(seconds to the first render, seconds until the analysis is shown too). A long run
        (``service.BACKGROUND_BYTES``) is analysed in a worker process: its first render has
        the charts, and a rerun once the worker is done adds the phases, alerts and verdict
        (in a browser the page polls every ``POLL_S``; here the rerun follows at once)."""
        from lld_monitor.report.dashboard import service

        sys.argv = self.argv
        t0 = time.perf_counter()
        self.at.run()
        first = time.perf_counter() - t0
        _check(self.at, self.rows)
        if service.background_pending():
            while service.background_pending():
                time.sleep(0.02)
            self.at.run()
            _check(self.at, self.rows)
            if "in the background" in "\n".join(m.value for m in self.at.info):
                raise RuntimeError("the analysis was not shown after the worker finished")
        return first, time.perf_counter() - t0

    def refresh(self) -> float:
        """Append ``NEW_ROWS`` rows to the run log, then time one rerun."""
        append_rows(self.writer, self.rows, NEW_ROWS)
        self.rows += NEW_ROWS
        sys.argv = self.argv
        t0 = time.perf_counter()
        self.at.run()
        elapsed = time.perf_counter() - t0
        _check(self.at, self.rows)
        return elapsed


def _check(at, n_rows: int) -> None:
    if at.exception:
        raise RuntimeError(f"the app raised: {at.exception[0].message}")
    text = "\n".join(m.value for m in at.markdown)
    if f"{n_rows} rows" not in text:
        raise RuntimeError(f"the app does not show {n_rows} rows")


def bench_browser(root: Path, n_steps: int) -> float | None:
    """Seconds from navigation until Chromium shows the figure's traces; None without Chromium."""
    import signal
    import socket
    import subprocess
    import urllib.request

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "lld_monitor.cli", "dashboard", str(root), "--port", str(port)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(180):
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as pw:
            args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
            browser = pw.chromium.launch(executable_path=chromium, args=args)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            t0 = time.perf_counter()
            page.goto(url)
            page.get_by_text(f"{n_steps} rows, last step").wait_for(timeout=600_000)
            page.wait_for_function(
                "() => { const g = document.querySelector('.js-plotly-plot');"
                " return g && g._fullData && g._fullData.length > 0; }",
                timeout=600_000,
            )
            elapsed = time.perf_counter() - t0
            browser.close()
        return elapsed
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--refreshes", type=int, default=9, help="refreshes timed per size (median)")
    p.add_argument("--browser", action="store_true", help="also time headless Chromium")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))

    results: dict[int, dict[str, float]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench_dashboard_"))
    writers = []
    try:
        # warm-up on a small run, not reported: imports and first-use costs of the process
        warm = write_long_run(tmp / "warm" / "sim", 200)
        writers.append(warm)
        AppUnderTest(tmp / "warm", warm, 200).first_render()
        from lld_monitor.report.dashboard import service

        service._background_pool().submit(int).result()  # the worker's start, not reported
        apps: dict[int, AppUnderTest] = {}
        for n in args.steps:
            root = tmp / f"root{n}"
            t0 = time.perf_counter()
            writer = write_long_run(root / f"sim{n}", n)
            writers.append(writer)
            print(f"[{n} steps] wrote the run in {time.perf_counter() - t0:.1f} s", flush=True)
            apps[n] = AppUnderTest(root, writer, n)
            first, complete = apps[n].first_render()
            results[n] = {"first": first, "complete": complete}
        # refreshes interleaved across sizes, so that every size sees the same machine load
        times: dict[int, list[float]] = {n: [] for n in apps}
        for _ in range(args.refreshes):
            for n, app in apps.items():
                times[n].append(app.refresh())
        for n, app in apps.items():
            r = results[n]
            r["refresh"] = statistics.median(times[n])
            r["refresh_max"] = max(times[n])
            if args.browser:
                b = bench_browser(tmp / f"root{n}", app.rows)
                if b is not None:
                    r["browser_first"] = b
            line = (
                f"[{n} steps] first render {r['first']:.2f} s, with the analysis shown "
                f"{r['complete']:.2f} s; refresh after "
                f"{NEW_ROWS} new rows: median {r['refresh'] * 1000:.0f} ms "
                f"(max {r['refresh_max'] * 1000:.0f} ms, {args.refreshes} refreshes)"
            )
            if "browser_first" in r:
                line += f"; Chromium first render {r['browser_first']:.2f} s"
            print(line, flush=True)
    finally:
        for w in writers:
            w.close()
        shutil.rmtree(tmp, ignore_errors=True)

    sizes = sorted(results)
    ok = True
    for n in sizes:
        target = FIRST_TARGETS.get(n)
        if target is not None:
            passed = results[n]["first"] <= target
            ok &= passed
            print(
                f"first render {n} steps: {results[n]['first']:.2f} s "
                f"(target <= {target:g} s: {'PASS' if passed else 'FAIL'})"
            )
    if len(sizes) > 1:
        lo, hi = results[sizes[0]]["refresh"], results[sizes[-1]]["refresh"]
        ratio = hi / lo
        ok = ratio <= GROWTH_TARGET
        print(
            f"refresh {sizes[-1]} / {sizes[0]} steps: {ratio:.2f}x "
            f"(target <= {GROWTH_TARGET}x: {'PASS' if ok else 'FAIL'})"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
