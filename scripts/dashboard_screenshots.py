"""Screenshots of the dashboard for docs/dashboard.md: one run, four runs compared, a live run,
the drill-down of a trained toy run.

    python scripts/dashboard_screenshots.py [OUT_DIR]     # default: docs/img

Writes SIMULATED runs (``lld_monitor.testing``) to a temporary ROOT, starts ``lld-monitor
dashboard ROOT`` on a free local port and photographs it with Debian's headless Chromium through
Playwright (``make browser`` installs chromium). The live run gets new rows while it is shown.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lld_monitor import columns as C  # noqa: E402
from lld_monitor.runlog import RunWriter  # noqa: E402
from lld_monitor.testing import make_run, write_run  # noqa: E402

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
#: (run name, make_run kind, seed): the four runs compared.
COMPARED = (
    ("collapse-seed1", "collapse", 1),
    ("collapse-seed4", "collapse", 4),
    ("healthy-seed1", "healthy", 1),
    ("healthy-seed2", "healthy", 2),
)


#: The stored toy run whose token samples the drill-down screenshot shows.
DRILL_RUN = "toy-llds-off-seed0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rows(kind: str, seed: int, n: int) -> list[dict[str, float]]:
    sim = make_run(kind, n_steps=n, seed=seed)
    out = []
    for rec in sim.steps.to_dict("records"):
        row = {k: float(v) for k, v in rec.items() if not (isinstance(v, float) and math.isnan(v))}
        row[C.STEP] = int(rec[C.STEP])
        out.append(row)
    return out


def _feed(writer: RunWriter, rows: list[dict[str, float]], stop: threading.Event) -> None:
    """Append the live run's rows, a few per second, as a trainer would."""
    for row in rows:
        if stop.is_set():
            return
        writer.log_step(row)
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0]) if argv else REPO / "docs" / "img"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("chromium not installed (make browser)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="lld_shots_"))
    for name, kind, seed in COMPARED:
        write_run(make_run(kind, n_steps=260, seed=seed), root / name)
    # a trained toy run with token samples, for the drill-down
    shutil.copytree(REPO / "sample_runs" / "real" / DRILL_RUN, root / DRILL_RUN)
    live_rows = _rows("collapse", 7, 240)
    live = RunWriter(root / "live-run", meta={"simulated": True}, fsync_every_s=0)
    for row in live_rows[:120]:
        live.log_step(row)
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(live, live_rows[120:], stop), daemon=True)
    port = _free_port()
    cmd = [sys.executable, "-m", "lld_monitor.cli", "dashboard", str(root), "--port", str(port)]
    server = subprocess.Popen(
        [*cmd, "--refresh", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    print("the dashboard did not start", file=sys.stderr)
                    return 1
                time.sleep(0.5)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 2300})
            shots = [
                ("dashboard-one-run.png", "?run=collapse-seed1", None),
                (
                    "dashboard-four-runs.png",
                    "?" + "&".join(f"run={name}" for name, _, _ in COMPARED),
                    None,
                ),
                ("dashboard-live.png", "?run=live-run", feeder),
            ]
            for file_name, query, thread in shots:
                if thread is not None:
                    thread.start()
                page.goto(url + "/" + query, wait_until="domcontentloaded")
                page.wait_for_function(
                    "() => { const g = document.querySelector('.js-plotly-plot');"
                    " return g && g._fullData && g._fullData.length > 0; }",
                    timeout=60_000,
                )
                time.sleep(4 if thread is not None else 2)  # live: a few refreshes in
                page.screenshot(
                    path=str(out_dir / file_name), full_page=False
                )  # Streamlit scrolls inside the page: a tall viewport
                print(f"wrote {out_dir / file_name}")
            page.goto(url + f"/?run={DRILL_RUN}", wait_until="domcontentloaded")
            page.get_by_role("tab", name="Drill-down").click()
            page.locator(".lld-tok:visible").first.wait_for(timeout=60_000)
            time.sleep(1)
            page.set_viewport_size({"width": 1400, "height": 1500})
            page.screenshot(path=str(out_dir / "dashboard-drilldown.png"), full_page=False)
            print(f"wrote {out_dir / 'dashboard-drilldown.png'}")
            browser.close()
    finally:
        stop.set()
        live.close()
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
