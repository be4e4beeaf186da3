"""The dashboard through Streamlit's AppTest on real run folders written by RunWriter.

Also the dashboard's pure helpers (decimation, EMA, token HTML, path checks) and the
``lld-monitor dashboard`` command's argument handling. The browser test is separate.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.events import Alert, make_event
from lld_monitor.runlog import RunWriter

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

from lld_monitor.report import charts
from lld_monitor.report.dashboard import service, sources
from lld_monitor.report.dashboard import tokens as tok

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
TIMEOUT = 60

# --- fixtures: real run folders -----------------------------------------------------------------


def step_row(s: int) -> dict[str, float]:
    """A deterministic step row: reward rises, logp of correct responses falls slowly, the grad
    norm drifts up gently (no surge: the analysis raises a decay, no collapse, before step 50)."""
    return {
        C.STEP: s,
        C.REWARD_MEAN: 0.2 + 0.005 * s,
        C.ACCURACY: 0.1 + 0.005 * s,
        C.LOGP_CORRECT: -0.5 - 0.01 * s,
        C.LOGP_INCORRECT: -0.9 - 0.01 * s,
        C.DELTA_CORRECT: -0.01 * (s % 3),
        C.DELTA_INCORRECT: -0.02,
        C.FRAC_CORRECT_DISPLACED: 0.3 + 0.004 * s,
        C.GRAD_NORM: 1.0 + 0.01 * s,
        C.ENTROPY: 0.8,
        C.LLDS_ENABLED: 1 if s >= 20 else 0,
        C.LLDS_LAMBDA: 0.2 if s >= 20 else 0.0,
        C.LLDS_LOSS: 0.01 if s >= 20 else 0.0,
    }


#: One response of step 40: a search action, tool feedback holding markup, an answer action.
#: Change of its generated tokens: -0.5 + 0.25 + (-1.0) = -1.25 (tool feedback has none).
TOKENS_40 = [
    # (text, action, generated, delta)
    ("<search>", 0, 1, -0.5),
    ("who", 0, 1, 0.25),
    ("<script>alert(1)</script>", -1, 0, math.nan),
    ("<answer>", 1, 1, -1.0),
]


def write_run(
    path: Path, n_steps: int, *, simulated: bool = False, close: bool = True
) -> RunWriter:
    """A run folder with ``n_steps`` rows, one alert, one intervention, token samples at step 40."""
    w = RunWriter(path, meta={"simulated": simulated} if simulated else None)
    for s in range(n_steps):
        w.log_step(step_row(s))
    if n_steps > 30:
        w.log_event(
            # (before the analyzer's own decay at 27: the header's worst alert is the first
            # sighting of the worst severity, triage.worst_alert)
            make_event("alert", 20, "decay", "logp of *correct* fell <0.3> nats", "warning")
        )
        w.log_event(make_event("intervention", 31, "llds_on", "LLDS switched on, lambda 0.2"))
    if n_steps > 40:
        rows = [
            {
                C.TOK_RESPONSE: 0,
                C.TOK_POSITION: i,
                C.TOK_TOKEN_ID: 100 + i,
                C.TOK_TEXT: text,
                C.TOK_ACTION: action,
                C.TOK_GENERATED: gen,
                C.TOK_LOGP_OLD: -1.0,
                C.TOK_DELTA: delta,
                C.TOK_REWARD: 1.0,
                C.TOK_ADVANTAGE: 0.8,
                C.TOK_CORRECT: 1,
            }
            for i, (text, action, gen, delta) in enumerate(TOKENS_40)
        ]
        w.log_tokens(rows, step=40)
    if close:
        w.close()
    return w


ROOT_DIR = Path(__file__).resolve().parents[2]


def make_app(monkeypatch: pytest.MonkeyPatch, *paths: Path, query: str | None = None) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", *map(str, paths)])
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    if query is not None:
        at.query_params["run"] = query
    return at


def wait_background(seconds: float = 30.0) -> None:
    """Until no background analysis of the dashboard is under way (at most ``seconds``)."""
    import time

    deadline = time.monotonic() + seconds
    while service.background_pending() and time.monotonic() < deadline:
        time.sleep(0.05)


def option_names(at: AppTest) -> list[str]:
    """The run names of the picker's options (labels read "<badge> <name> · <verdict> ...")."""
    return [o.split(" ", 1)[1].split(" · ")[0] for o in at.multiselect[0].options]


def all_text(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    parts += (
        [e.value for e in at.info] + [e.value for e in at.warning] + [e.value for e in at.error]
    )
    return "\n".join(parts)


def step_slider(at: AppTest):
    return next(s for s in at.slider if s.label.startswith("Step range"))


def arr(value: object) -> np.ndarray:
    """A plotly JSON array: a list, or a typed array ``{"dtype": ..., "bdata": base64}``."""
    if isinstance(value, dict):
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
    return np.asarray(value)


def chart_spec(at: AppTest) -> dict:
    charts_ = at.get("plotly_chart")
    assert len(charts_) == 1
    return json.loads(charts_[0].proto.spec)


# --- the app --------------------------------------------------------------------------------------


def test_empty_root_says_how_runs_appear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    assert len(at.info) == 1
    assert "No runs found under" in at.info[0].value
    assert "LLDMonitor" in at.info[0].value
    assert not at.get("plotly_chart")


def test_run_renders_header_charts_widgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_run(tmp_path / "exp1", 50, simulated=True)
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    text = all_text(at)
    assert "SIMULATED" in text
    assert "finished" in text  # the writer closed the run
    assert "50 rows, last step 49" in text
    assert "on, λ = 0\\.2" in text  # last row: LLDS on with lambda 0.2 (Markdown-escaped)
    # the alert's message, escaped so that Markdown does not eat the asterisks or the <...>
    assert "logp of \\*correct\\* fell \\<0\\.3\\> nats" in text
    assert option_names(at) == ["exp1"]
    assert at.multiselect[0].value == ["exp1"]
    assert step_slider(at).value == (0, 49)
    spec = chart_spec(at)
    names = {d.get("name") for d in spec["data"]}
    assert f"exp1 · {C.REWARD_MEAN}" in names
    assert f"exp1 · {C.FRAC_CORRECT_DISPLACED}" in names
    assert "exp1 · events" in names
    events = next(d for d in spec["data"] if d.get("name") == "exp1 · events")
    logged = [(x, t) for x, t in zip(arr(events["x"]), events["text"]) if "(run log)" in t]
    assert [x for x, _ in logged] == [20.0, 31.0]
    assert "LLDS switched on" in logged[1][1]
    # the 50% line of the displaced-share panel is drawn
    assert any(s.get("y0") == 0.5 and s.get("y1") == 0.5 for s in spec["layout"]["shapes"])
    assert at.get("download_button")[0].proto.label == "Download CSV"


def test_drilldown_shows_escaped_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_run(tmp_path / "exp1", 50)
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    html = "\n".join(h.proto.body for h in at.html)
    assert "&lt;search&gt;" in html and "&lt;answer&gt;" in html
    assert "<script>" not in html  # the tool feedback's markup is text, not markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "lld-tool" in html and ">A0<" in html and ">A1<" in html
    table = at.dataframe[0].value
    assert table["change (shown tokens)"].iloc[0] == pytest.approx(-1.25)
    assert table[C.TOK_ADVANTAGE].iloc[0] == pytest.approx(0.8)
    assert at.selectbox(key="lld_drill_step:exp1").value == 40


def test_new_rows_appear_and_range_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = write_run(tmp_path / "live", 30, close=False)
    at = make_app(monkeypatch, tmp_path).run()
    assert "30 rows, last step 29" in all_text(at)
    assert ":green-background[live]" in all_text(at)
    slider = step_slider(at)
    assert slider.value == (0, 29)
    for s in range(30, 40):
        w.log_step(step_row(s))
    at.run()
    assert "40 rows, last step 39" in all_text(at)
    slider = step_slider(at)
    assert slider.value == (0, 39)  # reached the last step: follows it
    slider.set_value((5, 20)).run()
    for s in range(40, 45):
        w.log_step(step_row(s))
    at.run()
    assert "45 rows, last step 44" in all_text(at)
    slider = step_slider(at)
    assert slider.value == (5, 20)  # a chosen range survives the refresh
    spec = chart_spec(at)
    reward = next(d for d in spec["data"] if d.get("name") == f"live · {C.REWARD_MEAN} (raw)")
    assert arr(reward["x"]).min() == 5 and arr(reward["x"]).max() == 20
    w.close()
    at.run()
    assert ":gray-background[finished]" in all_text(at)
    assert not at.exception


def test_torn_last_line_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_run(tmp_path / "torn", 10, close=False)
    with open(tmp_path / "torn" / "steps.jsonl", "ab") as f:
        f.write(b'{"step": 10, "reward_me')  # a writer killed mid-line
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    assert "10 rows, last step 9" in all_text(at)


def test_unreadable_runs_get_a_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "meta.json").write_text("{not json")
    (bad / "steps.jsonl").write_text("")
    future = tmp_path / "future"
    future.mkdir()
    (future / "meta.json").write_text(json.dumps({"schema_version": 99}))
    (future / "steps.jsonl").write_text("")
    starting = tmp_path / "starting"
    write_run(starting, 0, close=False)
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    at.multiselect[0].set_value(["bad", "future", "starting"]).run()
    assert not at.exception
    errors = "\n".join(e.value for e in at.error)
    assert "bad" in errors and "unreadable run metadata" in errors
    assert "future" in errors and "schema version 99" in errors
    assert any("no steps logged yet" in i.value for i in at.info)


