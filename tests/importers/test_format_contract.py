"""The importers' run contract, over the registry: every format declares its place in detection,
its suffixes and its runs, and keeps its word.

- every ranked format's fixture sniffs as itself, on the whole file and on a partial head, and
  as no format ranked before it (so adding a format cannot steal another's files unseen);
- ``runs()`` agrees with ``read(run=)`` and ``load_runs()``: each run it names reads, and gives
  the table ``load_runs`` gives for that name; ``load.load_runs`` gives what ``load_table`` gives
  for each run;
- the catalog's suffixes are the formats' own declarations;
- a new format is one class in ``formats.REGISTRY``: no other list names it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from lld_monitor.importers import load_table
from lld_monitor.importers.base import Head
from lld_monitor.importers.formats import (
    _SNIFFED,
    LOG_SUFFIXES,
    MAYBE_LOG_SUFFIXES,
    REGISTRY,
    detect,
)
from lld_monitor.importers.load import load_runs

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "importers"
SHAPES = FIX / "shapes"

#: format -> a file in it (real tools' output where the fixture folder has one)
FIXTURES: dict[str, Path] = {
    "wandb_run": SHAPES / "wandb_offline_run.wandb",
    "tensorboard": next((SHAPES / "tb_logdir").rglob("*tfevents*")),
    "trl_trainer_state": FIX / "trainer_state.json",
    "notebook_log": FIX / "notebook.ipynb",
    "verl_jsonl": FIX / "verl_metrics.jsonl",
    "log_history": FIX / "log_history.json",
    "jsonl": FIX / "canonical.jsonl",
    "wandb_csv": FIX / "wandb_history.csv",
    "csv": FIX / "canonical.csv",
    "console_json": SHAPES / "fw_roll_console.log",
    "verl_console": FIX / "verl_console.log",
    "trl_console": FIX / "trl_console.log",
    "plain_console": SHAPES / "fw_nemo_rl_console.log",
}
PANEL = (
    '"Step","run-a - train/reward","run-a - train/reward__MIN","run-b - train/reward"\n'
    '"1","0.1","0.1","0.5"\n"2","0.2","0.2","0.4"\n'
)


@pytest.fixture(scope="module")
def several(tmp_path_factory) -> dict[str, Path]:
    """format -> a file of several runs: a W&B panel export of two runs, as W&B writes one."""
    path = tmp_path_factory.mktemp("panel") / "panel.csv"
    path.write_text(PANEL)
    return {"wandb_csv": path}


@pytest.fixture(scope="module")
def parquet_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("parquet") / "table.data"
    pd.read_csv(FIX / "canonical.csv").to_parquet(path)
    return path


def _fixture(name: str, parquet_file: Path) -> Path:
    return parquet_file if name == "parquet" else FIXTURES[name]


def test_every_ranked_format_has_a_fixture_here():
    ranked = {f.name for f in REGISTRY if f.rank is not None}
    assert ranked == set(FIXTURES) | {"parquet"}


def test_ranks_are_distinct_and_give_the_sniff_order():
    ranks = [f.rank for f in REGISTRY if f.rank is not None]
    assert len(set(ranks)) == len(ranks)
    assert [f.rank for f in _SNIFFED] == sorted(ranks)


@pytest.mark.parametrize("fmt", _SNIFFED, ids=lambda f: f.name)
@pytest.mark.parametrize("complete", [True, False], ids=["whole", "head"])
def test_fixture_sniffs_as_itself_and_as_no_format_before_it(fmt, complete, parquet_file):
    path = _fixture(fmt.name, parquet_file)
    got, _ = detect(path, complete=complete)
    assert got is fmt
    head = Head(path, complete=complete)
    for earlier in _SNIFFED:
        if earlier is fmt:
            break
        assert not earlier.sniff(head), f"{earlier.name} claims {fmt.name}'s fixture"


@pytest.mark.parametrize("fmt", _SNIFFED, ids=lambda f: f.name)
def test_runs_agree_with_read_and_load_runs(fmt, parquet_file, several):
    paths = [_fixture(fmt.name, parquet_file)]
    if fmt.name in several:
        paths.append(several[fmt.name])
    for path in paths:
        head = Head(path, complete=True)
        names = fmt.runs(path, head)
        assert names and len(set(names)) == len(names)
        loaded = fmt.load_runs(path, head)
        assert [n for n, _, _ in loaded] == names
        for name, frame, source in loaded:
            read, read_source = fmt.read(path, head, run=name)
            assert read_source == source
            pd.testing.assert_frame_equal(read.reset_index(drop=True), frame.reset_index(drop=True))
    if fmt.name in several:
        assert fmt.runs(several[fmt.name], Head(several[fmt.name], complete=True)) == [
            "run-a",
            "run-b",
        ]


@pytest.mark.parametrize(
    "path",
    [*FIXTURES.values(), SHAPES / "trl_split_streams.log", None],
    ids=lambda p: p.name if p is not None else "panel-of-two-runs",
)
def test_load_runs_is_load_table_of_each_run(path, several):
    path = several["wandb_csv"] if path is None else path
    runs = load_runs(path)
    if len(runs) == 1:
        pd.testing.assert_frame_equal(runs[0][1], load_table(path))
        return
    for name, table in runs:
        pd.testing.assert_frame_equal(table, load_table(path, run=name))


def test_load_runs_parses_an_appended_log_once(tmp_path, monkeypatch):
    """Three runs appended to one verl console log: one parse for all three tables."""
    from lld_monitor.importers import formats

    text = (FIX / "verl_console.log").read_text()
    path = tmp_path / "three.log"
    path.write_text(text * 3)
    calls = []
    real = formats.parse_verl_console
    monkeypatch.setattr(formats, "parse_verl_console", lambda t: calls.append(1) or real(t))
    monkeypatch.setattr("lld_monitor.importers.load._RUNS_CACHE_MAX_BYTES", 0)  # (no cache)
    runs = load_runs(path)
    assert [n for n, _ in runs] == ["1", "2", "3"] and len(calls) == 1


def test_catalog_suffixes_are_the_formats_declarations():
    from lld_monitor.importers import catalog

    assert catalog.LOG_SUFFIXES is LOG_SUFFIXES
    assert frozenset().union(*(f.suffixes for f in REGISTRY)) == LOG_SUFFIXES
    assert LOG_SUFFIXES >= {".json", ".jsonl", ".csv", ".ipynb", ".parquet", ".wandb"}
    assert MAYBE_LOG_SUFFIXES >= {".log", ".out", ".md", ".txt", ".tsv"}
    src = (ROOT / "lld_monitor" / "importers" / "catalog.py").read_text()
    assert not re.search(r"[\"']\.(?:jsonl?|csv|log|txt|md|ipynb|parquet|wandb|tsv|out)[\"']", src)


def test_load_names_no_format_class():
    import ast

    src = (ROOT / "lld_monitor" / "importers" / "load.py").read_text()
    assert "isinstance(fmt" not in src
    used = {n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name)}
    used |= {
        a.name for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom) for a in n.names
    }
    assert not used & {type(f).__name__ for f in REGISTRY}


def test_triage_of_an_appended_log_reads_it_once_for_its_runs(tmp_path, monkeypatch):
    """Above the runs cache's size: listing the runs parses the log once, and reading the three
    runs once more (load_runs), not once a run."""
    from lld_monitor.analysis.triage import triage
    from lld_monitor.importers import formats

    path = tmp_path / "three.log"
    path.write_text((FIX / "verl_console.log").read_text() * 3)
    calls = []
    real = formats.parse_verl_console
    monkeypatch.setattr(formats, "parse_verl_console", lambda t: calls.append(1) or real(t))
    monkeypatch.setattr("lld_monitor.importers.load._RUNS_CACHE_MAX_BYTES", 0)
    verdicts = triage(path, jobs=1)
    assert sorted(v.name for v in verdicts) == ["three.log [1]", "three.log [2]", "three.log [3]"]
    assert all(v.rows == 3 for v in verdicts)
    assert len(calls) == 2


def test_a_folder_listing_does_not_parse_a_notebook_for_its_runs(monkeypatch):
    """A notebook holds one run: listing it asks no format for runs (``Format.several``)."""
    from lld_monitor.importers import formats
    from lld_monitor.importers.load import runs_in_file

    calls = []
    real = formats.notebook_tables
    monkeypatch.setattr(formats, "notebook_tables", lambda d: calls.append(1) or real(d))
    assert runs_in_file(FIX / "notebook.ipynb") == []
    assert calls == []


def test_a_checkpoint_folder_parses_each_checkpoint_once_per_version(tmp_path, monkeypatch):
    import shutil

    from lld_monitor.importers import formats

    shutil.copytree(SHAPES / "trl_checkpoints", tmp_path / "out")
    formats._state_problem.cache_clear()
    calls = []
    real = formats._state_problem.__wrapped__
    monkeypatch.setattr(
        formats,
        "_state_problem",
        formats.functools.lru_cache(maxsize=64)(lambda *a: calls.append(a[0]) or real(*a)),
    )
    df = load_table(tmp_path / "out")  # detection and the folder's notes both ask
    assert len(df) == 30
    # checkpoint-40 (cut off) and checkpoint-30 (the one read), each parsed once
    assert sorted(Path(c).parent.name for c in calls) == ["checkpoint-30", "checkpoint-40"]
