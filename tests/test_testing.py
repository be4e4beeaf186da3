"""The labelled run generator: truth consistent with the curves, determinism, variants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lld_monitor import columns as C
from lld_monitor.testing import HEALTHY_KINDS, KINDS, make_run, make_suite, write_suite


def test_collapse_labels_follow_the_paper_timeline():
    run = make_run("collapse", seed=1)
    lab = run.labels
    phases = lab["phases"]
    assert [p["phase"] for p in phases] == ["stagnation", "decay", "collapse"]
    # contiguous cover of 0..n-1
    assert phases[0]["start_step"] == 0 and phases[-1]["end_step"] == lab["n_steps"] - 1
    for a, b in itertools.pairwise(phases):
        assert b["start_step"] == a["end_step"] + 1
    # paper: stagnation to ~60, decay to ~120, collapse after ~120
    assert 45 <= lab["stagnation_end"] <= 75
    assert 90 <= lab["collapse_start"] <= 145
    assert lab["collapse_start"] + 25 <= lab["collapse_step"] <= lab["collapse_start"] + 60
    assert lab["simulated"] is True and lab["failure"] is None


def test_collapse_step_is_where_reward_halves():
    # collapse_step = first step with noise-free reward below half its peak: the observed reward,
    # averaged over +-4 steps, is near half the peak there and far below it 30 steps later
    run = make_run("collapse", seed=2, collapse_start=120, collapse_step=160, n_steps=260)
    r = run.steps.set_index(C.STEP)[C.REWARD_MEAN]
    peak = run.labels["reward_peak"]
    near = r.loc[156:164].mean()
    assert near == pytest.approx(0.5 * peak, abs=0.04)
    assert r.loc[118:122].mean() == pytest.approx(peak, abs=0.04)
    assert r.loc[190:200].mean() < 0.3 * peak


def test_lld_signals_move_by_phase():
    run = make_run("collapse", seed=3, stagnation_end=60, collapse_start=120, collapse_step=170)
    s = run.steps.set_index(C.STEP)
    lp = s[C.LOGP_CORRECT]
    # flat in phase I, down in II, sharply down in III
    assert abs(lp.loc[5:15].mean() - lp.loc[45:55].mean()) < 0.02
    assert lp.loc[105:115].mean() < lp.loc[65:75].mean() - 0.03
    assert lp.loc[180:190].mean() < lp.loc[105:115].mean() - 0.1
    # grad norm stable until phase III, then surges; most correct responses displaced late
    g = s[C.GRAD_NORM]
    assert g.loc[150:170].median() > 1.5 * g.loc[60:100].median()
    assert s[C.FRAC_CORRECT_DISPLACED].loc[170:].mean() > 0.5


def test_deterministic_by_seed():
    a = make_run("dip", seed=5).steps
    b = make_run("dip", seed=5).steps
    c = make_run("dip", seed=6).steps
    assert a.equals(b)
    assert not a.equals(c)


def test_standard_only_and_sparse_variants():
    run = make_run("collapse", seed=4, standard_only=True, log_every=10)
    cols = set(run.steps.columns)
    assert not cols & set(C.LLD_COLUMNS)
    assert {C.REWARD_MEAN, C.GRAD_NORM, C.ENTROPY, C.KL, C.COMPLETION_LENGTH} <= cols
    assert (run.steps[C.STEP] % 10 == 0).all()
    assert run.labels["standard_only"] and run.labels["log_every"] == 10
    assert run.name == "collapse_std_every10_s4"


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_well_formed(kind):
    run = make_run(kind, seed=8)
    df = run.steps
    assert df[C.STEP].is_monotonic_increasing and len(df) == run.labels["n_steps"]
    assert set(C.STEP_COLUMNS) >= set(df.columns)
    numeric = df.drop(columns=[C.LOSS, C.GRAD_NORM])
    assert np.isfinite(numeric.to_numpy()).all()
    if kind in HEALTHY_KINDS:
        assert run.labels["collapse_step"] is None
        assert run.labels["phases"] == [
            {"phase": "healthy", "start_step": 0, "end_step": run.labels["n_steps"] - 1}
        ]


def test_hard_negative_features_are_there():
    spikes = make_run("grad_spikes", seed=1, spike_steps=[60, 140])
    g = spikes.steps.set_index(C.STEP)[C.GRAD_NORM]
    assert g.loc[60] > 5 * g.loc[40:55].median()
    dip = make_run("dip", seed=1, dip_steps=[80])
    r = dip.steps.set_index(C.STEP)[C.REWARD_MEAN]
    assert r.loc[86:94].mean() < 0.9 * r.loc[70:78].mean()  # dips
    assert r.loc[140:160].mean() > 0.95 * r.loc[70:78].mean()  # and recovers


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="kind must be one of"):
        make_run("boom")
    with pytest.raises(ValueError, match="unknown timeline keys"):
        make_run("collapse", decay_end=10)
    with pytest.raises(ValueError, match="stagnation_end < collapse_start"):
        make_run("collapse", stagnation_end=100, collapse_start=50)
    with pytest.raises(ValueError, match="log_every"):
        make_run("healthy", log_every=0)


def test_suite_composition_and_disjoint_seeds():
    a = make_suite(20, seed=1)
    b = make_suite(20, seed=2)
    assert sum(r.labels["kind"] == "collapse" for r in a) == 8
    assert {r.labels["kind"] for r in a} == {"collapse", *HEALTHY_KINDS}
    assert not {r.labels["seed"] for r in a} & {r.labels["seed"] for r in b}
    assert len({r.name for r in a}) == 20


def test_write_suite_round_trips_through_the_run_log(tmp_path):
    runlog = pytest.importorskip("lld_monitor.runlog")
    runs = make_suite(3, seed=3, kinds=("collapse", "healthy"))
    paths = write_suite(runs, tmp_path)
    for run, path in zip(runs, paths):
        loaded = runlog.load_run(path)
        assert loaded.meta["simulated"] is True
        assert loaded.meta["labels"]["collapse_step"] == run.labels["collapse_step"]
        got = loaded.steps[C.REWARD_MEAN].to_numpy()
        np.testing.assert_allclose(got, run.steps[C.REWARD_MEAN].to_numpy())
