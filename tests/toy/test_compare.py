"""The demo's two-arm comparison and the drift check, on hand-made rows and on the stored runs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.toy.compare import (
    COLLAPSED_ACCURACY,
    first_alerts,
    peak_fall_step,
    read_arm,
    reward_fall_step,
    rollout_batch_means,
    steps_drift,
    verdict_line,
)

ROOT = Path(__file__).resolve().parents[2]
AUTO = ROOT / "sample_runs" / "auto"
S1 = "s1-small-32upd-lr3e-3"


def _steps(rewards: list[float]) -> pd.DataFrame:
    return pd.DataFrame({C.STEP: range(1, len(rewards) + 1), C.REWARD_MEAN: rewards})


def test_rollout_batch_means_and_the_fall_rule_by_hand():
    # batches of 4: means 0.4, 0.25 (not below half of 0.4), 0.1 (below): fell at step 9
    rows = _steps([0.4, 0.4, 0.4, 0.4, 0.3, 0.2, 0.3, 0.2, 0.1, 0.1, 0.0, 0.2, 0.5])
    assert rollout_batch_means(rows, 4) == pytest.approx([0.4, 0.25, 0.1, 0.5])
    fell, means = reward_fall_step(rows, 4)
    assert fell == 9 and len(means) == 4
    # NaN rewards are left out of their batch's mean; a batch of NaN is no evidence
    rows = _steps([0.4, math.nan, 0.4, 0.4, math.nan, math.nan, math.nan, math.nan])
    fell, means = reward_fall_step(rows, 4)
    assert means[0] == pytest.approx(0.4) and math.isnan(means[1]) and fell is None
    # a first batch that earned nothing cannot fall
    assert reward_fall_step(_steps([0.0] * 8), 4)[0] is None
    with pytest.raises(ValueError):
        rollout_batch_means(rows, 0)


def test_the_fall_from_the_peak_by_hand():
    # window 4: trailing means from step 4: 0.2, 0.3, 0.4, 0.5, 0.6, 0.475, 0.35, 0.225, 0.1;
    # running peak 0.6 from step 8; the first mean below half of it (0.3) is 0.225 at step 11
    rows = _steps([0.2] * 4 + [0.6] * 4 + [0.1] * 4)
    step, peak = peak_fall_step(rows, window=4)
    assert step == 11 and peak == pytest.approx(0.6)
    # a rise that never falls: (None, its highest mean); a peak under MIN_PEAK is no peak
    step, peak = peak_fall_step(_steps([0.2] * 4 + [0.6] * 4), window=4)
    assert step is None and peak == pytest.approx(0.6)
    assert peak_fall_step(_steps([0.08] * 4 + [0.01] * 8), window=4)[0] is None
    # shorter than the window: nothing to say
    step, peak = peak_fall_step(_steps([0.5, 0.1]), window=4)
    assert step is None and math.isnan(peak)


def test_the_stored_d7_arms_fall_from_the_peak_where_the_spiral_study_said():
    # sample_runs/rescue: seed 0's LLDS-off run fell from its peak at 2221 (the spiral study's
    # table, spiral3/long2400), 1407 updates after the displacement alert; the automatic arm
    # did not fall
    d7 = ROOT / "sample_runs" / "rescue" / "s4-16upd-lr8e-4-G8-seed0"
    off, auto = read_arm(f"{d7}-off"), read_arm(f"{d7}-auto")
    assert off.fell_at is None and off.peak_fall[0] == 2221
    assert auto.peak_fall[0] is None and auto.llds_on_at == 814
    line = verdict_line(off, auto)
    assert "from its peak the reward fell at step 2221, 1407 steps after the first alert" in line
    assert "(+0.33)" in line


def test_first_alerts_keep_the_first_step_and_the_worst_severity():
    events = pd.DataFrame(
        [
            {
                C.EVENT_TYPE: "alert",
                C.EVENT_STEP: 20,
                C.EVENT_KIND: "collapse",
                "severity": "warning",
            },
            {C.EVENT_TYPE: "phase", C.EVENT_STEP: 5, C.EVENT_KIND: "decay", "severity": "info"},
            {
                C.EVENT_TYPE: "alert",
                C.EVENT_STEP: 9,
                C.EVENT_KIND: "displacement",
                "severity": "warning",
            },
            {
                C.EVENT_TYPE: "alert",
                C.EVENT_STEP: 30,
                C.EVENT_KIND: "collapse",
                "severity": "critical",
            },
        ]
    )
    assert first_alerts(events) == [
        ("displacement", 9, "warning"),
        ("collapse", 20, "critical"),
    ]
    assert first_alerts(pd.DataFrame()) == []


def test_the_stored_seed0_arms_read_as_the_readme_says():
    off = read_arm(AUTO / f"{S1}-seed0-off")
    auto = read_arm(AUTO / f"{S1}-seed0-auto")
    assert off.batch == 32 and off.steps == 400 and off.llds_mode == "off"
    # rollout batch 1 (updates 1-32) has mean reward 0.2375; batch 2 about 0.10: fell at 33
    assert off.batch_means[0] == pytest.approx(0.2375, abs=1e-6)
    assert off.fell_at == 33
    assert off.alerts[0][:2] == ("displacement", 14)
    assert off.llds_on_at is None and auto.llds_on_at == 14
    assert auto.llds_on_reason == "displacement"
    assert off.final_accuracy < COLLAPSED_ACCURACY < auto.final_accuracy
    line = verdict_line(off, auto)
    assert "19 steps before the reward fell" in line and "(+0.11)" in line


def test_the_demo_seed_is_the_first_whose_off_arm_collapsed_in_the_stored_table():
    from lld_monitor.cli.demo import DEMO_PRESET, DEMO_SEED, DEMO_SEED_CANDIDATES

    manifest = json.loads((ROOT / "sample_runs" / "manifest.json").read_text())
    off = {
        e["seed"]: e["final_eval"]["accuracy"]
        for e in manifest["auto"]
        if e["preset"] == DEMO_PRESET and e["llds_mode"] == "off"
    }
    assert set(DEMO_SEED_CANDIDATES) <= set(off), "the stored table lacks a candidate seed"
    rule = next(s for s in DEMO_SEED_CANDIDATES if off[s] < COLLAPSED_ACCURACY)
    assert rule == DEMO_SEED


def test_drift_finds_a_changed_value_and_an_event_of_one_run_only(tmp_path):
    stored = AUTO / f"{S1}-seed0-off"
    copy = tmp_path / "copy"
    shutil.copytree(stored, copy)
    assert steps_drift(stored, copy).same
    assert steps_drift(stored, copy, rows=50).rows_compared == 50
    lines = (copy / "steps.jsonl").read_text().splitlines()
    row = json.loads(lines[20])
    row[C.LOGP_CORRECT] = (row.get(C.LOGP_CORRECT) or 0.0) + 1e-9
    row[C.TIME] = 0.0  # wall time is not compared
    lines[20] = json.dumps(row)
    (copy / "steps.jsonl").write_text("\n".join(lines) + "\n")
    with open(copy / "events.jsonl", "a") as fh:
        fh.write(
            json.dumps(
                {
                    "type": "alert",
                    "step": 10,
                    "time": 0,
                    "kind": "decay",
                    "severity": "warning",
                    "message": "x",
                    "evidence": {},
                }
            )
            + "\n"
        )
    drift = steps_drift(stored, copy)
    assert not drift.same and not drift.same_trajectory
    assert drift.columns == {C.LOGP_CORRECT: 21}
    assert drift.events == ("alert decay at step 10 (re-run)",)
    assert "logp_correct: 21" in drift.describe()
    # an extra alert alone (rows 1-20: the changed value is at 21): the same trajectory, not
    # the same run
    only_event = steps_drift(stored, copy, rows=20)
    assert only_event.columns == {} and only_event.same_trajectory and not only_event.same
    # an event after the compared rows is not part of the comparison
    assert steps_drift(stored, copy, rows=9).events == ()
    with pytest.raises(ValueError):
        steps_drift(stored, copy, rows=10_000)


def test_the_drift_script_rebuilds_a_stored_runs_config_from_its_meta():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "check_sample_runs", ROOT / "scripts" / "check_sample_runs.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from lld_monitor.toy.train import preset_configs

    meta = json.loads((AUTO / f"{S1}-seed3-off" / "meta.json").read_text())
    assert mod.toy_config_from_meta(meta, 400) == preset_configs(400, 3)[S1]
    assert mod.toy_config_from_meta(meta, 41).steps == 41
    runs = mod.stored_runs(ROOT / "sample_runs", ["auto/"])
    assert AUTO / f"{S1}-seed0-auto" in runs and all(r.parent == AUTO for r in runs)