def test_partial_folder_named_as_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "meta.json").write_text(json.dumps({"schema_version": 1}))  # no steps.jsonl yet
    at = make_app(monkeypatch, partial).run()
    assert not at.exception
    assert len(at.error) == 1
    assert "partial" in at.error[0].value and "missing steps\\.jsonl" in at.error[0].value


def test_foreign_log_is_listed_and_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = {
        "global_step": 3,
        "log_history": [
            {"step": 1, "reward": 0.1, "grad_norm": 1.0, "entropy": 0.9, "loss": 0.0},
            {"step": 2, "reward": 0.2, "grad_norm": 1.5, "entropy": 0.8, "loss": 0.0},
            {"step": 3, "reward": 0.4, "grad_norm": 2.0, "entropy": 0.7, "loss": 0.0},
        ],
    }
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "trainer_state.json").write_text(json.dumps(state))
    (tmp_path / "notes.txt").write_text("just some notes, not a log\n")
    # JSONL the importers recognise but that holds no training rows: not listed
    (tmp_path / "manifest.jsonl").write_text('{"step": 1, "name": "a"}\n{"step": 2, "name": "b"}\n')
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    # the output folder is the run, named as `lld-monitor analyze ROOT` names it
    assert option_names(at) == ["trl"]
    text = all_text(at)
    assert "foreign log \\(trl\\_trainer\\_state\\)" in text
    assert "3 rows, last step 3" in text
    assert "step from the log's own step column" in text  # how the importer found the steps
    spec = chart_spec(at)
    reward = next(d for d in spec["data"] if d.get("name") == f"trl · {C.REWARD_MEAN}")
    assert arr(reward["x"]).tolist() == [1.0, 2.0, 3.0]
    notes = [a["text"] for a in spec["layout"]["annotations"]]
    # no LLD columns in a TRL log: the panels say which columns are missing
    assert f"not logged: {C.DELTA_CORRECT}, {C.DELTA_INCORRECT}" in notes
    assert any("foreign logs carry none" in i.value for i in at.info)
    # the trainer saves its state again with one more step: the dashboard re-imports it
    state["log_history"].append({"step": 4, "reward": 0.5, "grad_norm": 2.5, "loss": 0.0})
    (tmp_path / "trl" / "trainer_state.json").write_text(json.dumps(state))
    at.run()
    assert "4 rows, last step 4" in all_text(at)


def test_runs_appended_to_one_log_are_listed_and_shown_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # three verl runs printed into one console log: three runs in the picker, each its own rows
    lines = []
    for run in (1, 2, 3):
        lines.append(f"(TaskRunner pid={run}) Training Progress:   0%|          | 0/30")
        lines += [
            f"(TaskRunner pid={run}) step:{s} - critic/score/mean:{0.1 * run + 0.001 * s:.3f} - "
            f"actor/grad_norm:{0.5 + 0.01 * s:.2f}"
            for s in range(1, 11 + run)
        ]
    (tmp_path / "runs.log").write_text("\n".join(lines) + "\n")
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    assert sorted(option_names(at)) == ["runs.log [1]", "runs.log [2]", "runs.log [3]"]
    at.multiselect[0].set_value(["runs.log [2]"]).run()
    assert not at.exception
    assert "12 rows, last step 12" in all_text(at)
    spec = chart_spec(at)
    reward = next(d for d in spec["data"] if d.get("name") == f"runs.log [2] · {C.REWARD_MEAN}")
    assert arr(reward["x"]).tolist() == [float(s) for s in range(1, 13)]
    ys = arr(reward["y"])  # (smoothed for the eye): run 2's values, 0.201-0.212, only
    assert ys.min() >= 0.201 - 1e-9 and ys.max() <= 0.212 + 1e-9
    # and the file named alone on the command line: the same three runs
    at2 = make_app(monkeypatch, tmp_path / "runs.log").run()
    assert not at2.exception
    assert sorted(option_names(at2)) == ["runs.log [1]", "runs.log [2]", "runs.log [3]"]


def test_garbage_file_named_as_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    junk = tmp_path / "junk.csv"
    junk.write_text("a,b\nx,y\n")
    at = make_app(monkeypatch, junk).run()
    assert not at.exception
    assert len(at.error) == 1
    assert "junk\\.csv" in at.error[0].value and "unknown format" in at.error[0].value


def test_query_string_cannot_leave_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    write_run(root / "inside", 5)
    write_run(tmp_path / "outside", 5)  # a real run, but not under ROOT
    (root / "link").symlink_to(tmp_path / "outside")  # nor through a symlink
    at = make_app(monkeypatch, root, query="../outside").run()
    assert not at.exception
    assert option_names(at) == ["inside"]
    assert any("Ignored" in w.value and "outside" in w.value for w in at.warning)
    assert "outside" not in json.dumps(at.session_state["lld_runs"])
    at2 = make_app(monkeypatch, root, query="link").run()
    assert any("Ignored" in w.value for w in at2.warning)
    assert option_names(at2) == ["inside"]
    at3 = make_app(monkeypatch, root, query="inside").run()
    assert at3.multiselect[0].value == ["inside"]
    assert not at3.warning


def test_two_runs_overlaid_with_a_legend_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_run(tmp_path / "vanilla", 20)
    write_run(tmp_path / "llds", 25)
    at = make_app(monkeypatch, tmp_path).run()
    at.multiselect[0].set_value(["llds", "vanilla"]).run()
    assert not at.exception
    spec = chart_spec(at)
    groups = {d.get("legendgroup") for d in spec["data"]}
    assert {"llds", "vanilla"} <= groups
    colors = {d["legendgroup"]: d["line"]["color"] for d in spec["data"] if "line" in d}
    assert colors["llds"] != colors["vanilla"]
    assert step_slider(at).value == (0, 24)
    assert at.query_params["run"] == ["llds", "vanilla"]  # the choice is in the URL
    at.multiselect[0].set_value([]).run()
    assert not at.exception
    assert any("Select one or more runs" in i.value for i in at.info)


