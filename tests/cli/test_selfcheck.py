"""``lld-monitor selfcheck`` through the real CLI entry point."""

from __future__ import annotations

from lld_monitor import columns as C
from lld_monitor.cli import main, selfcheck


def test_selfcheck_passes(capsys):
    assert main(["selfcheck"]) == 0
    out = capsys.readouterr().out
    assert "selfcheck: OK (4 checks)" in out
    assert out.count("  ok    ") == 4 and "FAIL" not in out


def test_selfcheck_keep_writes_a_loadable_run(tmp_path, capsys):
    from lld_monitor.runlog import load_run

    assert main(["selfcheck", "--keep", str(tmp_path)]) == 0
    run = load_run(tmp_path / "selfcheck_run")
    assert list(run.steps[C.STEP]) == [0, 1]
    assert run.steps[C.N_CORRECT].iloc[0] == 2.0
    assert run.finished
    assert str(tmp_path) in capsys.readouterr().out


def test_selfcheck_reports_a_wrong_value(monkeypatch, capsys):
    # A checker that cannot fail is useless: give it a wrong expectation and it must say so.
    wrong = dict(selfcheck._M_EXPECTED)
    wrong[C.DELTA_CORRECT] = 0.5
    monkeypatch.setattr(selfcheck, "_M_EXPECTED", wrong)
    assert main(["selfcheck"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  LLD metrics" in out and "delta_correct=0.0625 (expected 0.5)" in out
    # the run-log check compares its read-back row with the same expectation
    assert "selfcheck: FAILED (2 of 4 checks)" in out


def test_selfcheck_bad_device(capsys):
    assert main(["selfcheck", "--device", "no-such-device"]) == 1
    assert "--device cpu" in capsys.readouterr().out
