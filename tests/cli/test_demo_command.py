"""The command the demo prints for the dashboard is runnable as printed."""

from __future__ import annotations

import sys

from lld_monitor.cli.demo import _own_command


def test_the_printed_command_is_the_one_that_ran(monkeypatch, tmp_path):
    exe = tmp_path / "venv" / "bin" / "lld-monitor"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    # started by its path (make demo: .venv/bin/lld-monitor) and not on PATH: that path
    monkeypatch.setattr(sys, "argv", [str(exe), "demo"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert _own_command() == str(exe)
    # on PATH as that very file: the bare name
    monkeypatch.setenv("PATH", f"{exe.parent}:/usr/bin:/bin")
    assert _own_command() == "lld-monitor"
    # run some other way (python -m, tests): the bare name
    monkeypatch.setattr(sys, "argv", ["/x/pytest"])
    assert _own_command() == "lld-monitor"
