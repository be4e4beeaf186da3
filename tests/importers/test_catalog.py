"""One run catalog: ``lld-monitor analyze DIR``, the triage and the dashboard's picker list the
same runs under the same names (``lld_monitor.importers.catalog``)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from lld_monitor.analysis.triage import triage
from lld_monitor.cli import main
from lld_monitor.importers.catalog import catalog

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "importers"
RUN = REPO / "sample_runs" / "real" / "toy-llds-off-seed0"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run, a run summary, a W&B run folder (the real wandb library), a notebook, an
    unreadable file, a TRL output folder, runs appended to one log, a config and a README."""
    wandb = pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("mixed")
    (root / "run1").mkdir()
    for name in ("meta.json", "steps.jsonl", "events.jsonl"):
        shutil.copy(RUN / name, root / "run1" / name)
    (root / "summary").mkdir()
    shutil.copy(RUN / "meta.json", root / "summary" / "meta.json")
    (root / "summary" / "closed.json").write_text("{}\n")
    shutil.copy(FIX / "notebook.ipynb", root / "notebook.ipynb")
    (root / "broken.csv").write_text("a,b\nx,y\n")
    (root / "out").mkdir()
    shutil.copy(FIX / "trainer_state.json", root / "out" / "trainer_state.json")
    one = "".join(f"step {s} | reward 0.5 | acc 0.25\n" for s in range(1, 31))
    (root / "two_runs.log").write_text(one + one)
    (root / "config.json").write_text(json.dumps({"lr": 1e-6, "model": "tiny"}))
    (root / "README.md").write_text("# my sweep\n\nNothing to read here.\n")
    mp = pytest.MonkeyPatch()
    try:
        for key, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true")):
            mp.setenv(key, value)
        mp.setenv("WANDB_CONSOLE", "off")
        run = wandb.init(project="p", mode="offline", dir=str(root), id="cat00001")
        for i in range(1, 41):
            run.log({"train/reward": 0.5, "train/grad_norm": 1.0 + i / 100}, step=i)
        run.finish()
    finally:
        mp.undo()
    (wandb_run,) = (root / "wandb").glob("offline-run-*cat00001")
    import time

    from lld_monitor.importers.wandb_run import wandb_file_of

    for _ in range(40):  # (wandb's service may still be writing the file)
        if wandb_file_of(wandb_run).stat().st_size > 7:
            break
        time.sleep(0.5)
    return root


EXPECTED = [
    "broken.csv",
    "notebook.ipynb",
    "out",
    "run1",
    "summary",
    "two_runs.log [1]",
    "two_runs.log [2]",
]


def _wandb_name(root: Path) -> str:
    (run,) = (root / "wandb").glob("offline-run-*cat00001")
    return f"wandb/{run.name}"


def test_the_catalog_names_each_run_once(mixed: Path) -> None:
    entries, problems = catalog(mixed)
    assert problems == []
    names = [e.name for e in entries]
    # config.json is listed (it may be a log) and left out by the readers: no training rows
    assert names == sorted([*EXPECTED, "config.json", _wandb_name(mixed)])
    kinds = {e.name: e.kind for e in entries}
    assert kinds["run1"] == kinds["summary"] == "run" and kinds["out"] == "foreign"
    # wandb/latest-run is a link to the run: not listed twice
    assert not any("latest-run" in n for n in names)


def test_analyze_the_triage_and_the_picker_list_the_same_runs(mixed, capsys, monkeypatch):
    want = sorted([*EXPECTED, _wandb_name(mixed)])
    verdicts = triage(mixed)
    assert sorted(v.name for v in verdicts if v.verdict != "skipped") == want
    assert {v.name: v.verdict for v in verdicts}["config.json"] == "skipped"
    assert {v.name: v.verdict for v in verdicts}["broken.csv"] == "unreadable"
    assert {v.name: v.verdict for v in verdicts}["summary"] == "summary"

    assert main(["analyze", str(mixed), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(r["name"] for r in doc["runs"]) == want
    assert [s if isinstance(s, str) else s["name"] for s in doc["skipped"]] == ["config.json"]

    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    monkeypatch.setattr(sys, "argv", ["app.py", str(mixed)])
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=60).run()
    assert not at.exception
    picker = sorted(o.split(" ", 1)[1].split(" · ")[0] for o in at.multiselect[0].options)
    assert picker == want
