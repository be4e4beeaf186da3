"""The package ships whole: a wheel built from the checkout and installed into a fresh virtual
environment outside it serves the dashboard (``lld-monitor dashboard``), page included.

The fresh environment gets the wheel alone (``--no-deps``); its dependencies are borrowed from the
test's own environment through a plain path entry, which puts their folder on ``sys.path``
without running the editable install's hook there, so ``lld_monitor`` is imported from the
wheel and nothing is read from the checkout.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PIP = (sys.executable, "-m", "pip")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_wheel_installed_outside_the_checkout_serves_the_dashboard(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
        check=True,
        cwd=tmp_path,
        timeout=300,
    )
    (wheel,) = wheels.glob("lld_monitor-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert (
        "lld_monitor/report/dashboard/app.py" in names
        and "lld_monitor/report/dashboard/sources.py" in names
    )

    env_dir = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [*PIP, "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "_borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.run(
        [str(py), "-c", "import lld_monitor; print(lld_monitor.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=clean,
    ).stdout.strip()
    assert where.startswith(str(env_dir)), where  # the wheel's copy, not the checkout

    run = tmp_path / "runs" / "toy"
    shutil.copytree(REPO / "sample_runs" / "real" / "toy-llds-off-seed0", run)
    port = _free_port()
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        [str(env_dir / "bin" / "lld-monitor"), "dashboard", str(run), "--port", str(port)],
        cwd=tmp_path,
        env=clean,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(
                        "the installed dashboard did not start:\n"
                        + (tmp_path / "server.log").read_text(errors="replace")[-3000:]
                    )
                time.sleep(0.5)
        if CHROMIUM is None:
            return  # served; the page itself needs a browser (make browser)
        sync_api = pytest.importorskip("playwright.sync_api")
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"], headless=True
            )
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1400})
                page.goto(url, wait_until="domcontentloaded")
                page.get_by_text("240 rows, last step 240").first.wait_for(timeout=60_000)
                page.wait_for_function(
                    "() => { const g = document.querySelector('.js-plotly-plot');"
                    " return g && g._fullData && g._fullData.length > 0; }",
                    timeout=60_000,
                )
                assert page.get_by_text("Traceback").count() == 0
            finally:
                browser.close()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        log.close()
