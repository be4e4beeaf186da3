"""The import golden file: every log shape that reads right stays read right.

``tests/fixtures/import_golden.tsv`` pins, for every importer fixture (``tests/fixtures/importers``,
its ``shapes/`` included), every sample run (``sample_runs/``) and every log in
``../shared/real_runs`` (when it lies beside the repo), each run it holds: the format, the rows,
the first and last step, the step source and the triage verdict. A change to the golden file is
made in the same commit as the code that changes it, with the reason in the message:

    .venv/bin/python tests/importers/test_golden.py --write   # rewrite it, then read the diff

A new fixture without a row fails (``--write`` adds it); so does a row whose input is gone.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "importers"
SAMPLE_RUNS = ROOT / "sample_runs"
REAL_RUNS = ROOT.parent / "shared" / "real_runs"
GOLDEN = ROOT / "tests" / "fixtures" / "import_golden.tsv"
FIELDS = (
    "input",
    "run",
    "format",
    "rows",
    "first_step",
    "last_step",
    "step_source",
    "verdict",
    "error",
)
#: Files of the fixture folders that are not logs (notes for people).
NOT_LOGS = {"README.md", "verdicts.tsv"}


def inputs() -> list[tuple[str, Path]]:
    """(key, path) of every pinned input that lies here: ``fixtures/...``, ``sample_runs/...``,
    ``real_runs/...`` (the last only where ../shared is beside the repo)."""
    from lld_monitor.runlog import find_runs

    out: list[tuple[str, Path]] = []
    # the fixture files, and each entry of shapes/ (a file, or a folder that is one case: a log
    # dir, an output folder)
    entries = [p for p in FIXTURES.iterdir() if p.is_file()]
    if (FIXTURES / "shapes").is_dir():
        entries += list((FIXTURES / "shapes").iterdir())
    for p in sorted(entries):
        if p.name not in NOT_LOGS and p.suffix != ".py" and not p.name.startswith("."):
            out.append((f"fixtures/{p.relative_to(FIXTURES).as_posix()}", p))
    for run in sorted(find_runs(SAMPLE_RUNS)):
        out.append((f"sample_runs/{run.relative_to(SAMPLE_RUNS).as_posix()}", run))
    if REAL_RUNS.is_dir():
        for p in sorted(REAL_RUNS.iterdir()):
            if p.is_file() and p.name not in NOT_LOGS:
                out.append((f"real_runs/{p.name}", p))
    return out


def describe(key: str, path: Path) -> list[dict[str, str]]:
    """One row per run the input holds, as ``lld-monitor analyze`` reads it: a folder or file
    of several runs gives one row per run of the catalog (the triage); one run, its analysis."""
    from lld_monitor.analysis.triage import analyse_one, is_collection_of_runs, one_run_in
    from lld_monitor.importers import load_table
    from lld_monitor.importers.catalog import catalog, entries_of

    if is_collection_of_runs(path):
        entries = catalog(path)[0] if path.is_dir() else entries_of(path, path.name)
        targets = [(e.path, e.run, e.name if path.is_dir() else (e.run or "")) for e in entries]
    else:  # one run (a folder of one run: that run, as the CLI reads it)
        only = one_run_in(path)
        targets = [(only[0], only[1], "") if only is not None else (path, None, "")]
    rows = []
    for target, run, label in targets:
        row = dict.fromkeys(FIELDS, "")
        row["input"], row["run"] = key, label
        verdict, _ = analyse_one(target, target.parent, run, jobs=1)
        row["verdict"] = verdict.verdict
        if verdict.verdict in ("unreadable", "skipped", "summary"):
            row["format"] = "-"
            # what was wrong, without the path (the start of the error: its kind)
            error = str(verdict.error or "").replace(str(target), "PATH")
            row["error"] = error[:80]
            rows.append(row)
            continue
        df = load_table(target, run=run)
        steps = df["step"]
        row.update(
            format=str(df.attrs.get("source_format")),
            rows=str(len(df)),
            first_step=f"{steps.iloc[0]:g}",
            last_step=f"{steps.iloc[-1]:g}",
            step_source=str(df.attrs.get("step_source")),
        )
        rows.append(row)
    return rows


def read_golden() -> list[dict[str, str]]:
    with GOLDEN.open(newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def write_golden() -> None:
    rows = [r for key, path in inputs() for r in describe(key, path)]
    if not REAL_RUNS.is_dir() and GOLDEN.is_file():  # (keep the rows of logs not here)
        rows += [r for r in read_golden() if r["input"].startswith("real_runs/")]
    rows.sort(key=lambda r: (r["input"], r["run"]))
    with GOLDEN.open("w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS, delimiter="\t", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {GOLDEN.relative_to(ROOT)}: {len(rows)} rows")


_INPUTS = inputs()


def test_every_input_has_golden_rows_and_every_row_an_input():
    golden = {r["input"] for r in read_golden()}
    here = {key for key, _ in _INPUTS}
    missing = sorted(here - golden)
    assert not missing, f"inputs without a golden row (run this file with --write): {missing}"
    gone = sorted(
        k for k in golden - here if not (k.startswith("real_runs/") and not REAL_RUNS.is_dir())
    )
    assert not gone, f"golden rows whose input is gone: {gone}"


@pytest.mark.parametrize("key,path", _INPUTS, ids=[k for k, _ in _INPUTS])
def test_input_reads_as_pinned(key, path):
    want = [r for r in read_golden() if r["input"] == key]
    got = describe(key, path)
    assert got == want


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    sys.path.insert(0, str(ROOT))
    write_golden()
