"""The package ships whole: a wheel built from the checkout and installed into a fresh virtual
environment outside it serves the dashboard (``lld-monitor dashboard``), page included; and it
installs what log analysis uses without the training stack: its requirements name no torch,
transformers or TRL outside their extras, and ``analyze`` and ``report`` run on a foreign log
with torch, transformers and TRL unimportable.

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


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
        check=True,
        cwd=wheels,
        timeout=300,
    )
    (wheel,) = wheels.glob("lld_monitor-*.whl")
    return wheel


def _fresh_env(wheel: Path, tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A fresh venv with the wheel alone installed and this environment's packages borrowed
    through a path entry: (its folder, its python, a clean environment to run it in)."""
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
    return env_dir, py, clean


@pytest.mark.slow
def test_a_wheel_installed_outside_the_checkout_serves_the_dashboard(
    built_wheel: Path, tmp_path: Path
) -> None:
    names = zipfile.ZipFile(built_wheel).namelist()
    assert (
        "lld_monitor/report/dashboard/app.py" in names
        and "lld_monitor/report/dashboard/sources.py" in names
    )
    env_dir, _, clean = _fresh_env(built_wheel, tmp_path)
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


TRAINING = ("torch", "transformers", "trl", "accelerate", "verl")


def test_the_wheel_requires_no_training_stack_outside_its_extras(built_wheel: Path) -> None:
    """Installing lld_monitor never downgrades or blocks a user's TRL: the requirements name no
    trainer unconditionally, TRL's tested range is checked at attach, not pinned here."""
    with zipfile.ZipFile(built_wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    plain = [r for r in reqs if "extra ==" not in r]
    assert plain and not [
        r
        for r in plain
        if r.split()[0].split(">")[0].split("=")[0].split("<")[0].split("[")[0].lower() in TRAINING
    ], plain
    extras = {ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Provides-Extra:")}
    assert {"torch", "transformers", "trl"} <= extras
    trl = [r for r in reqs if r.startswith("trl") and 'extra == "trl"' in r]
    assert trl and "<1.17" not in trl[0], trl


@pytest.mark.slow
def test_analyze_and_report_run_from_the_wheel_without_the_training_stack(
    built_wheel: Path, tmp_path: Path
) -> None:
    env_dir, py, clean = _fresh_env(built_wheel, tmp_path)
    block = tmp_path / "block"
    for name in ("torch", "transformers", "trl"):
        (block / name).mkdir(parents=True)
        (block / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError('{name} made unimportable by this test', name='{name}')\n"
        )
    env = dict(clean, PYTHONPATH=str(block))
    probe = subprocess.run([str(py), "-c", "import torch"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "made unimportable" in probe.stderr  # the block works
    cli = str(env_dir / "bin" / "lld-monitor")

    def run_cli(*args: str) -> subprocess.CompletedProcess:
        res = subprocess.run(
            [cli, *args], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300
        )
        assert res.returncode == 0, res.stderr
        return res

    log = REPO / "tests" / "fixtures" / "importers" / "trainer_state.json"
    assert "signals used" in run_cli("analyze", str(log)).stdout
    folder = REPO / "tests" / "fixtures" / "importers" / "shapes" / "trl_checkpoints"
    run_cli("report", str(folder), "--out", str(tmp_path / "rep"))
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "**Verdict: collapsed**" in summary and "checkpoint-10" in summary
    assert list((tmp_path / "rep" / "charts").glob("*.png"))
    # the monitor itself says which extra it needs
    res = subprocess.run(
        [str(py), "-c", "from lld_monitor import LLDMonitor"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert res.returncode != 0
    assert "pip install 'lld_monitor[torch]'" in res.stderr, res.stderr[-2000:]