def test_runs_named_on_the_command_line_are_all_shown_overlaid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lld-monitor dashboard OFF AUTO`` (the demo's printed command) overlays both runs; a
    folder of runs still opens on its first run."""
    write_run(tmp_path / "off", 20)
    write_run(tmp_path / "auto", 25)
    at = make_app(monkeypatch, tmp_path / "off", tmp_path / "auto").run()
    assert not at.exception
    assert at.multiselect[0].value == ["off", "auto"]
    groups = {d.get("legendgroup") for d in chart_spec(at)["data"]}
    assert {"off", "auto"} <= groups
    at = make_app(monkeypatch, tmp_path).run()
    assert len(at.multiselect[0].value) == 1


def test_the_run_picker_shows_each_runs_triage_verdict_worst_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The badges are the verdicts ``lld-monitor analyze ROOT`` prints, in its order, and a
    folder of runs opens on the worst one."""
    from lld_monitor.cli.triage import triage
    from lld_monitor.testing import make_run
    from lld_monitor.testing import write_run as write_sim

    write_sim(make_run("healthy", 200, seed=0), tmp_path / "a-healthy")
    write_sim(make_run("collapse", 260, seed=0), tmp_path / "b-collapse")
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    expected = [(v.name, v.verdict) for v in triage(tmp_path)]
    assert expected == [("b-collapse", "collapsed"), ("a-healthy", "healthy")]
    assert option_names(at) == ["b-collapse", "a-healthy"]  # not the folder's order
    labels = at.multiselect[0].options
    assert labels[0].startswith("✖ b-collapse · collapsed (collapse at step ")
    assert labels[1] == "✓ a-healthy · healthy"
    assert at.multiselect[0].value == ["b-collapse"]


def test_header_names_the_worst_alert_and_the_collapse_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored collapsed demo run: a critical collapse at 73, later warnings up to 398."""
    import shutil

    src = ROOT_DIR / "sample_runs" / "auto" / "s1-small-32upd-lr3e-3-seed0-off"
    shutil.copytree(src, tmp_path / "off")
    import time

    at = make_app(monkeypatch, tmp_path / "off").run()
    for _ in range(40):  # the analysis runs in the background; a rerun collects it
        text = all_text(at).replace("\\", "")  # (markdown escapes)
        if "Collapse:" in text:
            break
        time.sleep(0.25)
        at.run()
    assert not at.exception
    assert "**Worst alert**  \ncollapse (critical) at step 73" in text
    assert "latest: truncation (warning) at step 398" in text  # named as the latest
    assert "Collapse: the reward fell below half its peak at step 73" in text
    # the header's verdict is the picker's, word for word (issue 50: they never contradict)
    label = at.multiselect[0].options[0] if at.multiselect else None
    words = "collapsed (collapse at step 73)"
    assert f"**✖ {words}**" in text
    assert label is None or label.endswith(f"· {words}"), label


def test_header_tells_the_switch_the_story_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored automatic-LLDS run: the LLDS cell says when auto_llds switched it on (it said
    'on' alone, and 'off' before the switch); the story names the intervention and the run's
    ending; the worst alert is its one-line headline, with what to do under it."""
    import shutil
    import time

    src = ROOT_DIR / "sample_runs" / "auto" / "s1-small-32upd-lr3e-3-seed0-auto"
    shutil.copytree(src, tmp_path / "auto")
    at = make_app(monkeypatch, tmp_path / "auto").run()
    for _ in range(40):  # the analysis runs in the background; a rerun collects it
        text = all_text(at).replace("\\", "")
        if "Worst alert**  \nnone" not in text:
            break
        time.sleep(0.25)
        at.run()
    assert not at.exception
    assert "**LLDS**  \non, λ = 0.2 (switched on at step 14)" in text
    assert "step 14: intervention llds_enable: LLDS switched on (lambda=0.2)" in text
    assert "ending: closed (ok), 400 rows" in text
    worst = next(ln for ln in text.split("**Worst alert**  \n")[1].splitlines())
    assert len(worst) < 250 and "z =" not in worst  # a headline, not the evidence
    labels = [e.label for e in at.expander]
    assert any(lb.startswith("What to do now") for lb in labels), labels
    assert any(m.value.startswith("1. ") for m in at.markdown)


def test_an_armed_auto_llds_run_is_not_just_off(tmp_path: Path) -> None:
    """A run with auto_llds armed and LLDS still off says so, with the kinds it waits for."""
    w = RunWriter(
        tmp_path / "armed",
        meta={"config": {"auto_llds": True, "auto_llds_on": ["displacement", "decay"]}},
    )
    for s in range(1, 4):
        w.log_step({**step_row(s), C.LLDS_ENABLED: 0, C.LLDS_LAMBDA: 0.0})
    w.close()
    live = sources.LiveRun(sources.Target("armed", tmp_path / "armed", "run"))
    live.refresh()
    assert live.header(60.0).llds == "off, armed (auto_llds: on at displacement, decay)"


def test_broken_and_odd_runs_never_take_the_page_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_run(tmp_path / "good", 20)
    bad = tmp_path / "a-bad-meta"
    bad.mkdir()
    (bad / "meta.json").write_text("{not json")
    (bad / "steps.jsonl").write_text('{"step": 1, "reward_mean": 0.1}\n')
    huge = RunWriter(tmp_path / "b-huge-steps", fsync_every_s=0)
    for s in (1, 2, 10**18):
        huge.log_step({C.STEP: s, C.REWARD_MEAN: 0.1})
    huge.close()
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    assert "good" in option_names(at)
    for name in ("a-bad-meta", "b-huge-steps", "good"):
        at.multiselect[0].set_value([name]).run()
        assert not at.exception, name


# --- helpers --------------------------------------------------------------------------------------


def test_ema_by_hand() -> None:
    # w = 0.5: s0 = 1; s1 = 0.5*1 + 0.5*3 = 2; NaN kept as NaN; s3 = 0.5*2 + 0.5*6 = 4
    out = charts.ema(np.array([1.0, 3.0, np.nan, 6.0]), 0.5)
    assert out[0] == 1.0 and out[1] == 2.0 and math.isnan(out[2]) and out[3] == 4.0
    with pytest.raises(ValueError, match="EMA weight"):
        charts.ema(np.array([1.0]), 1.0)


def test_decimate_keeps_spikes_and_ends() -> None:
    x = np.arange(10_000, dtype=float)
    y = np.zeros(10_000)
    y[1234] = 50.0  # a grad-norm spike
    y[7777] = -3.0  # a dip
    xs, ys = charts.decimate(x, y, 200)
    assert len(xs) <= 202
    assert 1234.0 in xs and 7777.0 in xs and xs[0] == 0.0 and xs[-1] == 9999.0
    assert ys.max() == 50.0 and ys.min() == -3.0
    assert np.all(np.diff(xs) > 0)


def test_decimate_equals_the_min_max_of_padded_buckets() -> None:
    """``decimate`` against the plain definition (pad to whole buckets with +-inf, min and max
    of each, the ends, indices past the end dropped), on random series with ties, NaN and
    every remainder of the bucket width."""
    rng = np.random.default_rng(0)

    def reference(x: np.ndarray, y: np.ndarray, max_points: int):
        n = len(y)
        if n <= max_points or max_points < 4:
            return x, y
        n_buckets = max_points // 2
        width = -(-n // n_buckets)
        pad = n_buckets * width - n
        lo = np.pad(np.where(np.isnan(y), np.inf, y), (0, pad), constant_values=np.inf)
        hi = np.pad(np.where(np.isnan(y), -np.inf, y), (0, pad), constant_values=-np.inf)
        base = np.arange(n_buckets) * width
        i_min = base + lo.reshape(n_buckets, width).argmin(axis=1)
        i_max = base + hi.reshape(n_buckets, width).argmax(axis=1)
        idx = np.unique(np.concatenate([i_min, i_max, [0, n - 1]]))
        idx = idx[idx < n]
        return x[idx], y[idx]

    for n in [5, 61, 999, 1000, 1001, 4099, 20_000]:
        for max_points in [4, 7, 60, 200, 1000]:
            y = rng.integers(0, 5, n).astype(float)  # many ties
            y[rng.random(n) < 0.05] = np.nan
            if n > 100:
                y[17:60] = np.nan  # a whole bucket of NaN
            x = np.arange(n, dtype=float) * 2.0
            got, want = charts.decimate(x, y, max_points), reference(x, y, max_points)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])


