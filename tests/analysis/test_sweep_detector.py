"""scripts/sweep_detector.py on a tiny grid: table structure and figures checked by hand."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.detector import DetectorConfig, PhaseDetector
from lld_monitor.analysis.evaluation import run_detector, score_run
from lld_monitor.testing import make_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "sweep_detector.py"


def _module():
    spec = importlib.util.spec_from_file_location("sweep_detector", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tables(text):
    """{section title: [row cells]} of the markdown report."""
    out, title = {}, None
    for line in text.splitlines():
        if line.startswith("### "):
            title = line[4:]
            out[title] = []
        elif line.startswith("| ") and title is not None:
            out[title].append([c.strip() for c in line.strip("|").split("|")])
    return out


def test_sweep_on_a_tiny_grid(tmp_path):
    out = tmp_path / "sweep.json"
    args = ["--seed", "3", "--phase-steps", "30,60", "--log-every", "1,5", "--noise", "low"]
    args += ["--kinds", "collapse,plateau", "--n-per-cell", "1", "--collapse-weight", "1"]
    args += ["--probe-every", "2,8", "--rows-per-batch", "4"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    tables = _tables(proc.stdout)
    mod = _module()
    assert list(tables) == ["Overall", *(f"By {title}" for _, title in mod.AXES)]
    for rows in tables.values():
        assert len(rows[0]) == 12 and all(len(r) == 12 for r in rows)
        assert rows[0][1] == "collapsing runs" and rows[0][9] == "ours: false-alarm runs"
    # 2 phase lengths x 2 log intervals x 1 noise level = 4 cells, one collapse + one plateau each
    assert [r[:2] + r[8:9] for r in tables["Overall"][1:]] == [["all", "4", "4"]]
    assert [r[:2] + r[8:9] for r in tables["By phase length (steps)"][1:]] == [
        ["30", "2", "2"],
        ["60", "2", "2"],
    ]
    # 4 runs per kind over 2 (probe interval, rows per batch) pairs: each pair twice per kind
    assert [r[:2] + r[8:9] for r in tables["By probe interval (rollout batches)"][1:]] == [
        ["2", "2", "2"],
        ["8", "2", "2"],
    ]
    assert [r[:2] + r[8:9] for r in tables["By rows per rollout batch"][1:]] == [["4", "4", "4"]]
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert len(runs) == doc["n_runs"] == 8
    early = sum(r["scores"]["ours"]["early_warning"] for r in runs if r["collapse"])
    assert tables["Overall"][1][2].startswith(f"{early}/4")
    fa = sum(r["scores"]["ours"]["false_alarm_any"] for r in runs if not r["collapse"])
    assert tables["Overall"][1][9].startswith(f"{fa}/4")
    assert doc["figures"]["overall"]["ours"]["early_warning"] == early
    # every record re-scores by hand: the same run, the same detector, the same figures
    for rec in runs[:2]:
        run = make_run(rec["kind"], seed=rec["seed"], **rec["knobs"])
        assert len(run.steps) == rec["n_rows"]
        alerts = run_detector(PhaseDetector(), run.steps)
        s = score_run("ours", alerts, run.labels)
        assert s.first_early == rec["scores"]["ours"]["first_early"]
        # the record names our LLD alerts (what a false alarm was), with their trend evidence
        lld = [a for a in alerts if a.kind in ("stagnation", "decay", "displacement", "collapse")]
        got_kinds = [(a["step"], a["kind"]) for a in rec["lld_alerts"]]
        assert got_kinds == [(a.step, a.kind) for a in lld]
        for a, got in zip(lld, rec["lld_alerts"]):
            assert got.get("trend_level") == a.evidence.get("trend_level")
        assert s.early_warning == rec["scores"]["ours"]["early_warning"]
        assert s.false_alarm_any == rec["scores"]["ours"]["false_alarm_any"]
    # the baselines only emit collapse alerts: never an early warning
    assert not any(r["scores"][d]["early_warning"] for r in runs for d in ("grad_spike",))


def test_phase2_t_matches_a_least_squares_fit():
    scipy_stats = pytest.importorskip("scipy.stats")
    mod = _module()
    rng = np.random.default_rng(0)
    x = np.arange(100, 160)
    y = -0.001 * x + rng.normal(0, 0.01, len(x))
    steps = pd.DataFrame({C.STEP: np.arange(0, 300), C.LOGP_CORRECT: np.nan})
    steps.loc[x, C.LOGP_CORRECT] = y
    fit = scipy_stats.linregress(x, y)
    t = mod.phase2_t(steps, {"decay_start": 100, "collapse_start": 160})
    assert t == pytest.approx(fit.slope / fit.stderr)
    assert mod.phase2_t(steps, {"decay_start": None, "collapse_start": None}) is None


def test_config_overrides_are_typed_and_reach_the_detector():
    mod = _module()
    for f in dataclasses.fields(DetectorConfig):
        if f.name in ("level_shift", "mode_collapse"):
            continue
        default = getattr(DetectorConfig(), f.name)
        got = mod.parse_config([f"{f.name}={default}"])
        assert got == {f.name: default} and type(got[f.name]) is type(default)
    # a section's setting by section.name, typed like its default (a tuple from a list)
    got = mod.parse_config(["level_shift.p_false_run=0.01", "level_shift.block_rows=4,8"])
    assert got == {"level_shift.p_false_run": 0.01, "level_shift.block_rows": (4, 8)}
    det = PhaseDetector(**got)
    assert det.config.level_shift.p_false_run == 0.01
    assert det.config.level_shift.block_rows == (4, 8)
    with pytest.raises(ValueError, match="want key=value"):
        mod.parse_config(["level_shift.no_such_knob=1"])
    with pytest.raises(ValueError, match="want key=value"):
        mod.parse_config(["no_such_knob=1"])
    spec = mod.grid(1, n_per_cell=1, phase_steps=(30,), log_every=(1,), noise=("low",))[0]
    with pytest.raises(ValueError, match="unknown PhaseDetector hyperparameter"):
        mod.run_one(spec, {"no_such_knob": 1})
    assert mod.main(["--seed", "1", "--config", "nope=1"]) == 2


def test_default_grid_is_balanced():
    import collections

    mod = _module()
    specs = mod.grid(5)
    assert len(specs) == 72 * (4 + 6 * 2)
    for kind in mod.KINDS:
        knobs = [s["knobs"] for s in specs if s["kind"] == kind]
        pairs = collections.Counter((k["probe_every"], k["rows_per_batch"]) for k in knobs)
        assert len(pairs) == 16 and len(set(pairs.values())) == 1, kind
        assert collections.Counter(k["phase_steps"] for k in knobs) == {
            p: len(knobs) // 6 for p in mod.PHASE_STEPS
        }
    assert specs == mod.grid(5) and specs != mod.grid(6)
