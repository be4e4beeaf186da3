"""Verdicts that say what is known (issue 50, item 1): a run the tool cannot judge is "can't tell"
with its reason, never a green "healthy"; the offline analysis raises on a non-finite reward as
the live monitor does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from lld_monitor.analysis.triage import analyse_one, triage
from lld_monitor.cli import main

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_runs" / "auto" / "default-seed0-off"  # a healthy, closed run


def _csv(path: Path, n: int, reward=lambda s: 0.3 + 0.01 * s) -> Path:
    s = np.arange(1, n + 1)
    pd.DataFrame({"step": s, "reward": [reward(i) for i in s], "grad_norm": 0.5}).to_csv(
        path, index=False
    )
    return path


def test_a_12_row_run_is_cant_tell_too_short(tmp_path):
    v, _ = analyse_one(_csv(tmp_path / "r.csv", 12), tmp_path, jobs=1)
    assert v.verdict == "cant_tell" and v.reason.startswith("too short: 12 rows")
    v, _ = analyse_one(_csv(tmp_path / "r40.csv", 40), tmp_path, jobs=1)
    assert v.verdict == "healthy" and v.reason is None


def test_a_log_without_a_reward_is_cant_tell(tmp_path):
    path = tmp_path / "g.csv"
    pd.DataFrame({"step": range(1, 41), "grad_norm": 0.5, "loss": 0.1}).to_csv(path, index=False)
    v, _ = analyse_one(path, tmp_path, jobs=1)
    assert v.verdict == "cant_tell" and v.reason.startswith("no reward logged")


def test_a_run_never_closed_is_cant_tell_and_a_closed_one_healthy(tmp_path):
    v, _ = analyse_one(SAMPLE, SAMPLE.parent, jobs=1)
    assert v.verdict == "healthy"
    killed = tmp_path / "killed"
    shutil.copytree(SAMPLE, killed)
    (killed / "closed.json").unlink()  # kill -9: no closed.json
    v, _ = analyse_one(killed, tmp_path, jobs=1)
    assert v.verdict == "cant_tell" and "no closed.json" in v.reason


def test_a_nan_reward_is_a_critical_nonfinite_offline(tmp_path):
    path = tmp_path / "nan.csv"
    rows = ["step,reward,grad_norm"] + [
        f"{s},{'nan' if s > 20 else 0.3 + 0.01 * s},0.5" for s in range(1, 31)
    ]
    path.write_text("\n".join(rows) + "\n")
    v, _ = analyse_one(path, tmp_path, jobs=1)
    assert v.verdict == "critical" and v.worst["kind"] == "nonfinite" and v.worst["step"] == 21
    assert "reward=nan" in v.worst["message"]
    # a blank reward cell is a missing value, not a failure
    path.write_text(path.read_text().replace("nan", ""))
    v, _ = analyse_one(path, tmp_path, jobs=1)
    assert v.verdict != "critical"


def test_the_triage_text_json_and_picker_say_cant_tell_with_the_reason(tmp_path, capsys):
    from lld_monitor.report.dashboard.sources import picker_label

    _csv(tmp_path / "short.csv", 12)
    _csv(tmp_path / "long.csv", 40)
    assert main(["analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 can't tell, 1 healthy" in out
    assert "can't tell short.csv" in out and "(too short: 12 rows" in out
    assert main(["analyze", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    short = next(r for r in doc["runs"] if r["name"] == "short.csv")
    assert short["verdict"] == "cant_tell" and short["reason"].startswith("too short")
    assert doc["counts"]["cant_tell"] == 1
    v = next(v for v in triage(tmp_path, jobs=1) if v.name == "short.csv")
    assert picker_label("short.csv", v).startswith("? short.csv · can't tell (too short")


AUTO = ROOT / "sample_runs" / "auto" / "s1-small-32upd-lr3e-3-seed0-auto"  # LLDS switched on


def test_analyze_tells_the_runs_story_text_and_json(capsys):
    assert main(["analyze", str(AUTO)]) == 0
    out = capsys.readouterr().out
    assert "story:\n  step 14: intervention llds_enable: LLDS switched on (lambda=0.2)" in out
    assert "  ending: closed (ok), 400 rows" in out
    assert main(["analyze", str(AUTO), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["story"][0].startswith("step 14: intervention llds_enable")
    assert doc["story"][-1] == "ending: closed (ok), 400 rows"


def test_a_torn_tail_and_a_killed_run_are_told(tmp_path, capsys):
    torn = tmp_path / "torn"
    shutil.copytree(SAMPLE, torn)
    lines = (torn / "steps.jsonl").read_text().splitlines(keepends=True)
    (torn / "steps.jsonl").write_text("".join(lines[:-1]) + lines[-1][:20])  # a torn last line
    assert main(["analyze", str(torn), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "closed.json counts 400: a torn or short tail of 1 row(s)" in doc["story"][-1]
    killed = tmp_path / "killed"
    shutil.copytree(SAMPLE, killed)
    (killed / "closed.json").unlink()
    events = (killed / "events.jsonl").read_text().splitlines(keepends=True)
    (killed / "events.jsonl").write_text("".join(e for e in events if '"kind":"end"' not in e))
    assert main(["analyze", str(killed), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["story"][-1].startswith("ending: not closed (no closed.json, no end event)")
    # a foreign log has no story of its own
    assert (
        main(
            [
                "analyze",
                str(ROOT / "tests" / "fixtures" / "importers" / "trainer_state.json"),
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["story"] == []


def test_the_html_report_tells_the_story(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["analyze", str(AUTO), "--html", str(out)]) == 0
    page = out.read_text()
    assert '<p class="lld-story">story:<br>step 14: intervention llds_enable' in page
    assert "ending: closed (ok), 400 rows</p>" in page
    foreign = tmp_path / "f.html"
    ts = ROOT / "tests" / "fixtures" / "importers" / "trainer_state.json"
    assert main(["analyze", str(ts), "--html", str(foreign)]) == 0
    assert "lld-story" not in foreign.read_text()


def test_the_html_reports_figure_stars_the_intervention():
    """The switch of automatic LLDS is a star on the phase strip at its step (the dashboard's
    marker for an intervention); a foreign log's figure has no star."""
    from lld_monitor.analysis import analyze_run
    from lld_monitor.importers import load_table
    from lld_monitor.report.html import build_figure

    df = load_table(AUTO)
    fig = build_figure(df, analyze_run(df))
    events = next(t for t in fig.data if (t.name or "").endswith("events"))
    stars = [x for x, s in zip(events.x, events.marker.symbol) if s == "star"]
    assert list(stars) == [14.0]
    ts = load_table(ROOT / "tests" / "fixtures" / "importers" / "trainer_state.json")
    fig2 = build_figure(ts, analyze_run(ts))
    assert not any(
        "star" in (t.marker.symbol or ()) for t in fig2.data if (t.name or "").endswith("events")
    )


def test_a_garbled_line_is_a_note_not_a_python_warning(tmp_path):
    """A garbled middle line of steps.jsonl: analyze says it on a note line; no raw
    RuntimeWarning with a source path reaches the user (it did, from runlog/reader.py)."""
    import shutil
    import subprocess
    import sys

    run = tmp_path / "run"
    shutil.copytree(ROOT / "sample_runs" / "auto" / "default-seed0-off", run)
    lines = (run / "steps.jsonl").read_text().splitlines(keepends=True)
    lines.insert(50, '{"step": 51, "rew\n')
    (run / "steps.jsonl").write_text("".join(lines))
    res = subprocess.run(
        [sys.executable, "-W", "default", "-m", "lld_monitor.cli", "analyze", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "RuntimeWarning" not in res.stderr and "reader.py" not in res.stderr, res.stderr
    assert "note: skipped 1 garbled or torn line(s) of the run log (1 in steps.jsonl)" in res.stdout
