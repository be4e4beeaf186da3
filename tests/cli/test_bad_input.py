"""Bad input to every subcommand: one line on stderr, exit code 2, no traceback, no server.

Found in a new-user pass over the CLI; each case printed a traceback, a misleading message, or
(dashboard) started a server for a file it could not show.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lld_monitor.cli import main
from lld_monitor.testing import make_run, write_run


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


def test_analyze_empty_file_says_empty(tmp_path, capsys):
    path = tmp_path / "log.jsonl"
    path.write_text("")
    assert main(["analyze", str(path)]) == 2
    assert "empty file" in _one_line_error(capsys)


def test_analyze_future_schema_is_not_called_broken(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(make_run("healthy", 60, seed=1), run)
    meta = json.loads((run / "meta.json").read_text())
    meta["schema_version"] = 99
    (run / "meta.json").write_text(json.dumps(meta))
    assert main(["analyze", str(run)]) == 2
    line = _one_line_error(capsys)
    assert "broken" not in line  # the run is fine; this lld_monitor is too old for it
    assert "99" in line and "upgrade lld_monitor" in line


def test_analyze_run_folder_without_steps_names_the_missing_file(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(make_run("healthy", 60, seed=1), run)
    (run / "steps.jsonl").unlink()
    assert main(["analyze", str(run)]) == 2
    assert "missing steps.jsonl" in _one_line_error(capsys)


def test_simulate_into_a_file_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "taken"
    out.write_text("not a folder")
    assert main(["simulate", str(out), "--n", "1"]) == 2
    assert "cannot write under" in _one_line_error(capsys)


def test_eval_on_a_file_says_it_is_a_file(tmp_path, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text("{}\n")
    assert main(["eval", str(path)]) == 2
    line = _one_line_error(capsys)
    assert "is a file, not a folder" in line and "no such" not in line


def test_selfcheck_keep_a_file_exit_2(tmp_path, capsys):
    path = tmp_path / "f"
    path.write_text("")
    assert main(["selfcheck", "--keep", str(path)]) == 2
    assert "is a file" in _one_line_error(capsys)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("content", [b"", bytes(range(256)) * 8])
def test_dashboard_on_an_unreadable_file_exits_2_without_a_server(tmp_path, content):
    path = tmp_path / "x.log"
    path.write_bytes(content)
    cmd = [sys.executable, "-m", "lld_monitor.cli", "dashboard", str(path)]
    cmd += ["--port", str(_free_port())]
    # before the fix this started Streamlit and ran until killed (TimeoutExpired fails the test)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lld-monitor dashboard: ")
    assert str(Path(path)) in lines[0]
    assert "http://" not in proc.stdout


def test_analyze_a_folder_of_runs_lists_each_run(tmp_path, capsys):
    # (it once refused: "a folder of 2 runs, not one run"; now it triages them, cli/triage.py)
    for name in ("a", "b"):
        write_run(make_run("healthy", 60, seed=1), tmp_path / "runs" / name)
    assert main(["analyze", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{tmp_path / 'runs'}: 2 runs (2 healthy)"
    assert [line.split()[1] for line in out[2:]] == ["a", "b"]


def test_selfcheck_keep_twice_in_one_folder_passes(tmp_path, capsys):
    # a second check must not FAIL because the first one's kept run is still there
    assert main(["selfcheck", "--keep", str(tmp_path)]) == 0
    assert main(["selfcheck", "--keep", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["selfcheck_run", "selfcheck_run-2"]
    assert "selfcheck: OK" in capsys.readouterr().out


def test_simulate_twice_into_one_folder_gives_a_cli_hint(tmp_path, capsys):
    assert main(["simulate", str(tmp_path), "--n", "1"]) == 0
    capsys.readouterr()
    assert main(["simulate", str(tmp_path), "--n", "1"]) == 2
    line = _one_line_error(capsys)
    assert "already holds a run" in line and "resume=True" not in line


def test_analyze_csv_with_steps_1e30_is_refused(tmp_path, capsys):
    path = tmp_path / "run.csv"
    path.write_text("step,reward_mean\n1,0.1\n1e30,0.2\n")
    assert main(["analyze", str(path)]) == 2
    line = _one_line_error(capsys)
    assert "1e+30" in line and "beyond 2**53" in line
    assert "-9223372036854775808" not in line


def test_analyze_html_empty_name_is_refused(tmp_path, capsys):
    path = tmp_path / "run.csv"
    path.write_text("step,reward_mean\n1,0.1\n2,0.2\n")
    assert main(["analyze", str(path), "--html", ""]) == 2
    assert "--html needs a file name" in _one_line_error(capsys)


def test_analyze_folder_with_steps_but_no_meta_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(make_run("healthy", 60, seed=1), run)
    (run / "meta.json").unlink()
    assert main(["analyze", str(run)]) == 2
    line = _one_line_error(capsys)
    assert "steps.jsonl but no meta.json" in line and "holds no run log" not in line
    assert main(["analyze", str(run / "steps.jsonl")]) == 0  # the hint works


def test_dashboard_host_that_does_not_resolve_exits_2_without_a_traceback(tmp_path):
    cmd = [sys.executable, "-m", "lld_monitor.cli", "dashboard", str(tmp_path)]
    cmd += ["--host", "not_a_host", "--port", str(_free_port())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not_a_host" in lines[0] and "Traceback" not in proc.stderr
    assert "http://" not in proc.stdout