def test_slice_steps_inclusive() -> None:
    df = pd.DataFrame({C.STEP: [0, 2, 4, 6, 8]})
    assert charts.slice_steps(df, (2, 6))[C.STEP].tolist() == [2, 4, 6]


def test_token_colours_and_escaping() -> None:
    assert tok.delta_color(-1.0, 1.0) == "rgba(214,39,40,0.85)"  # fell: red, saturated
    assert tok.delta_color(0.5, 1.0) == "rgba(44,160,44,0.42)"  # rose: green, 0.5 * 0.85 = 0.425
    assert tok.delta_color(float("nan"), 1.0) == "transparent"
    rows = pd.DataFrame(
        {
            C.TOK_POSITION: [1, 0],
            C.TOK_TEXT: ['"x" & y', "<b>"],
            C.TOK_ACTION: [0, 0],
            C.TOK_GENERATED: [1, 1],
            C.TOK_DELTA: [-0.1, 0.1],
        }
    )
    html = tok.render_tokens_html(rows)
    assert html.index("&lt;b&gt;") < html.index("&quot;x&quot; &amp; y")  # sorted by position
    assert "lld-gap" not in html  # positions 0, 1: nothing skipped
    sparse = tok.render_tokens_html(rows.assign(**{C.TOK_POSITION: [5, 2]}))
    # positions 2 and 5 shown: 0-1 skipped before, 3-4 between
    assert sparse.count("lld-gap") == 2
    assert 'title="2 position(s) not sampled"' in sparse


def test_response_table_by_hand() -> None:
    rows = pd.DataFrame(
        {
            C.TOK_RESPONSE: [0, 0, 0, 1],
            C.TOK_GENERATED: [1, 0, 1, 1],
            C.TOK_DELTA: [-0.5, np.nan, 0.2, 0.1],
            C.TOK_REWARD: [1.0, 1.0, 1.0, 0.0],
        }
    )
    table = tok.response_table(rows)
    # response 0: generated deltas -0.5 and 0.2 -> sum -0.3, min -0.5; response 1: 0.1
    assert table["change (shown tokens)"].tolist() == pytest.approx([-0.3, 0.1])
    assert table["most negative change"].tolist() == pytest.approx([-0.5, 0.1])
    assert table["generated shown"].tolist() == [2, 1]
    no_delta = tok.response_table(rows.drop(columns=[C.TOK_DELTA]))
    assert no_delta["change (shown tokens)"].isna().all()  # NaN, not an error


def test_column_store_appends_without_losing_rows() -> None:
    store = sources.ColumnStore()
    store.append(pd.DataFrame({C.STEP: [0, 1], C.REWARD_MEAN: [0.1, 0.2]}))
    store.append(pd.DataFrame({C.STEP: [2], C.GRAD_NORM: [3.0]}))
    frame = store.frame()
    assert frame[C.STEP].tolist() == [0, 1, 2]
    assert frame[C.REWARD_MEAN].tolist()[:2] == [0.1, 0.2] and math.isnan(frame[C.REWARD_MEAN][2])
    assert math.isnan(frame[C.GRAD_NORM][0]) and frame[C.GRAD_NORM][2] == 3.0


def test_resolve_inside_refuses_escapes(tmp_path: Path) -> None:
    (tmp_path / "root" / "a").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    root = (tmp_path / "root").resolve()
    assert sources.resolve_inside(root, "a") == root / "a"
    assert sources.resolve_inside(root, "../secret") is None
    assert sources.resolve_inside(root, str(tmp_path / "secret")) is None  # absolute path
    assert sources.resolve_inside(root, "missing") is None


# --- the command ----------------------------------------------------------------------------------


def test_command_defaults_to_loopback(tmp_path: Path) -> None:
    from lld_monitor.cli import build_parser
    from lld_monitor.cli import dashboard as cmd

    args = build_parser().parse_args(["dashboard", str(tmp_path)])
    line = cmd.build_command(args, cmd.find_app())
    assert line[line.index("--server.address") + 1] == "127.0.0.1"
    assert line[line.index("--server.port") + 1] == "8501"
    assert line[line.index("--") + 1] == str(tmp_path.resolve())
    assert cmd.find_app() == ROOT_DIR / "lld_monitor" / "report" / "dashboard" / "app.py"
    assert cmd.is_loopback("127.0.0.2") and cmd.is_loopback("::1")
    assert not cmd.is_loopback("0.0.0.0") and not cmd.is_loopback("example.org")


def test_command_rejects_missing_paths_and_bad_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lld_monitor.cli import build_parser, main

    assert main(["dashboard", str(tmp_path / "nope")]) == 2
    assert "no such run or folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dashboard", "--port", "70000"])


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_command_warns_on_other_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lld_monitor.cli import dashboard as cmd
    from lld_monitor.cli import main

    launched: list[list[str]] = []
    monkeypatch.setattr(cmd, "serve", lambda argv: launched.append(argv) or 0)  # no server
    port = str(_free_port())
    assert main(["dashboard", str(tmp_path), "--host", "0.0.0.0", "--port", port]) == 0
    assert "WARNING" in capsys.readouterr().err
    assert launched and launched[0][launched[0].index("--server.address") + 1] == "0.0.0.0"
    assert main(["dashboard", str(tmp_path), "--port", port]) == 0
    assert "WARNING" not in capsys.readouterr().err


