"""``lld-monitor analyze``: JSON schema, human summary, HTML report, exit 2 on unknown files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.cli import main
from lld_monitor.events import Alert
from lld_monitor.importers import load_table
from lld_monitor.report import build_figure, write_report
from lld_monitor.report.charts import PANELS, PHASE_COLORS, SIGNAL_COLORS

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "importers"


def _analyze_run():
    from lld_monitor.analysis import analyze_run

    return analyze_run


def _collapsing_csv(path: Path) -> Path:
    """A 200-step run: reward rises then falls to 0 after step 150, grad norm explodes, LLD signals
    fall (correct log-prob flat, then decaying, then dropping); written as a canonical CSV."""
    steps = np.arange(1, 201)
    reward = np.where(
        steps < 150, 0.2 + 0.4 * steps / 150, np.maximum(0.0, 0.6 - (steps - 150) / 20)
    )
    logp = np.where(steps < 60, -0.3, -0.3 - 0.004 * (steps - 60))
    logp = np.where(steps < 150, logp, logp - 0.08 * (steps - 150))
    grad = np.where(steps < 150, 0.3, 0.3 * np.exp((steps - 150) / 8))
    entropy = np.where(steps < 150, 0.8, 0.8 + 0.05 * (steps - 150))
    frac = np.where(steps < 60, 0.35, np.minimum(0.95, 0.35 + 0.005 * (steps - 60)))
    pd.DataFrame(
        {
            C.STEP: steps,
            C.REWARD_MEAN: reward,
            C.GRAD_NORM: grad,
            C.ENTROPY: entropy,
            C.LOGP_CORRECT: logp,
            C.LOGP_INCORRECT: logp - 0.2,
            C.FRAC_CORRECT_DISPLACED: frac,
            C.DELTA_CORRECT: np.where(steps < 60, 0.01, -0.05),
        }
    ).to_csv(path, index=False)
    return path


# --- JSON -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["trainer_state.json", "verl_metrics.jsonl", "wandb_history.csv", "trl_console.log"]
)
def test_json_is_one_object_with_exactly_the_schema_keys(name, capsys):
    _analyze_run()
    assert main(["analyze", str(FIX / name), "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object on one line
    doc = json.loads(out)
    assert doc["schema_version"] == 2
    assert set(doc) == {
        "schema_version",
        *("phases", "alerts", "collapse_step", "collapse", "signals"),  # Analysis.to_dict()
        *("source", "format", "other_sources", "rows", "first_step", "last_step"),  # as the text
        *("step_source", "step_note", "notes", "story", "unmapped_columns"),
    }
    assert doc["format"] == load_table(FIX / name).attrs["source_format"]
    assert doc["other_sources"] == []  # a file, not an output folder
    assert isinstance(doc["notes"], list) and doc["step_note"]
    assert set(doc["signals"]) == {"used", "missing"}
    for seg in doc["phases"]:
        assert set(seg) == {"phase", "start_step", "end_step"}
        assert seg["phase"] in C.PHASES
    for alert in doc["alerts"]:
        assert set(alert) == {
            *("step", "kind", "severity", "headline", "since_step", "actions", "message"),
            *("evidence", "repeats"),
        }
        assert alert["severity"] in C.SEVERITIES
    assert doc["collapse_step"] is None or isinstance(doc["collapse_step"], int)
    assert set(doc["collapse"]) == {"reward_fell", "phase_start", "alert"}
    assert doc["collapse"]["reward_fell"] == doc["collapse_step"]


def test_json_equals_the_analysis_of_the_imported_table(tmp_path, capsys):
    analyze_run = _analyze_run()
    path = _collapsing_csv(tmp_path / "run.csv")
    assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = json.loads(json.dumps(analyze_run(load_table(path)).to_dict()))
    evidence = [a.pop("evidence") for a in doc["alerts"]]  # (--json adds each alert's numbers)
    assert {k: doc[k] for k in expected} == expected
    assert len(evidence) == len(expected["alerts"]) and all(isinstance(e, dict) for e in evidence)
    assert doc["rows"] == 200 and doc["step_source"] == "logged" and doc["format"] == "csv"
    # foreign logs lack the LLD columns and the analysis says so
    assert main(["analyze", str(FIX / "trainer_state.json"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert C.LOGP_CORRECT in doc["signals"]["missing"]


# --- human summary --------------------------------------------------------------------------------


def test_human_summary_names_format_steps_phases_and_signals(capsys):
    _analyze_run()
    assert main(["analyze", str(FIX / "verl_console.log")]) == 0
    out = capsys.readouterr().out
    assert "format:   verl_console" in out
    assert "3 rows, step 1 to 3" in out
    for label in ("phases:", "alerts:", "collapse:", "signals used:", "signals missing:"):
        assert label in out


# --- HTML -----------------------------------------------------------------------------------------


def test_html_report_is_self_contained(tmp_path, capsys):
    _analyze_run()
    csv = _collapsing_csv(tmp_path / "run.csv")
    out = tmp_path / "report" / "run.html"
    assert main(["analyze", str(csv), "--json", "--html", str(out)]) == 0
    json.loads(capsys.readouterr().out)  # stdout stays one JSON object with --html
    page = out.read_text(encoding="utf-8")
    assert "plotly" in page.lower() and "Plotly.newPlot" in page
    assert re.search(r"<script[^>]*\bsrc\s*=", page) is None  # no CDN, no external script
    assert len(page) > 1_000_000  # plotly.js itself is inlined (several MB)


def _standin_analysis():
    """A hand-made analysis (the report is under test, not the analyzer)."""
    seg = SimpleNamespace
    return SimpleNamespace(
        phases=[
            seg(phase="healthy", start_step=1, end_step=59),
            seg(phase="stagnation", start_step=60, end_step=99),
            seg(phase="collapse", start_step=100, end_step=120),
        ],
        alerts=[
            Alert(60, "stagnation", "warning", "logp_correct flat (-0.30) while reward rose 0.2"),
            Alert(100, "collapse", "critical", "grad norm 12.5x its median"),
        ],
        collapse_step=100,
        signals_used=[C.REWARD_MEAN, C.GRAD_NORM],
        signals_missing=[C.LLDS_LOSS],
    )


def test_report_figure_panels_phases_and_alerts():
    steps = np.arange(1, 121)
    df = pd.DataFrame(
        {
            C.STEP: steps,
            C.REWARD_MEAN: np.linspace(0, 1, 120),
            C.GRAD_NORM: np.full(120, 0.5),
            C.FRAC_CORRECT_DISPLACED: np.linspace(0.2, 0.6, 120),
        }
    )
    fig = build_figure(df, _standin_analysis())
    layout = fig.layout
    # the phase strip + one row per PANELS entry (the dashboard's definition); grad norm log-scaled
    assert len([k for k in layout if k.startswith("yaxis")]) == 1 + len(PANELS)
    grad_row = 2 + next(i for i, p in enumerate(PANELS) if p.series[0][0] == C.GRAD_NORM)
    assert layout[f"yaxis{grad_row}"].type == "log"
    # each phase shaded once, through every row, in its phase colour
    rects = [s for s in layout.shapes if s.type == "rect"]
    # (steps 1-59, 60-99, 100-120: touching at the half steps, outer edges widened by half a step)
    assert [(r.x0, r.x1) for r in rects] == [(0.5, 59.5), (59.5, 99.5), (99.5, 120.5)]
    assert rects[2].fillcolor == PHASE_COLORS["collapse"]
    # and the strip holds the phases as segments, widened by half a step so neighbours touch
    strip = next(t for t in fig.data if t.type == "bar")
    assert list(strip.base) == [0.5, 59.5, 99.5] and list(strip.x) == [59.0, 40.0, 21.0]
    # the 0.5 line on the share-displaced panel
    frac_row = 2 + next(
        i for i, p in enumerate(PANELS) if p.series[0][0] == C.FRAC_CORRECT_DISPLACED
    )
    assert any(s.type == "line" and s.y0 == 0.5 and s.yref == f"y{frac_row}" for s in layout.shapes)
    # the collapse step: a solid red line through every row
    assert any(s.type == "line" and s.x0 == 100 and s.line.dash == "solid" for s in layout.shapes)
    # alerts: hoverable markers on the strip with the message and kind
    events = next(t for t in fig.data if t.name.endswith("· events"))
    assert list(events.x) == [60.0, 100.0]
    hover = " ".join(events.text)
    assert "logp_correct flat (-0.30)" in hover and "grad norm 12.5x" in hover
    assert "stagnation [warning]" in hover and "collapse [critical]" in hover
    # one run: each signal in its own colour, the same in every panel
    reward = next(t for t in fig.data if t.name.endswith(C.REWARD_MEAN))
    assert reward.line.color == SIGNAL_COLORS[C.REWARD_MEAN]
    assert len(reward.x) == 120
    # panels without data say what is missing
    texts = [a.text for a in layout.annotations]
    assert any(t.startswith("not logged: " + C.LOGP_CORRECT) for t in texts)


def test_write_report_without_cli(tmp_path):
    df = load_table(FIX / "trainer_state.json")
    out = write_report(df, _standin_analysis(), tmp_path / "r.html")
    page = out.read_text(encoding="utf-8")
    assert "trl_trainer_state" in page and "grad norm 12.5x its median" in page
    assert re.search(r"<script[^>]*\bsrc\s*=", page) is None


# --- errors ---------------------------------------------------------------------------------------


def test_unknown_file_exit_2_and_one_line_stderr(tmp_path):
    cmd = [sys.executable, "-m", "lld_monitor.cli", "analyze", str(FIX / "unknown.txt")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("lld-monitor analyze: ") and "expected" in lines[0]


@pytest.mark.parametrize("make", ["missing", "binary", "empty_dir"])
def test_unreadable_inputs_exit_2(tmp_path, capsys, make):
    if make == "missing":
        path = tmp_path / "nope.json"
    elif make == "binary":
        path = tmp_path / "x.bin"
        path.write_bytes(bytes(range(256)))
    else:
        path = tmp_path / "empty"
        path.mkdir()
    assert main(["analyze", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1


def test_json_on_our_run_folder_and_a_checkpoint_folder(tmp_path, capsys):
    _analyze_run()
    from lld_monitor import runlog

    with runlog.RunWriter(tmp_path / "run") as w:
        for step in range(1, 31):
            w.log_step({C.STEP: step, C.REWARD_MEAN: step / 30, C.GRAD_NORM: 0.5})
    assert main(["analyze", str(tmp_path / "run"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert C.REWARD_MEAN in doc["signals"]["used"]
    # a TRL checkpoint folder: its trainer_state.json is read
    ckpt = tmp_path / "checkpoint-20"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text((FIX / "trainer_state.json").read_text())
    assert main(["analyze", str(ckpt)]) == 0
    assert "format:   trl_trainer_state" in capsys.readouterr().out


def test_unwritable_html_exit_2_one_line(tmp_path, capsys):
    _analyze_run()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    # OUT's parent is a regular file: the report cannot be written
    assert (
        main(["analyze", str(FIX / "trainer_state.json"), "--html", str(blocker / "r.html")]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lld-monitor analyze: cannot write")


# --- what the analysis says about its input ------------------------------------------------------


def test_json_and_text_say_the_step_source_and_the_warmup_of_a_short_run(tmp_path, capsys):
    _analyze_run()
    path = tmp_path / "short.csv"
    s = np.arange(1, 21)
    pd.DataFrame({C.STEP: s, C.REWARD_MEAN: 0.1 + 0.01 * s, C.GRAD_NORM: 0.5}).to_csv(
        path, index=False
    )
    assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["phase"] for p in doc["phases"]] == ["unknown"]
    assert doc["step_source"] == "logged" and (doc["first_step"], doc["last_step"]) == (1, 20)
    warm = [n for n in doc["notes"] if "warm-up" in n]
    assert warm and "20 rows, steps 1-20" in warm[0] and "shorter than" in warm[0]
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "note: this run (20 rows, steps 1-20) is shorter than the trend detector's warm-up" in out
    )
    # what it would take, and that the collapse test was not held back
    assert "would take logp_correct over steps 1-61" in out
    assert "collapse test judged every row from the 9th" in out
    assert "(logged: step from the log's own step column)" in out


def test_dropped_cells_lines_and_fractional_steps_are_counted_in_the_notes(tmp_path, capsys):
    _analyze_run()
    path = tmp_path / "run.jsonl"
    lines = [
        json.dumps({C.STEP: s, C.REWARD_MEAN: 0.1 * s, C.GRAD_NORM: 0.5}) for s in range(1, 31)
    ]
    lines[9] = '{"step": 10, "reward_mean": oops'  # a garbage line in the middle
    lines[14] = json.dumps({C.STEP: 15, C.REWARD_MEAN: "n/a?", C.GRAD_NORM: "high"})
    lines[19] = json.dumps({C.STEP: 19.5, C.REWARD_MEAN: 2.0})  # fractional: taken as step 19
    path.write_text("\n".join(lines) + "\n")
    assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    notes = "\n".join(doc["notes"])
    assert "1 line(s) that are not JSON objects were skipped (line 10)" in notes
    assert "2 cell(s) of known metrics were not numbers" in notes
    assert "1 row(s) had a fractional step (e.g. 19.5): taken as its whole part" in notes
    assert "1 row(s) repeat the step of an earlier row" in notes  # 19.5 -> 19, merged
    # 30 lines - the garbage one - step 15 (no readable metric left) - 19.5 merged into 19
    assert doc["rows"] == 27


def test_report_strip_does_not_promise_a_click_through():
    df = pd.DataFrame({C.STEP: [1, 2, 3], C.REWARD_MEAN: [0.1, 0.2, 0.3]})
    titles = [a.text for a in build_figure(df, _standin_analysis()).layout.annotations]
    assert titles[0].startswith("Phases and events") and "click" not in titles[0]


# --- --fail-on (CI exit code) ---------------------------------------------------------------------

SAMPLE_AUTO = Path(__file__).resolve().parents[2] / "sample_runs" / "auto"


@pytest.mark.parametrize(
    ("run", "rc"),
    [("s1-small-32upd-lr3e-3-seed0-off", 1), ("default-seed0-off", 0)],
)
def test_fail_on_warning_exit_code_through_the_cli(run, rc):
    """The real command on real toy runs: s1 seed 0 raises a displacement warning (and a
    collapse), default seed 0 raises nothing; the analysis is printed either way."""
    cmd = [sys.executable, "-m", "lld_monitor.cli", "analyze", str(SAMPLE_AUTO / run)]
    proc = subprocess.run(
        [*cmd, "--fail-on", "warning"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == rc, proc.stderr
    assert "alerts:" in proc.stdout
    assert ("[warning] displacement" in proc.stdout) == (rc == 1)


def test_fail_on_severity_ranks(capsys):
    """s1 seed 5 with automatic LLDS raises only warnings (displacement, decay, reward_decline)
    and infos: --fail-on critical passes, --fail-on warning fails, no --fail-on passes; a bad
    severity is a usage error (exit 2). Its vanilla twin collapses (accuracy 0 from step ~40):
    a critical alert, so --fail-on critical fails there."""
    dead = str(SAMPLE_AUTO / "s1-small-32upd-lr3e-3-seed1-off")
    assert main(["analyze", dead, "--json", "--fail-on", "critical"]) == 1
    assert "critical" in {a["severity"] for a in json.loads(capsys.readouterr().out)["alerts"]}
    run = str(SAMPLE_AUTO / "s1-small-32upd-lr3e-3-seed5-auto")
    assert main(["analyze", run, "--json", "--fail-on", "critical"]) == 0
    result = json.loads(capsys.readouterr().out)
    severities = {a["severity"] for a in result["alerts"]}
    assert severities == {"warning", "info"}
    assert main(["analyze", run, "--json", "--fail-on", "warning"]) == 1
    assert json.loads(capsys.readouterr().out)["alerts"] == result["alerts"]
    assert main(["analyze", run, "--json"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["analyze", run, "--fail-on", "info"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_the_collapse_line_names_a_mode_collapse_that_kept_the_reward(tmp_path, capsys):
    """A run whose completions shrank to a few tokens while the reward held is not reported
    as 'collapse: none detected': the line names the mode collapse (a warning, not LLD)."""
    from lld_monitor.datasets import make_standard_run, write_run

    # the first seed (from 3) whose mode collapse keeps the reward (the generator flips a coin)
    for seed in range(3, 40):
        run = make_standard_run("mode_collapse", seed, short=True)
        r = run.steps[C.REWARD_MEAN]
        if abs(r.iloc[-5:].mean() - r.iloc[len(r) // 3 : len(r) // 2].mean()) < 0.1:
            break
    path = write_run(run, tmp_path / "run")
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("collapse:"))
    step = next(a for a in re.finditer(r"step (\d+) \[warning\] mode_collapse", out))
    assert line == f"collapse: none in the reward; mode_collapse at step {step.group(1)} " + (
        "(warning, not LLD)"
    ), out


def test_json_alerts_carry_their_evidence_as_strict_json(capsys):
    """--json gives each alert's numbers (the level shift's held and recent rewards here), with
    no NaN token: a strict parser reads it."""
    run = str(SAMPLE_AUTO / "s1-small-32upd-lr3e-3-seed1-off")
    assert main(["analyze", run, "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    collapse = next(a for a in result["alerts"] if a["kind"] == "collapse")
    ev = collapse["evidence"]
    assert ev["detector"] == "level_shift" and ev["reward_held"] > ev["reward_recent"]
    assert all("evidence" in a for a in result["alerts"])


def test_a_closed_pipe_ends_the_command_without_a_traceback():
    """`lld-monitor analyze RUN | head -1`: the reader closes the pipe after one line."""
    run = str(SAMPLE_AUTO / "s1-small-32upd-lr3e-3-seed0-off")
    # `true` reads nothing and exits at once: every write of the command meets a closed pipe
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f"set -o pipefail; {sys.executable} -m lld_monitor.cli analyze {run} | true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_long_analysis_reports_progress_on_stderr(tmp_path, capsys, monkeypatch):
    """``analyze`` of one run says how far it is on stderr once the work takes a while (here:
    at once); stdout keeps exactly the JSON; ``replay`` reports after every chunk of rows."""
    import io

    from lld_monitor.analysis import offline
    from lld_monitor.testing import make_run

    monkeypatch.setattr(offline, "REPLAY_CHUNK", 100)
    steps = make_run("healthy", n_steps=450, seed=0).steps
    seen: list[tuple[int, int]] = []
    offline.replay(offline.prepare_steps(steps), progress=lambda d, t: seen.append((d, t)))
    assert seen == [(100, 450), (200, 450), (300, 450), (400, 450), (450, 450)]

    monkeypatch.setattr(offline, "PROGRESS_AFTER_S", 0.0)
    log = io.StringIO()  # not a terminal: the first and the last line only
    tick = offline.progress_line(log, "analyze", "rows analysed")
    for done in (100, 200, 300, 450):
        tick(done, 450)
    assert log.getvalue() == "analyze: 100/450 rows analysed\nanalyze: 450/450 rows analysed\n"

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()  # a terminal: one line, rewritten
    tick = offline.progress_line(tty, "analyze", "rows analysed")
    tick(100, 450)
    tick(450, 450)
    assert tty.getvalue() == "analyze: 100/450 rows analysed\ranalyze: 450/450 rows analysed\n"

    path = tmp_path / "run.csv"
    steps.to_csv(path, index=False)
    assert main(["analyze", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["signals"]["used"]  # stdout: the JSON object alone
    assert err.splitlines()[-1] == "analyze: 450/450 rows analysed"


def test_triage_reports_progress_through_the_same_line(tmp_path, monkeypatch):
    """The triage of a folder writes its progress with the same helper: first and last line in a
    log, ``triage: i/n runs analysed``."""
    import io

    from lld_monitor.analysis import offline
    from lld_monitor.analysis.triage import triage
    from lld_monitor.testing import make_run, write_run

    for i, kind in enumerate(("healthy", "collapse", "healthy")):
        write_run(make_run(kind, n_steps=200, seed=i), tmp_path / f"r{i}")
    monkeypatch.setattr(offline, "PROGRESS_AFTER_S", 0.0)
    log = io.StringIO()
    verdicts = triage(tmp_path, progress=log, jobs=1)
    assert len(verdicts) == 3
    assert log.getvalue() == "triage: 1/3 runs analysed\ntriage: 3/3 runs analysed\n"


def test_analyze_has_glibc_return_large_freed_blocks():
    import platform

    from lld_monitor.cli.analyze import return_large_frees

    done = return_large_frees()
    assert isinstance(done, bool)
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert done  # (mallopt accepted the threshold)
