"""Offline analysis: segments vs the generator's truth, replay consistency, inputs, real logs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.analysis import Analysis, PhaseDetector, analyze_run
from lld_monitor.analysis.offline import prepare_steps
from lld_monitor.testing import make_run, write_run

REAL_RUNS = Path(__file__).resolve().parents[3] / "shared" / "real_runs"  # beside the repo


def _truth(run, phase):
    return next(p for p in run.labels["phases"] if p["phase"] == phase)


@pytest.mark.parametrize("seed", [41, 42, 43])
def test_collapse_run_segments_near_the_truth(seed):
    run = make_run("collapse", seed=seed)
    a = analyze_run(run.steps)
    names = [s.phase for s in a.phases]
    # phase I (sometimes after a short healthy warm-up: flatness takes rows to establish),
    # then II, then III
    assert names[-3:] == ["stagnation", "decay", "collapse"]
    assert names[:-3] in ([], ["healthy"])
    assert names[0] == "stagnation" or a.phases[0].end_step < 25
    # segments tile the run
    assert a.phases[0].start_step == 0 and a.phases[-1].end_step == run.labels["n_steps"] - 1
    for prev, cur in zip(a.phases, a.phases[1:]):
        assert cur.start_step == prev.end_step + 1
    # refined boundaries within 15 steps of the true ones (detection alone lags 20-40 steps)
    decay, collapse = a.phases[-2], a.phases[-1]
    assert abs(decay.start_step - _truth(run, "decay")["start_step"]) <= 15
    assert abs(collapse.start_step - _truth(run, "collapse")["start_step"]) <= 15
    assert abs(a.collapse_step - run.labels["collapse_step"]) <= 10
    assert decay.evidence["logp_correct_end"] < decay.evidence["logp_correct_start"]


def test_offline_alerts_equal_the_online_replay():
    run = make_run("collapse", seed=44, log_every=3)
    online = PhaseDetector()
    live = [al for rec in run.steps.to_dict("records") for al in online.update(rec)]
    a = analyze_run(run.steps)
    assert [x.to_dict() for x in a.alerts] == [x.to_dict() for x in live]
    assert a.signals_used == online.signals_used


def test_to_dict_has_exactly_the_json_schema():
    a = analyze_run(make_run("collapse", seed=45).steps)
    d = json.loads(json.dumps(a.to_dict()))
    assert set(d) == {"phases", "alerts", "collapse_step", "collapse", "signals"}
    assert d["collapse"]["reward_fell"] == d["collapse_step"]
    # the phase starts before (or where) the reward falls; the online alert comes at or after
    seg = next(p for p in d["phases"] if p["phase"] == "collapse")
    assert d["collapse"]["phase_start"] == seg["start_step"] <= d["collapse_step"]
    assert all(set(p) == {"phase", "start_step", "end_step"} for p in d["phases"])
    keys = {"step", "kind", "severity", "headline", "since_step", "actions", "message", "repeats"}
    assert all(set(x) == keys for x in d["alerts"])
    assert set(d["signals"]) == {"used", "missing"}
    assert isinstance(d["collapse_step"], int)
    assert all(p["phase"] in C.PHASES for p in d["phases"])


def test_healthy_run_is_one_healthy_segment():
    run = make_run("healthy", seed=46)
    a = analyze_run(run.steps)
    assert [(s.phase, s.start_step, s.end_step) for s in a.phases] == [
        ("healthy", 0, run.labels["n_steps"] - 1)
    ]
    assert a.collapse_step is None and a.alerts == []


def test_standard_only_run_is_unknown_then_collapse_and_says_why():
    run = make_run("collapse", seed=47, standard_only=True)
    a = analyze_run(run.steps)
    assert [s.phase for s in a.phases] == ["unknown", "collapse"]
    assert C.LOGP_CORRECT in a.signals_missing and C.REWARD_MEAN in a.signals_used
    assert any("stagnation and decay cannot be detected" in n for n in a.notes)
    # without LLD columns the collapse boundary comes from the reward's change point
    assert abs(a.phases[1].start_step - _truth(run, "collapse")["start_step"]) <= 15


def test_unsorted_duplicated_rows_and_strings():
    run = make_run("collapse", seed=48)
    df = run.steps
    shuffled = pd.concat([df.sample(frac=1.0, random_state=0), df.iloc[:10]])
    a1 = analyze_run(df)
    a2 = analyze_run(shuffled)
    assert a1.to_dict() == a2.to_dict()
    with pytest.raises(ValueError, match="no 'step' column"):
        analyze_run(df.drop(columns=[C.STEP]))
    with pytest.raises(ValueError, match="needs a Run, a pandas DataFrame or a path"):
        analyze_run(42)
    empty = analyze_run(df.iloc[:0])
    assert isinstance(empty, Analysis) and empty.phases == [] and empty.collapse_step is None


def test_run_folder_run_object_and_csv_path_agree(tmp_path):
    from lld_monitor import runlog

    run = make_run("collapse", seed=49, log_every=2)
    folder = write_run(run, tmp_path / "sim")
    by_df = analyze_run(run.steps).to_dict()
    assert analyze_run(folder).to_dict() == by_df
    assert analyze_run(str(folder)).to_dict() == by_df
    assert analyze_run(runlog.load_run(folder)).to_dict() == by_df
    csv = tmp_path / "steps.csv"
    run.steps.to_csv(csv, index=False)
    assert analyze_run(csv).to_dict() == by_df


def test_sparse_standard_only_segments_use_steps():
    run = make_run("collapse", seed=50, standard_only=True, log_every=10)
    a = analyze_run(run.steps)
    assert all(s.start_step % 10 == 0 and s.end_step % 10 == 0 for s in a.phases)
    assert a.collapse_step is not None and a.collapse_step % 10 == 0


# --- real logs of other people's runs (every labelled log: tests/test_real_runs.py) ----------


@pytest.mark.skipif(not REAL_RUNS.is_dir(), reason="real runs folder absent")
def test_real_dapo_log_shows_its_entropy_collapse():
    # JuncyLu's DAPO run: entropy falls 0.96 -> ~0.03, completions shrink to ~4 tokens and most
    # groups get identical rewards: a real degradation, reported as such (not as LLD)
    path = REAL_RUNS / "JuncyLu__trl_DAPO__training_logs-20251022_120531-run_terminal.md"
    from lld_monitor import importers

    a = analyze_run(importers.load_table(path))
    kinds = [x.kind for x in a.alerts]
    assert "entropy_collapse" in kinds and "dead_signal" in kinds
    # completions 53 -> 2.6 tokens by step 20 while 70-100% of groups are identical: named as
    # mode collapse on the 3rd row (step 30), long before the entropy floor (step 200)
    assert a.alerts[0].kind == "mode_collapse" and a.alerts[0].step == 30


def test_refinement_is_capped_and_says_so(monkeypatch):
    from lld_monitor.analysis import offline

    run = make_run("collapse", seed=51)
    monkeypatch.setattr(offline, "MAX_REFINEMENTS", 1)
    a = analyze_run(run.steps)
    assert any("more than 1 phase escalations" in n for n in a.notes)
    # escalations after the first keep the step where the detector became sure
    later = [s for s in a.phases if s.phase in ("decay", "collapse")]
    assert later and all(s.start_step == s.evidence["detected_at"] for s in later)
    assert [x.to_dict() for x in a.alerts] == [x.to_dict() for x in analyze_run(run.steps).alerts]


def test_a_duplicated_step_keeps_the_same_row_from_a_frame_and_from_its_csv(tmp_path):
    """The later row of a repeated step wins, from a DataFrame as from the CSV of it (the
    importers keep the last row): step 150 logged twice, 0.9 then 0.0."""
    from lld_monitor.importers import load_table

    df = pd.DataFrame(
        {C.STEP: [*range(5, 150, 5), 150, 150], C.REWARD_MEAN: [0.9] * 29 + [0.9, 0.0]}
    )
    prepared = prepare_steps(df)
    assert prepared.loc[prepared[C.STEP] == 150, C.REWARD_MEAN].tolist() == [0.0]
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    from_csv = prepare_steps(load_table(path))
    assert from_csv[C.REWARD_MEAN].tolist() == prepared[C.REWARD_MEAN].tolist()


def test_a_repeated_step_is_one_row_by_one_rule_in_a_frame_a_csv_and_a_run_folder(tmp_path):
    # step 2 logged twice: loss 1.0 and reward 0.5, then loss 9.0 and no reward (a resumed
    # run, or a logger that writes one step in two records): the later value wins where it
    # has one, the blank keeps the earlier (runlog.one_row_per_step), read from every source
    from lld_monitor.importers import load_table
    from lld_monitor.runlog import RunWriter, one_row_per_step

    rows = [
        {C.STEP: 1, C.LOSS: 1.0, C.REWARD_MEAN: 0.4},
        {C.STEP: 2, C.LOSS: 1.0, C.REWARD_MEAN: 0.5},
        {C.STEP: 3, C.LOSS: 1.0, C.REWARD_MEAN: 0.6},
        {C.STEP: 2, C.LOSS: 9.0, C.REWARD_MEAN: float("nan")},
    ]
    df = pd.DataFrame(rows)
    want = {C.STEP: [1, 2, 3], C.LOSS: [1.0, 9.0, 1.0], C.REWARD_MEAN: [0.4, 0.5, 0.6]}
    merged = one_row_per_step(df)
    assert merged[list(want)].to_dict("list") == want
    assert prepare_steps(df)[list(want)].to_dict("list") == want
    df.to_csv(tmp_path / "t.csv", index=False)
    assert load_table(tmp_path / "t.csv")[list(want)].to_dict("list") == want
    w = RunWriter(tmp_path / "run")
    for r in rows[:3]:
        w.log_step(r)
    w.close()
    w = RunWriter(tmp_path / "run", resume=True)
    w.log_step({C.STEP: 2, C.LOSS: 9.0})  # (the resumed run logs no reward at step 2)
    w.close()
    from lld_monitor.runlog import load_run

    assert load_run(tmp_path / "run").steps[list(want)].to_dict("list") == want
    # a table already one row a step, in order, is the same object (no copy)
    ordered = df.iloc[:3]
    assert one_row_per_step(ordered) is ordered
