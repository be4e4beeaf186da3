"""``lld-monitor analyze DIR`` on a folder of many runs (cli/triage.py): one line per run, worst
first, on a folder of mixed real files written here (our run folders, a TRL trainer_state.json
in an output folder, a W&B-style CSV, a console log, an unreadable JSON, a README)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lld_monitor import columns as C
from lld_monitor.cli import main as cli_main
from lld_monitor.cli.triage import candidates, is_folder_of_runs, triage
from lld_monitor.testing import make_calibration_run, make_standard_run, write_run

SAMPLE = Path(__file__).resolve().parents[2] / "sample_runs" / "real"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    # two of our run folders (one nested a level deeper), healthy toy runs
    shutil.copytree(SAMPLE / "toy-llds-off-seed0", root / "toy-off")
    shutil.copytree(SAMPLE / "toy-llds-on-seed0", root / "group" / "toy-on")
    # a collapse as a run folder of ours
    write_run(make_calibration_run("collapse_rise", 3), root / "collapsing")
    # a TRL output folder: trainer_state.json in it, from a healthy standard-metric run
    healthy = make_standard_run("learning", 4, short=True).steps
    out = root / "trl-output"
    out.mkdir()
    log = [
        {"step": int(r[C.STEP]), "reward": r[C.REWARD_MEAN], "grad_norm": r[C.GRAD_NORM]}
        for r in healthy.to_dict("records")
    ]
    (out / "trainer_state.json").write_text(json.dumps({"log_history": log, "global_step": 1}))
    # a W&B-style history export of a run whose reward falls to zero
    dead = make_calibration_run("collapse_plateau_corroborated", 5).steps
    lines = ["_step,train/reward,train/grad_norm"]
    lines += [f"{int(s)},{r},{g}" for s, r, g in dead[[C.STEP, C.REWARD_MEAN, C.GRAD_NORM]].values]
    (root / "wandb-export.csv").write_text("\n".join(lines) + "\n")
    # an unreadable log, and files that are not runs
    (root / "broken.json").write_text('{"log_history": [{"step": 1, "reward": ')
    (root / "README.md").write_text("# my sweep\nnotes\n")
    (root / "timing.json").write_text('{"wall_s": 12.5, "host": "a"}\n')  # reads, no metric
    (root / "config.yaml").write_text("lr: 1e-6\n")
    return root


def test_a_folder_of_runs_is_triaged_worst_first(sweep: Path) -> None:
    assert is_folder_of_runs(sweep)
    assert not is_folder_of_runs(sweep / "toy-off")  # one run folder is one run
    names = {str(p.relative_to(sweep)) for p in candidates(sweep)}
    assert names == {
        "toy-off",
        "group/toy-on",
        "collapsing",
        "trl-output",
        "wandb-export.csv",
        "broken.json",
        "timing.json",
    }
    verdicts = triage(sweep)
    order = [(v.name, v.verdict) for v in verdicts]
    assert [v for _, v in order][:2] == ["collapsed", "collapsed"]
    assert {n for n, v in order if v == "collapsed"} == {"collapsing", "wandb-export.csv"}
    assert order[-2:] == [("broken.json", "unreadable"), ("timing.json", "skipped")]
    assert {n for n, v in order if v == "healthy"} >= {"toy-off", "group/toy-on"}
    by_name = {v.name: v for v in verdicts}
    assert by_name["wandb-export.csv"].format == "wandb_csv"
    assert by_name["trl-output"].format == "trl_trainer_state"
    assert by_name["collapsing"].worst["kind"] == "collapse"
    assert by_name["collapsing"].phase == "collapse"
    assert "broken.json" in (by_name["broken.json"].error or "")
    # the collapsed runs: the one whose worst alert came later is listed first
    first, second = verdicts[0], verdicts[1]
    assert first.worst["step"] >= second.worst["step"]


def test_parallel_triage_gives_the_verdicts_of_one_process(sweep: Path) -> None:
    """jobs=2 (worker processes) and jobs=1 (this process): the same verdicts, in the same
    order, the unreadable run included."""
    one = [v.to_dict() for v in triage(sweep, jobs=1)]
    two = [v.to_dict() for v in triage(sweep, jobs=2)]
    assert one == two and len(one) == 7


def test_triage_command_text_json_and_fail_on(sweep: Path, capsys) -> None:
    assert cli_main(["analyze", str(sweep)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{sweep}: 6 runs (2 collapsed,") and "1 unreadable" in out[0]
    assert out[2].split()[0] == "collapsed" and "collapse at step" in out[2]
    assert out[-2].split()[:2] == ["unreadable", "broken.json"]
    assert out[-1] == "  skipped (they read, but log no training metric): timing.json"
    assert cli_main(["analyze", str(sweep), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["counts"]["collapsed"] == 2 and doc["counts"]["unreadable"] == 1
    assert [r["verdict"] for r in doc["runs"]][-1] == "unreadable"
    assert doc["skipped"] == ["timing.json"] and len(doc["runs"]) == 6
    assert cli_main(["analyze", str(sweep), "--fail-on", "critical"]) == 1
    capsys.readouterr()
    assert cli_main(["analyze", str(sweep / "toy-off"), "--fail-on", "critical"]) == 0
    capsys.readouterr()
    assert cli_main(["analyze", str(sweep), "--html", "x.html"]) == 2
    assert "holds several runs" in capsys.readouterr().err


def test_a_wandb_export_of_two_runs_is_two_named_runs(tmp_path, capsys) -> None:
    """A W&B panel export holding run-a and run-b: analysed as two runs, never merged; --run
    picks one; a name that is not there is refused with the list."""
    path = tmp_path / "panel.csv"
    rows = ["Step,run-a - train/reward,run-a - train/reward__MIN,run-b - train/reward"]
    rows += [f"{s},{0.5 + 0.001 * s},{0.4},{0.1 + 0.002 * s}" for s in range(1, 61)]
    path.write_text("\n".join(rows) + "\n")
    assert cli_main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(r["name"] for r in doc["runs"]) == ["panel.csv [run-a]", "panel.csv [run-b]"]
    from lld_monitor.importers import ImportFormatError, load_table

    b = load_table(path, run="run-b")
    assert list(b[C.REWARD_MEAN]) == pytest.approx([0.1 + 0.002 * s for s in range(1, 61)])
    first = load_table(path)
    assert list(first[C.REWARD_MEAN]) == pytest.approx([0.5 + 0.001 * s for s in range(1, 61)])
    assert "also there: run-b" in first.attrs["import_notes"][0]
    with pytest.raises(ImportFormatError, match="run-a, run-b"):
        load_table(path, run="zz")


def test_every_sample_run_folder_loads_or_is_a_summary(capsys):
    """Every folder under sample_runs/ with a meta.json is a run log that loads, or a run
    summary (no step rows, on purpose) that the loader, analyze and the triage name as such."""
    import pytest

    from lld_monitor.cli import main
    from lld_monitor.runlog import RunSummaryError, load_run

    root = Path(__file__).resolve().parents[2] / "sample_runs"
    summaries = []
    for meta in sorted(root.rglob("meta.json")):
        try:
            assert len(load_run(meta.parent).steps) > 0, meta.parent
        except RunSummaryError:
            summaries.append(meta.parent)
    assert len(summaries) == 11  # sample_runs/spiral_auto: kept without their step logs
    assert all(p.parent.name == "spiral_auto" for p in summaries)
    assert main(["analyze", str(summaries[0])]) == 2
    assert "is a run summary, not a run log" in capsys.readouterr().err
    verdicts = triage(root / "spiral_auto")
    assert sorted(v.name for v in verdicts if v.verdict == "summary") == sorted(
        p.name for p in summaries
    )
    with pytest.raises(RunSummaryError):
        load_run(summaries[0])
    assert main(["analyze", str(root / "spiral_auto")]) == 0
    out = capsys.readouterr().out
    assert "summaries (meta, events and end-of-run summary kept, no step rows):" in out
