"""`lld-monitor --help` and `lld-monitor analyze` import no torch: run with torch unimportable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "sample_runs" / "auto" / "s1-small-32upd-lr3e-3-seed1-off"


@pytest.fixture
def no_torch_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``import torch`` (and trl, transformers) raises ImportError."""
    for name in ("torch", "transformers", "trl"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('{name} is made unimportable by this test')\n"
        )
    path = os.pathsep.join([str(tmp_path), str(ROOT)])
    return dict(os.environ, PYTHONPATH=path)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "lld_monitor.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_block_works(no_torch_env: dict[str, str]) -> None:  # else the test cannot fail
    res = subprocess.run(
        [sys.executable, "-c", "import torch"], env=no_torch_env, capture_output=True, text=True
    )
    assert res.returncode != 0 and "made unimportable" in res.stderr


def test_help_and_analyze_import_no_torch(no_torch_env: dict[str, str]) -> None:
    assert (RUN / "steps.jsonl").is_file(), RUN
    res = _cli(no_torch_env, "--help")
    assert res.returncode == 0, res.stderr
    assert "analyze" in res.stdout and "dashboard" in res.stdout
    res = _cli(no_torch_env, "analyze", str(RUN))
    assert res.returncode == 0, res.stderr
    assert "signals used" in res.stdout
    res = _cli(no_torch_env, "analyze", str(RUN), "--json")
    assert res.returncode == 0 and res.stdout.lstrip().startswith("{"), res.stderr


def test_building_the_parser_needs_no_trainer_module(no_torch_env: dict[str, str]) -> None:
    # every subcommand registers its arguments without torch (none falls back to "not
    # available"), and building the parser loads no trainer module even where they exist
    code = (
        "import sys; from lld_monitor.cli import build_parser; parser = build_parser(); "
        "sub = next(a for a in parser._actions if a.dest == 'command'); "
        "print([n for n, p in sub.choices.items() if p.get_default('_unavailable')])"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=no_torch_env, capture_output=True, text=True, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
    code = (
        "import sys; from lld_monitor.cli import build_parser; build_parser(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'trl'}))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_a_subcommand_imports_only_its_own_module(tmp_path) -> None:
    # `lld-monitor analyze` reads a log: the simulator, the datasets and the trainer's monitor
    # (the other subcommands' modules, 10 MB resident) stay unimported; `--help` still lists all
    csv = tmp_path / "h.csv"
    csv.write_text("_step,train/reward\n1,0.1\n2,0.2\n3,0.3\n")
    code = (
        "import contextlib, io, sys; from lld_monitor.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['analyze', '--json', {str(csv)!r}])\n"
        "print(rc, sorted(m for m in sys.modules if m.startswith('lld_monitor.') and "
        "m.split('.')[1] in ('testing', 'datasets', 'monitor', 'toy')))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0 []"
    from lld_monitor.cli import main

    with pytest.raises(SystemExit):
        main(["simulate", "--help"])  # (its module is loaded when named)