def test_command_refuses_a_host_it_cannot_listen_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    from lld_monitor.cli import main

    assert main(["dashboard", str(tmp_path), "--host", "not_a_host"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--host 'not_a_host' is not an address" in err[0]
    with socket.socket() as busy:  # a port someone already listens on
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["dashboard", str(tmp_path), "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_dashboard_stops_when_its_pid_gets_a_stop_signal(tmp_path: Path, sig: str) -> None:
    import signal
    import subprocess
    import time
    import urllib.request

    write_run(tmp_path / "exp1", 5)
    port = _free_port()
    argv = [sys.executable, "-m", "lld_monitor.cli", "dashboard", str(tmp_path)]
    # its own session: the signal reaches the CLI's PID only, as `kill PID` does
    proc = subprocess.Popen(
        [*argv, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "the dashboard exited before serving"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "no answer on /_stcore/health within 90 s"
                time.sleep(0.3)
        proc.send_signal(getattr(signal, sig))
        t0 = time.monotonic()
        assert proc.wait(timeout=15) == 0
        while _port_open(port):  # before the fix: Streamlit, re-parented, kept serving
            assert time.monotonic() - t0 < 5, f"port {port} still served 5 s after {sig}"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a left-over server of a failed run
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_discover_skips_symlinks_out_of_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_run(root / "a", 3)
    write_run(tmp_path / "elsewhere", 3)
    (root / "b").symlink_to(tmp_path / "elsewhere")
    scope = sources.build_scope([root])
    assert [t.name for t in scope.targets] == ["a"]


def test_simulated_spiral_shows_the_analyzers_phases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lld_monitor.analysis import analyze_run
    from lld_monitor.runlog import load_run
    from lld_monitor.testing import make_run
    from lld_monitor.testing import write_run as write_simulated

    path = write_simulated(make_run("collapse", n_steps=260, seed=3), tmp_path / "sim")
    expected = analyze_run(load_run(path).steps)  # what the analyzer says, independently
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    text = all_text(at)
    assert "SIMULATED" in text
    assert f"**Phase**  \n{expected.phases[-1].phase}  \n" in text
    spec = chart_spec(at)
    rects = [s for s in spec["layout"]["shapes"] if s.get("type") == "rect"]
    # each segment shaded from halfway after the previous one's last step to halfway before the
    # next one's first step (so that they touch), the outer edges half a step wide
    segs = expected.phases
    edges = [segs[0].start_step - 0.5]
    edges += [(a.end_step + b.start_step) / 2 for a, b in itertools.pairwise(segs)]
    edges += [segs[-1].end_step + 0.5]
    assert [(r["x0"], r["x1"]) for r in rects] == list(itertools.pairwise(edges))
    assert [r["fillcolor"] for r in rects] == [
        charts.PHASE_COLORS[s.phase] for s in expected.phases
    ]
    events = next(d for d in spec["data"] if d.get("name") == "sim · events")
    analyzer_steps = sorted(float(a.step) for a in expected.alerts)
    assert sorted(arr(events["x"]).tolist()) == analyzer_steps  # no logged events: all post hoc
    assert all("(analyzer)" in t for t in events["text"])


def test_drilldown_step_stays_chosen_when_new_samples_arrive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = write_run(tmp_path / "exp1", 50, close=False)  # token samples at step 40
    sample = w.path / "tokens"
    assert sample.is_dir()
    one = [{C.TOK_RESPONSE: 0, C.TOK_POSITION: 0, C.TOK_TEXT: "x", C.TOK_DELTA: -0.1}]
    w.log_tokens(one, step=45)
    at = make_app(monkeypatch, tmp_path).run()
    step_box = at.selectbox(key="lld_drill_step:exp1")
    # newest first, each step with its sampled responses; it opens on the step with the most
    # displaced correct responses (step 40's response is correct with a negative change; 45's
    # sample says nothing of correctness)
    assert [o.split(" · ")[0] for o in step_box.options] == ["step 45", "step 40"]
    assert step_box.options[1].startswith("step 40 · 1 correct, 1 displaced")
    assert step_box.value == 40
    step_box.set_value(45).run()
    w.log_tokens(one, step=48)
    at.run()
    step_box = at.selectbox(key="lld_drill_step:exp1")
    assert [o.split(" · ")[0] for o in step_box.options] == ["step 48", "step 45", "step 40"]
    assert step_box.value == 45  # the user's choice, not the newest or the most displaced
    w.close()


def test_app_arguments() -> None:
    args = sources.parse_app_args(["runs", "--refresh", "2", "--stale", "30"])
    assert args.paths == (Path("runs"),) and args.refresh_s == 2.0 and args.stale_s == 30.0
    assert sources.parse_app_args([]).paths == (Path.cwd(),)


def test_reanalysis_runs_in_the_background(tmp_path: Path) -> None:
    from lld_monitor.analysis import analyze_run
    from lld_monitor.runlog import load_run

    w = write_run(tmp_path / "run", 40, close=False)
    live = sources.LiveRun(sources.Target("run", (tmp_path / "run").resolve(), "run"))
    assert live.refresh() == 40
    live.ensure_analysis()  # the first analysis is synchronous
    assert live.analysis.phases[-1].end_step == 39 and not live.analysis_pending
    for s in range(40, 45):  # +12.5%: below the 25% growth that triggers a new analysis
        w.log_step(step_row(s))
    assert live.refresh() == 5
    live.ensure_analysis()
    assert live._pending is None and live.analysis.phases[-1].end_step == 39
    for s in range(45, 60):  # 60 rows >= 1.25 * 40
        w.log_step(step_row(s))
    live.refresh()
    live.ensure_analysis()
    assert live._pending is not None  # submitted, not waited for
    live.wait_analysis(timeout=60)
    expected = analyze_run(load_run(tmp_path / "run").steps)
    assert [(p.phase, p.start_step, p.end_step) for p in live.analysis.phases] == [
        (p.phase, p.start_step, p.end_step) for p in expected.phases
    ]
    assert live.analysis.phases[-1].end_step == 59
    w.close()


def test_sparse_column_draws_its_logged_points() -> None:
    # delta_correct logged on steps 4, 8, 12 only (one probe per rollout batch of 4 updates):
    # the trace must hold exactly those 3 points (a NaN-broken line would draw nothing)
    steps = pd.DataFrame(
        {
            C.STEP: np.arange(1, 13),
            C.REWARD_MEAN: np.linspace(0.1, 0.6, 12),
            C.DELTA_CORRECT: [np.nan, np.nan, np.nan, -1.0] * 2 + [np.nan, np.nan, np.nan, 0.5],
        }
    )
    fig = charts.build_figure([charts.RunSeries("r", steps)], ema_weight=0.0)
    traces = [t for t in fig.data if t.name == f"r · {C.DELTA_CORRECT}"]
    assert len(traces) == 1
    assert list(traces[0].x) == [4.0, 8.0, 12.0]
    assert list(traces[0].y) == [-1.0, -1.0, 0.5]
    reward = next(t for t in fig.data if t.name == f"r · {C.REWARD_MEAN}")
    assert len(reward.x) == 12


# --- one chart definition: the report and the dashboard ------------------------------------------


def probed_every_8th(n: int = 64) -> pd.DataFrame:
    """Reward on every step; the probe's columns (logp, Delta, share displaced) on every 8th."""
    s = np.arange(1, n + 1)
    probed = s % 8 == 0
    return pd.DataFrame(
        {
            C.STEP: s,
            C.REWARD_MEAN: 0.2 + 0.005 * s,
            C.LOGP_CORRECT: np.where(probed, -0.5 - 0.01 * s, np.nan),
            C.DELTA_CORRECT: np.where(probed, -0.02 * s, np.nan),
            C.FRAC_CORRECT_DISPLACED: np.where(probed, 0.3 + 0.004 * s, np.nan),
        }
    )


PROBE_COLUMNS = (C.LOGP_CORRECT, C.DELTA_CORRECT, C.FRAC_CORRECT_DISPLACED)


def plotly_data_in_html(page: str) -> list[dict]:
    """The traces that ``Plotly.newPlot(id, data, layout)`` in a written HTML page draws."""
    at = page.index("Plotly.newPlot(")
    at = page.index(",", at) + 1  # past the div id
    data, _ = json.JSONDecoder().raw_decode(page[at:].lstrip())
    return data


def test_probe_columns_on_every_8th_step_hold_points_in_report_and_dashboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lld_monitor.analysis import analyze_run
    from lld_monitor.report import write_report

    df = probed_every_8th()
    expected_x = [8.0, 16.0, 24.0, 32.0, 40.0, 48.0, 56.0, 64.0]
    # the report: the HTML file as written
    page = write_report(df, analyze_run(df), tmp_path / "r.html").read_text(encoding="utf-8")
    data = plotly_data_in_html(page)
    for col in PROBE_COLUMNS:
        trace = next(d for d in data if d.get("name", "").endswith(f"· {col}"))
        assert arr(trace["x"]).tolist() == expected_x, col
        assert np.isfinite(arr(trace["y"])).all()
        assert "lines" in trace["mode"]
    logp = next(d for d in data if d["name"].endswith(f"· {C.LOGP_CORRECT}"))
    assert arr(logp["y"]).tolist() == pytest.approx([-0.5 - 0.01 * x for x in expected_x])
    # the dashboard: the same run as a run folder, the chart's spec as the page receives it
    w = RunWriter(tmp_path / "runs" / "probed")
    for rec in df.to_dict("records"):
        w.log_step({k: v for k, v in rec.items() if not (isinstance(v, float) and math.isnan(v))})
    w.close()
    at = make_app(monkeypatch, tmp_path / "runs").run()
    assert not at.exception
    spec = chart_spec(at)
    for col in PROBE_COLUMNS:
        raw = next(d for d in spec["data"] if d.get("name") == f"probed · {col} (raw)")
        assert arr(raw["x"]).tolist() == expected_x, col
        assert np.isfinite(arr(raw["y"])).all()


def test_one_run_colours_signals_several_runs_colour_runs() -> None:
    df = probed_every_8th(16)
    one = charts.build_figure([charts.RunSeries("a", df)], ema_weight=0.0)
    colours = {t.name: t.line.color for t in one.data if t.type == "scatter" and t.line.color}
    assert colours["a · logp_correct"] == colours["a · delta_correct"] == "#138a7e"
    assert colours["a · reward_mean"] != colours["a · logp_correct"]
    assert not one.layout.showlegend  # the panel titles name the colours
    bands = (charts.Band("healthy", 1, 8), charts.Band("decay", 9, 16))
    two = charts.build_figure(
        [charts.RunSeries("a", df, bands), charts.RunSeries("b", df, bands[:1])], ema_weight=0.0
    )
    by_run = {t.name: t.line.color for t in two.data if t.type == "scatter" and t.line.color}
    assert by_run["a · reward_mean"] == by_run["a · logp_correct"] == charts.RUN_COLORS[0]
    assert by_run["b · reward_mean"] == charts.RUN_COLORS[1]
    assert two.layout.showlegend
    assert [t.name for t in two.data if t.showlegend is not False] == ["a", "b"]  # runs only
    # each run's phases on its own lane of the strip; no shading that belongs to one run only
    lanes = {t.name: (list(t.y), list(t.base)) for t in two.data if t.type == "bar"}
    assert lanes == {"a · phases": ([0, 0], [0.5, 8.5]), "b · phases": ([1], [0.5])}
    assert not [s for s in two.layout.shapes if s.type == "rect"]


def test_a_repeated_value_is_drawn_flat_from_its_first_to_its_last_step() -> None:
    # steps 1-4 copy one rollout batch's value, then 5-8 the next: flat over each batch
    x = np.arange(1.0, 9.0)
    y = np.array([1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    xs, ys = charts.logged_points(x, y)
    assert xs.tolist() == [1.0, 4.0, 5.0, 8.0] and ys.tolist() == [1.0, 1.0, 2.0, 2.0]
    # the same value at steps 4 and 8 (probe every 4th step) is two measurements: both kept
    xs, ys = charts.logged_points(np.array([4.0, 8.0, 12.0]), np.array([-1.0, -1.0, 0.5]))
    assert xs.tolist() == [4.0, 8.0, 12.0]


def _trace(fig, name: str):
    return next(t for t in fig.data if t.name == name)


def _y_at(trace, step: float) -> float:
    """The value a drawn line has at ``step`` (linear between its points; NaN in a break)."""
    x = np.asarray(trace.x, dtype=float)
    y = np.asarray(trace.y, dtype=float)
    i = int(np.searchsorted(x, step))
    if i < len(x) and x[i] == step:
        return float(y[i])
    if trace.line.shape == "hv":
        return float(y[i - 1])
    return float(np.interp(step, x[i - 1 : i + 1], y[i - 1 : i + 1]))


def test_smoothing_is_exact_on_constants_switches_and_a_dead_tail() -> None:
    rng = np.random.default_rng(0)
    n = 200
    steps = np.arange(1, n + 1)
    reward = np.concatenate([0.3 + 0.1 * rng.standard_normal(170), np.zeros(30)])
    grad = np.concatenate([1.0 + 0.3 * rng.random(170), np.zeros(30)])
    lam = np.where(steps >= 120, 0.2, 0.0)
    df = pd.DataFrame({C.STEP: steps, C.REWARD_MEAN: reward, C.GRAD_NORM: grad, C.LLDS_LAMBDA: lam})
    fig = charts.build_figure([charts.RunSeries("r", df)], ema_weight=0.6)
    smooth_r = _trace(fig, f"r · {C.REWARD_MEAN}")
    # the dead tail (steps 171-200, exactly 0) is drawn at 0 by the smoothed line, from step 171
    for s in (171, 180, 200):
        assert _y_at(smooth_r, s) == 0.0
    # lambda: a state, not smoothed, drawn as a step: 0 up to 119, exactly 0.2 from 120 on
    lam_t = _trace(fig, f"r · {C.LLDS_LAMBDA}")
    assert lam_t.line.shape == "hv"
    assert _y_at(lam_t, 119) == 0.0 and _y_at(lam_t, 120) == 0.2 and _y_at(lam_t, 121) == 0.2
    assert not [t for t in fig.data if t.name == f"r · {C.LLDS_LAMBDA} (raw)"]
    # zeros on the log axis: at the floor (a decade below the smallest value), marked
    floor_marks = _trace(fig, f"r · {C.GRAD_NORM} (<= 0, drawn at the floor)")
    assert list(floor_marks.x) == list(range(171, 201))
    assert set(floor_marks.y) == {0.1}  # smallest value 1.0x: decade 1e0, floor 1e-1
    assert _y_at(_trace(fig, f"r · {C.GRAD_NORM}"), 185) == pytest.approx(0.1)


def test_a_gap_in_a_column_is_drawn_as_a_gap() -> None:
    # logp_correct logged on every step except 128-231 (nothing correct sampled there)
    steps = np.arange(1, 301)
    logp = np.where((steps >= 128) & (steps <= 231), np.nan, -0.3 - 0.001 * steps)
    # a probe column logged every 8th step with one batch missing: still joined
    probe = np.where((steps % 8 == 0) & (steps != 64), 0.4, np.nan)
    df = pd.DataFrame({C.STEP: steps, C.LOGP_CORRECT: logp, C.FRAC_CORRECT_DISPLACED: probe})
    fig = charts.build_figure([charts.RunSeries("r", df)], ema_weight=0.6)
    for name in (f"r · {C.LOGP_CORRECT}", f"r · {C.LOGP_CORRECT} (raw)"):
        t = _trace(fig, name)
        assert np.isnan(_y_at(t, 180)), name  # nothing drawn across the gap
        assert _y_at(t, 127) == pytest.approx(-0.427, abs=0.01)
        assert _y_at(t, 232) == pytest.approx(-0.532, abs=0.01)
    share = _trace(fig, f"r · {C.FRAC_CORRECT_DISPLACED} (raw)")
    assert not np.isnan(np.asarray(share.y, dtype=float)).any()
    assert _y_at(share, 64) == pytest.approx(0.4)


def test_panels_name_their_units_and_hovers_name_run_signal_step_and_value() -> None:
    df = probed_every_8th(16)
    fig = charts.build_figure([charts.RunSeries("a-long-run-name-seed0", df)], ema_weight=0.0)
    titles = [a.text for a in fig.layout.annotations[1 : 1 + len(charts.PANELS)]]
    assert "nats per token" in titles[1] and "summed nats per response" in titles[2]
    t = _trace(fig, f"a-long-run-name-seed0 · {C.LOGP_CORRECT}")
    assert t.hovertemplate.startswith("<b>a-long-run-name-seed0</b> · correct: %{y:.4g} nats/token")
    # signals of one panel differ in hue
    for panel in charts.PANELS:
        colours = [charts.SIGNAL_COLORS[c] for c, _ in panel.series if c in charts.SIGNAL_COLORS]
        assert len(set(colours)) == len(colours), panel.title


def test_any_alert_kind_is_a_marker_and_a_point_maps_back_to_its_run() -> None:
    df = probed_every_8th(16)
    marks = (charts.Marker(9, "alert", "kl_blowup", "critical", "KL 40x its median", "analyzer"),)
    fig = charts.build_figure([charts.RunSeries("a", df, (), marks)], ema_weight=0.0)
    events = next(t for t in fig.data if t.name == "a · events")
    assert list(events.x) == [9] and "kl_blowup [critical]" in events.text[0]
    reward = next(i for i, t in enumerate(fig.data) if t.name == "a · reward_mean")
    assert charts.point_step(fig, {"curve_number": reward, "x": 12}) == ("a", 12.0)
    assert charts.point_step(fig, {"curve_number": 999, "x": 12}) is None


def test_query_run_dot_slash_shows_that_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_run(tmp_path / "short", 5)
    write_run(tmp_path / "long", 12)
    at = make_app(monkeypatch, tmp_path, query="./long").run()
    assert not at.exception and not at.warning
    assert at.multiselect[0].value == ["long"]
    assert "12 rows, last step 11" in all_text(at)
    at = make_app(monkeypatch, tmp_path, query="../nope_run").run()
    message = next(w.value for w in at.warning if "Ignored" in w.value)
    assert "`" not in message  # escapes inside a code span would show as backslashes
    assert "nope" in message


def test_several_updates_per_rollout_batch_draw_each_batch_flat() -> None:
    from lld_monitor.testing import make_run

    # 4 optimizer steps per rollout batch repeat the batch's reward: each batch drawn flat from
    # its first to its last step (two points), not 4 points, not a ramp between batch starts
    steps = make_run("collapse", n_steps=120, seed=1, rows_per_batch=4).steps
    fig = charts.build_figure([charts.RunSeries("r", steps)], ema_weight=0.0)
    reward = next(t for t in fig.data if t.name == f"r · {C.REWARD_MEAN}")
    firsts = list(range(0, 120, 4))
    expected_x = [x for b in firsts for x in (b, b + 3)]
    assert list(reward.x) == expected_x
    batch_first = steps[C.REWARD_MEAN].to_numpy()[::4]
    assert list(reward.y[::2]) == pytest.approx(batch_first.tolist())
    assert list(reward.y[1::2]) == pytest.approx(batch_first.tolist())
    entropy = next(t for t in fig.data if t.name == f"r · {C.ENTROPY}")
    assert len(entropy.x) == 120  # a per-update signal keeps every step


def test_streamlit_run_by_hand_binds_loopback_and_sends_no_statistics(tmp_path: Path) -> None:
    """``streamlit run dashboard/app.py`` from the repository root (the documented form without
    the CLI) listens on 127.0.0.1 only and reports no usage statistics, as the CLI does."""
    import socket
    import subprocess
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_run(tmp_path / "exp1", 5)
    cmd = [sys.executable, "-m", "streamlit", "run", "dashboard/app.py", "--server.port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--", str(tmp_path)],
        cwd=ROOT_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "streamlit did not start"
                time.sleep(0.5)
        listening = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=False
        ).stdout
        if listening.strip():  # (ss present): only the loopback address
            assert all("127.0.0.1:" in line for line in listening.strip().splitlines()), listening
        import tomllib

        cfg = tomllib.loads((ROOT_DIR / ".streamlit" / "config.toml").read_text())
        assert cfg["browser"]["gatherUsageStats"] is False
        assert cfg["server"]["address"] == "127.0.0.1"
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=15)


def test_the_first_render_takes_the_pickers_analysis_of_the_same_rows(tmp_path: Path) -> None:
    """A run is analysed once on first render: the picker's verdict analysis is handed to the
    charts when it was made on the rows the follower read (and never when the run grew)."""
    from lld_monitor.analysis import analyze_run

    w = write_run(tmp_path / "run", 40, close=False)
    target = sources.Target("run", (tmp_path / "run").resolve(), "run")
    service._VERDICTS.pop(str(target.path), None)
    verdict = service.run_verdict(target)
    handed = service._VERDICTS[str(target.path)][3]
    assert verdict.rows == 40 and handed is not None
    live = sources.LiveRun(target)
    live.refresh()
    live.ensure_analysis()
    assert live.analysis is handed  # the same object: no second analysis
    assert live.analysis.to_dict() == analyze_run(live.steps).to_dict()
    assert service._VERDICTS[str(target.path)][3] is None  # handed over once

    # the run grew after its verdict: the follower analyses what it read itself
    service._VERDICTS.pop(str(target.path), None)
    service.run_verdict(target)
    for s in range(40, 45):
        w.log_step(step_row(s))
    grown = sources.LiveRun(target)
    grown.refresh()
    grown.ensure_analysis()
    assert grown.n_rows == 45 and grown.analysis is not None
    assert grown.analysis is not service._VERDICTS[str(target.path)][3]
    assert grown.analysis.phases[-1].end_step == 44
    w.close()


def test_smoothing_restarts_where_the_row_loop_restarts() -> None:
    """The long runs of equal values found at once equal those a row-by-row scan finds."""
    rng = np.random.default_rng(5)
    y = np.round(rng.random(3000), 1)  # short runs by chance
    y[100:140] = 0.0  # a dead stretch
    y[2000:2003] = 0.7  # a run too short to restart
    y[2500:] = 0.3  # a constant tail
    x = np.arange(3000.0)
    got = charts.smooth(x, y, 0.9)
    starts, i = [0], 0
    while i < len(y):
        j = i
        while j + 1 < len(y) and y[j + 1] == y[i]:
            j += 1
        if j - i + 1 >= charts.FLAT_RUN:
            starts.append(i)
        i = j + 1
    want = np.empty(len(y))
    bounds = sorted({*starts, len(y)})
    for a, b in itertools.pairwise(bounds):
        want[a:b] = charts.ema(y[a:b], 0.9)
    np.testing.assert_array_equal(got, want)
    assert (got[100:140] == 0.0).all() and (got[2500:] == 0.3).all()


def test_a_long_run_draws_at_once_and_its_analysis_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run at least ``BACKGROUND_BYTES`` large is analysed in a worker process: the first
    render has the charts, an "analysing" badge and note, no phase bands; a later rerun has the
    same verdict and collapse numbers as ``lld-monitor analyze`` gives and the phase bands."""

    from lld_monitor.analysis.triage import triage_one
    from lld_monitor.testing import make_run
    from lld_monitor.testing import write_run as write_sim

    write_sim(make_run("collapse", 400, seed=0), tmp_path / "long")
    expected = triage_one(tmp_path / "long", tmp_path)
    assert expected.verdict == "collapsed"
    monkeypatch.setattr(service, "BACKGROUND_BYTES", 1)  # every run counts as long
    monkeypatch.setattr(service, "_BACKGROUND", {})
    monkeypatch.setattr(service, "_VERDICTS", {})
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    assert at.multiselect[0].options == ["… long · analysing"]
    assert "Analysing 400 rows of **long** in the background" in all_text(at)
    spec = chart_spec(at)  # the charts are complete: every row of the reward is drawn
    assert len(spec["data"]) > 0
    assert not [s for s in spec["layout"].get("shapes", []) if s.get("type") == "rect"]
    wait_background()
    assert service.background_pending() == 0
    at.run()
    assert not at.exception
    label = at.multiselect[0].options[0]
    assert label.startswith(f"✖ long · collapsed ({expected.worst['kind']} at step ")
    text = all_text(at).replace("\\", "")
    assert "in the background" not in text
    assert "Collapse: the reward fell below half its peak at step" in text
    assert [s for s in chart_spec(at)["layout"].get("shapes", []) if s.get("type") == "rect"]


def test_a_worker_that_dies_leaves_a_reason_not_a_broken_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analysis worker killed mid-run (out of memory, say): the picker names the run
    unreadable with the reason, the header says the analysis failed, the charts stay; the next
    long run gets a new worker and its verdict."""
    import os
    import signal
    import time

    from lld_monitor.testing import make_run
    from lld_monitor.testing import write_run as write_sim

    write_sim(make_run("collapse", 30_000, seed=0), tmp_path / "a")
    monkeypatch.setattr(service, "BACKGROUND_BYTES", 1)
    monkeypatch.setattr(service, "_BACKGROUND", {})
    monkeypatch.setattr(service, "_DEFERRED", {})
    monkeypatch.setattr(service, "_VERDICTS", {})
    at = make_app(monkeypatch, tmp_path).run()
    assert at.multiselect[0].options == ["… a · analysing"]
    pool = service._background_pool()
    for _ in range(100):  # the worker process is up once the run is handed over
        if pool._processes:
            break
        time.sleep(0.05)
    for pid in list(pool._processes):
        os.kill(pid, signal.SIGKILL)
    wait_background()
    at.run()
    assert not at.exception
    assert at.multiselect[0].options == ["○ a · unreadable"]
    text = all_text(at)
    assert "analysis failed" in text and len(at.get("plotly_chart")) == 1
    # another long run (another page of the server): a new worker analyses it
    write_sim(make_run("healthy", 300, seed=0), tmp_path / "other" / "b")
    at = make_app(monkeypatch, tmp_path / "other").run()
    assert at.multiselect[0].options == ["… b · analysing"]
    wait_background()
    at.run()
    assert not at.exception
    assert at.multiselect[0].options == ["✓ b · healthy"]


def test_the_run_picker_keeps_its_choice_when_a_verdict_label_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The picker's options are labelled with the verdicts, and the browser sends back the label
    it shows: one sent just as the label changed (the run's analysis arrived, "… long ·
    analysing" became "✖ long · collapsed") still names the run, which stays chosen."""
    from lld_monitor.testing import make_run
    from lld_monitor.testing import write_run as write_sim

    write_sim(make_run("collapse", 400, seed=0), tmp_path / "long")
    write_sim(make_run("healthy", 300, seed=0), tmp_path / "other")
    monkeypatch.setattr(service, "BACKGROUND_BYTES", 1)
    monkeypatch.setattr(service, "_BACKGROUND", {})
    monkeypatch.setattr(service, "_DEFERRED", {})
    monkeypatch.setattr(service, "_VERDICTS", {})
    at = make_app(monkeypatch, tmp_path, query="long").run()
    stale = at.multiselect[0].options
    assert "… long · analysing" in stale and at.multiselect[0].value == ["long"]
    wait_background()
    at.run()
    assert "… long · analysing" not in at.multiselect[0].options
    at.multiselect[0].set_value(["… long · analysing"]).run()  # the label the browser showed
    assert not at.exception
    assert at.multiselect[0].value == ["long"]
    assert "Select one or more runs above." not in all_text(at)


def test_a_long_runs_verdict_stays_while_a_new_one_is_made_and_is_throttled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long run whose files change gets a new verdict from the worker: meanwhile the picker
    keeps the one before (no "analysing" flicker); and it is made again at most every
    ``VERDICT_COST_FACTOR`` times the last analysis took."""
    import os

    from lld_monitor.testing import make_run
    from lld_monitor.testing import write_run as write_sim

    write_sim(make_run("collapse", 400, seed=0), tmp_path / "long")
    log = tmp_path / "long" / "steps.jsonl"
    monkeypatch.setattr(service, "BACKGROUND_BYTES", 1)
    monkeypatch.setattr(service, "VERDICT_REFRESH_S", 0.0)
    monkeypatch.setattr(service, "VERDICT_COST_FACTOR", 0.0)
    for name in ("_BACKGROUND", "_DEFERRED", "_VERDICTS", "_VERDICT_COST"):
        monkeypatch.setattr(service, name, {})
    at = make_app(monkeypatch, tmp_path).run()
    assert at.multiselect[0].options == ["… long · analysing"]
    wait_background()
    at.run()
    first = at.multiselect[0].options
    assert first[0].startswith("✖ long · collapsed")
    assert service._VERDICT_COST[str(tmp_path / "long")] > 0.0
    path = str(tmp_path / "long")
    t = log.stat().st_mtime + 5.0
    os.utime(log, (t, t))  # the run's files changed: a new verdict is made
    at.run()
    assert path in service._BACKGROUND  # handed to the worker
    assert at.multiselect[0].options == first  # the verdict before, not "analysing"
    wait_background()
    at.run()
    assert at.multiselect[0].options == first  # (the same rows: the same verdict)
    # throttled: the last analysis took c seconds; within VERDICT_COST_FACTOR * c, none again
    monkeypatch.setattr(service, "VERDICT_COST_FACTOR", 1e6)
    os.utime(log, (t + 5.0, t + 5.0))
    made = service._VERDICTS[path][1]  # when the verdict was taken
    at.run()
    assert path not in service._BACKGROUND and not service._DEFERRED  # not analysed again
    assert service._VERDICTS[path][1] == made
    assert at.multiselect[0].options == first


def test_two_sessions_opening_long_runs_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two browser sessions (each its own thread of the server) open the same long runs at the
    same moment: the shared verdict and worker state is behind a lock; neither page errs and
    both end with every run's verdict."""
    import threading

    from lld_monitor.testing import make_run
    from lld_monitor.testing import write_run as write_sim

    for i, kind in enumerate(("collapse", "healthy", "collapse")):
        write_sim(make_run(kind, 3000, seed=i), tmp_path / f"long{i}")
    monkeypatch.setattr(service, "BACKGROUND_BYTES", 1)  # every run counts as long
    monkeypatch.setattr(service, "_BACKGROUND", {})
    monkeypatch.setattr(service, "_VERDICTS", {})
    monkeypatch.setattr(service, "_DEFERRED", {})
    monkeypatch.setattr(sys, "argv", ["app.py", str(tmp_path)])
    start = threading.Barrier(2)
    results: dict[int, object] = {}

    def session(i: int) -> None:
        try:
            at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
            start.wait()
            for _ in range(3):
                at.run()
                if at.exception:
                    break
            results[i] = at
        except BaseException as exc:  # (reported below, not lost in the thread)
            results[i] = exc

    threads = [threading.Thread(target=session, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(2):
        at = results[i]
        assert isinstance(at, AppTest), at
        assert not at.exception, [e.value for e in at.exception]
    wait_background()
    for i in range(2):
        at = results[i]
        at.run()
        assert not at.exception
        labels = at.multiselect[0].options
        assert len(labels) == 3 and not any("analysing" in lab for lab in labels), labels


def test_a_foreign_log_is_parsed_once_on_the_first_render(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing the log (is there a training row?), its picker verdict and its charts read the
    same unchanged file: it is parsed once; changed, it is parsed again."""
    from lld_monitor.importers import load

    state = {
        "global_step": 40,
        "log_history": [
            {"step": s, "reward": 0.01 * s, "grad_norm": 1.0, "loss": 0.0} for s in range(1, 41)
        ],
    }
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state))
    calls: list[Path] = []
    real = load._load_table

    def counting(p, run):
        calls.append(Path(p))
        return real(p, run)

    monkeypatch.setattr(load, "_load_table", counting)
    monkeypatch.setattr(load, "_TABLES", {})
    monkeypatch.setattr(service, "_VERDICTS", {})
    at = make_app(monkeypatch, tmp_path).run()
    assert not at.exception
    assert option_names(at) == ["trainer_state.json"]
    assert "40 rows, last step 40" in all_text(at)
    assert calls == [path]
    state["log_history"].append({"step": 41, "reward": 0.5, "grad_norm": 1.0, "loss": 0.0})
    path.write_text(json.dumps(state))
    at.run()
    assert "41 rows, last step 41" in all_text(at)
    assert calls.count(path) == 2


def test_picker_badges_are_drawn_by_a_plain_font() -> None:
    """Every badge is a glyph of DejaVu Sans (matplotlib ships it; the usual fallback font of a
    Linux server), so no badge is an empty box where no emoji font is installed."""
    pytest.importorskip("matplotlib")
    from fontTools.ttLib import TTFont
    from matplotlib import font_manager

    font = TTFont(font_manager.findfont("DejaVu Sans", fallback_to_default=False))
    cmap = font.getBestCmap()
    for verdict, badge in sources.VERDICT_BADGE.items():
        assert all(ord(ch) in cmap for ch in badge), (verdict, badge)
    assert ord("🔴") not in cmap  # (the check can fail: an emoji is not in the font)


def test_the_header_and_the_picker_name_the_same_worst_alert() -> None:
    """One rule for "the worst alert" (triage.worst_alert: the highest severity, its first
    sighting): the d7 LLDS-off run's picker said 'collapse at step 1242' while the header said
    the critical collapse at 2269 (it took the latest of the worst); both now name 1242, and the
    header names the latest one apart."""
    from lld_monitor.analysis import triage

    path = ROOT_DIR / "sample_runs" / "rescue" / "s4-16upd-lr8e-4-G8-seed0-off"
    live = sources.LiveRun(sources.Target("off", path, "run"))
    live.refresh()
    live.ensure_analysis()
    head = live.header(60.0)
    assert "(collapse at step 1242)" in live.verdict_text()
    assert head.last_alert.startswith("collapse (critical) at step 1242: "), head.last_alert
    assert head.latest_alert.startswith("collapse (critical) at step 2269"), head.latest_alert
    # by hand: the highest severity wins, then the first sighting, then the order given
    a = [Alert(5, "spike", "info", "x"), Alert(9, "decay", "warning", "x")]
    b = [Alert(7, "collapse", "critical", "y"), Alert(3, "collapse", "critical", "z")]
    assert triage.worst_alert(a).step == 9 and triage.worst_alert(a + b).message == "z"
    assert triage.worst_alert([]) is None
