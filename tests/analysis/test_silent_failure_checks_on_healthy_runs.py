"""The checks of the failures no reward curve shows (issue 51: ``no_update``, ``zero_grad``,
``sampler_mismatch``, ``llds_inert``) raise nothing on healthy runs: the simulated healthy suites
(LLD columns, standard metrics only, sparse logs), the stored toy runs whose verdict is healthy
(real training: grad norms, zero-variance groups and, with LLDS on from the start or switched
on, the LLDS columns; made before ``probe_still`` was written) and the shared real logs a person
called healthy."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lld_monitor.analysis import analyze_run
from lld_monitor.runlog import load_run
from lld_monitor.testing import HEALTHY_KINDS, STANDARD_HEALTHY_KINDS, make_suite
from lld_monitor.testing.standard import make_standard_suite

ROOT = Path(__file__).resolve().parents[2]
REAL_RUNS = ROOT.parent / "shared" / "real_runs"
SILENT_FAILURE_KINDS = {"no_update", "zero_grad", "sampler_mismatch", "llds_inert"}


def _raised(steps) -> list[tuple[str, int]]:
    return [(a.kind, a.step) for a in analyze_run(steps).alerts if a.kind in SILENT_FAILURE_KINDS]


def test_the_simulated_healthy_suites_raise_none_of_them():
    runs = make_suite(30, 11, kinds=HEALTHY_KINDS, frac_collapse=0.0)
    runs += make_standard_suite(3, 11, kinds=STANDARD_HEALTHY_KINDS)
    raised = {r.labels["name"]: _raised(r.steps) for r in runs}
    assert len(raised) == 30 + 3 * len(STANDARD_HEALTHY_KINDS)
    assert not any(raised.values()), {k: v for k, v in raised.items() if v}


def _healthy_sample_runs() -> list[str]:
    # the golden file's triage verdict of every stored run (tests/importers/test_golden.py)
    with (ROOT / "tests" / "fixtures" / "import_golden.tsv").open(newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return [
        r["input"]
        for r in rows
        if r["input"].startswith(("sample_runs/real/", "sample_runs/auto/"))
        and r["verdict"] == "healthy"
    ]


def test_the_healthy_toy_runs_raise_none_of_them():
    names = _healthy_sample_runs()
    assert len(names) >= 15  # real/ (LLDS off, on, auto) and auto/default-*
    assert any("llds-on" in n for n in names)  # LLDS on from the start: the inert check's case
    for name in names:
        run = load_run(ROOT / name, warn=False)
        assert _raised(run.steps) == [], name


@pytest.mark.skipif(not REAL_RUNS.is_dir(), reason=f"the shared real logs are not at {REAL_RUNS}")
def test_the_real_logs_called_healthy_raise_none_of_them():
    from lld_monitor.importers import load_table

    with (REAL_RUNS / "verdicts.tsv").open(newline="") as fh:
        verdicts = list(csv.DictReader(fh, delimiter="\t"))
    healthy = [v["file"] for v in verdicts if v["verdict"] == "healthy"]
    assert healthy
    for name in healthy:
        assert _raised(load_table(REAL_RUNS / name)) == [], name
