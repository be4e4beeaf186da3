"""The labelled run generator: truth consistent with the curves, determinism, variants."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from lld_monitor import columns as C
from lld_monitor.testing import (
    CLASSIC_KINDS,
    HEALTHY_KINDS,
    KINDS,
    NOISE_LEVELS,
    make_run,
    make_suite,
    make_wide_suite,
    probe_rows,
    write_suite,
)


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
    if C.N_CORRECT in df.columns:
        # small-batch probes: a batch without a correct (incorrect) response has no share or
        # change of correct (incorrect) responses, and only then
        no_c = df[C.N_CORRECT] == 0
        assert df.loc[no_c, C.FRAC_CORRECT_DISPLACED].isna().all()
        assert df.loc[~no_c, [C.FRAC_CORRECT_DISPLACED, C.DELTA_CORRECT]].notna().all().all()
        numeric = numeric.loc[~no_c & (df[C.N_INCORRECT] > 0)]
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
    assert {r.labels["kind"] for r in a} == set(CLASSIC_KINDS)
    assert not {r.labels["seed"] for r in a} & {r.labels["seed"] for r in b}
    assert len({r.name for r in a}) == 20


def test_write_suite_round_trips_through_the_run_log(tmp_path):
    from lld_monitor import runlog

    runs = make_suite(3, seed=3, kinds=("collapse", "healthy"))
    paths = write_suite(runs, tmp_path)
    for run, path in zip(runs, paths):
        loaded = runlog.load_run(path)
        assert loaded.meta["simulated"] is True
        assert loaded.meta["labels"]["collapse_step"] == run.labels["collapse_step"]
        got = loaded.steps[C.REWARD_MEAN].to_numpy()
        np.testing.assert_allclose(got, run.steps[C.REWARD_MEAN].to_numpy())


# --- the widened runs --------------------------------------------------------------------------


def _batch_values(df, col, rows_per_batch):
    """One value per rollout batch (the batch's first row)."""
    return df.groupby(df[C.STEP] // rows_per_batch)[col].first().to_numpy()


@pytest.mark.parametrize("rows_per_batch", [1, 4])
def test_measured_noise_matches_the_requested_noise(rows_per_batch):
    # a converged plateau has flat curves: what moves is the noise, AR(1) across rollout batches
    run = make_run(
        "plateau",
        6000,
        seed=3,
        logp_noise=0.03,
        reward_noise=0.08,
        noise_ar=0.5,
        rows_per_batch=rows_per_batch,
    )
    lp = _batch_values(run.steps, C.LOGP_CORRECT, rows_per_batch)
    r = _batch_values(run.steps, C.REWARD_MEAN, rows_per_batch)
    assert len(lp) == 6000 // rows_per_batch
    assert lp.std() == pytest.approx(0.03, rel=0.08)
    assert r.std() == pytest.approx(0.08, rel=0.08)
    lag1 = np.corrcoef(lp[:-1], lp[1:])[0, 1]
    assert lag1 == pytest.approx(0.5, abs=0.08)
    white = make_run("plateau", 3000, seed=3, logp_noise=0.03).steps[C.LOGP_CORRECT].to_numpy()
    assert abs(np.corrcoef(white[:-1], white[1:])[0, 1]) < 0.08


def test_noise_levels_draw_from_their_ranges():
    for level, ranges in NOISE_LEVELS.items():
        for seed in range(4):
            lab = make_run("healthy", seed=seed, noise_level=level).labels
            lo, hi = ranges["logp"]
            assert lo <= lab["logp_noise"] <= hi and lab["noise_level"] == level
            lo, hi = ranges["reward"]
            assert lo <= lab["reward_noise"] <= hi
            assert 0 <= lab["noise_ar"] <= 0.6
    # the classic run's noise is far below the measured levels
    assert make_run("healthy", seed=1).labels["logp_noise"] <= 0.012


def test_probe_columns_on_every_kth_logged_row():
    run = make_run("healthy", seed=2, probe_every=3, batch_size=32)
    has = run.steps[C.N_CORRECT].notna().to_numpy()
    assert np.flatnonzero(has).tolist() == list(range(0, len(has), 3))
    for col in C.DISPLACEMENT_COLUMNS:
        if col in run.steps.columns:
            assert run.steps[col].notna().to_numpy().tolist() == has.tolist(), col
    # the standard and confidence columns are on every row
    assert run.steps[[C.REWARD_MEAN, C.LOGP_CORRECT, C.GRAD_NORM]].notna().all().all()
    # once per rollout batch: 4 steps per batch, every 2nd batch -> steps 0, 8, 16, ...
    run = make_run("healthy", seed=2, probe_every=2, rows_per_batch=4)
    got = run.steps.loc[run.steps[C.FRAC_CORRECT_DISPLACED].notna(), C.STEP]
    assert got.tolist() == list(range(0, run.labels["n_steps"], 8))
    # sparse logging: the probe rides on the first logged row of its batch
    assert probe_rows(np.array([0, 5, 10, 15, 20]), 4, 1).tolist() == [True] * 5
    assert probe_rows(np.array([0, 2, 4, 6, 8, 10]), 4, 2).tolist() == [
        True,
        False,
        False,
        False,
        True,
        False,
    ]


def test_rows_of_one_rollout_batch_repeat_their_reward_and_confidence():
    run = make_run("collapse", seed=4, rows_per_batch=4, noise_level="medium")
    df = run.steps
    by_batch = df.groupby(df[C.STEP] // 4)
    for col in (C.REWARD_MEAN, C.ACCURACY, C.LOGP_CORRECT, C.LOGP_INCORRECT):
        assert (by_batch[col].nunique() == 1).all(), col
    assert by_batch[C.REWARD_MEAN].first().nunique() > 0.9 * by_batch.ngroups
    # the optimizer-step columns still move within a batch
    assert (by_batch[C.GRAD_NORM].nunique() == 4).mean() > 0.9


def test_displaced_counts_are_binomial_integers():
    run = make_run("healthy", seed=5, batch_size=24, noise_level="low")
    p = run.steps.dropna(subset=[C.N_CORRECT])
    n_c, frac = p[C.N_CORRECT].to_numpy(), p[C.FRAC_CORRECT_DISPLACED].to_numpy()
    assert (p[C.N_CORRECT] + p[C.N_INCORRECT] == 24).all()
    ok = n_c > 0
    n_d = frac[ok] * n_c[ok]
    np.testing.assert_allclose(n_d, np.round(n_d), atol=1e-9)
    assert np.isnan(frac[~ok]).all()
    # n_correct follows the accuracy of the batch: mean close to 24 x accuracy
    assert n_c.mean() == pytest.approx(24 * p[C.ACCURACY].mean(), rel=0.1)


def test_displaced_share_healthy_low_collapse_climbs_past_half():
    for seed in range(5):
        p = make_run("healthy", seed=seed, batch_size=32).steps.dropna(subset=[C.N_CORRECT])
        pooled = (p[C.FRAC_CORRECT_DISPLACED].fillna(0) * p[C.N_CORRECT]).sum() / p[
            C.N_CORRECT
        ].sum()
        assert 0.02 <= pooled <= 0.4
    run = make_run("collapse", 3000, seed=6, phase_steps=600, batch_size=48, displaced=0.3)
    lab, df = run.labels, run.steps.dropna(subset=[C.N_CORRECT])
    df = df[df[C.N_CORRECT] > 0]

    def pooled(lo, hi):
        w = df[(df[C.STEP] >= lo) & (df[C.STEP] < hi)]
        return (w[C.FRAC_CORRECT_DISPLACED] * w[C.N_CORRECT]).sum() / w[C.N_CORRECT].sum()

    s1, s2 = lab["decay_start"], lab["collapse_start"]
    assert pooled(0, s1) == pytest.approx(0.3, abs=0.03)
    assert pooled(s2 - (s2 - s1) // 4, s2) > 0.5
    assert pooled(s2, lab["collapse_step"]) > 0.6


@pytest.mark.parametrize("phase_steps", [30, 250, 1000])
def test_phase_boundaries_scale_with_the_phase_length(phase_steps):
    for seed in range(3):
        lab = make_run("collapse", seed=seed, phase_steps=phase_steps).labels
        p = phase_steps
        assert 0.75 * p - 1 <= lab["decay_start"] <= 1.25 * p + 1
        assert 0.75 * p - 1 <= lab["collapse_start"] - lab["decay_start"] <= 70 / 60 * p + 1
        assert 25 / 60 * p - 1 <= lab["collapse_step"] - lab["collapse_start"] <= p + 1
        assert 220 / 60 * p - 1 <= lab["n_steps"] <= 300 / 60 * p + 1
        assert lab["time_scale"] == pytest.approx(p / 60, rel=1e-5)
        assert [x["start_step"] for x in lab["phases"]] == [
            0,
            lab["decay_start"],
            lab["collapse_start"],
        ]


def test_phase_ii_decline_is_the_requested_one():
    run = make_run("collapse", seed=7, phase_steps=400, decline=0.08, logp_noise=0.0)
    lp = run.steps.set_index(C.STEP)[C.LOGP_CORRECT]
    lab = run.labels
    assert lp.loc[lab["decay_start"]] - lp.loc[lab["collapse_start"]] == pytest.approx(0.08)
    assert lab["decline"] == pytest.approx(0.08)


def test_warmup_starts_with_no_op_updates_and_large_grad_norms():
    run = make_run("warmup", seed=8, batch_size=32)
    df = run.steps
    noop = df[C.LEARNING_RATE] == 0
    assert 2 <= noop.sum() <= 4 and noop.iloc[0]
    # a no-op update displaces nothing: change < 0 strictly
    assert (df.loc[noop, C.FRAC_CORRECT_DISPLACED] == 0).all()
    assert (df.loc[noop, C.DELTA_CORRECT] == 0).all()
    g = df[C.GRAD_NORM]
    assert g.iloc[:5].median() > 4 * g.iloc[-100:].median()
    assert run.labels["collapse_step"] is None


def test_small_batch_runs_are_noisy_with_few_responses():
    lab = make_run("small_batch", seed=9).labels
    assert 4 <= lab["batch_size"] <= 8 and lab["noise_level"] == "high"
    assert lab["logp_noise"] >= 0.03 and lab["reward_noise"] >= 0.08


def test_wide_suite_is_deterministic_and_wide():
    a = make_wide_suite(30, seed=3)
    b = make_wide_suite(30, seed=3)
    c = make_wide_suite(30, seed=4)
    for x, y in zip(a, b):
        assert x.name == y.name and x.labels == y.labels and x.steps.equals(y.steps)
    assert [x.name for x in a] != [x.name for x in c]
    assert not {r.labels["seed"] for r in a} & {r.labels["seed"] for r in c}
    kinds = [r.labels["kind"] for r in a]
    assert kinds.count("collapse") == 12 and set(kinds) == {"collapse", *HEALTHY_KINDS}
    assert any(r.labels["standard_only"] for r in a)
    assert not all(r.labels["standard_only"] for r in a)
    scales = [r.labels["time_scale"] for r in a]
    assert min(scales) < 2.0 and max(scales) > 5.0
    assert len({r.labels["log_every"] for r in a}) >= 4
    assert len({r.labels["probe_every"] for r in a}) >= 4


def test_a_long_widened_run_is_fast():
    import time

    make_run("collapse", 3000, seed=1, phase_steps=800, batch_size=32, rows_per_batch=2)
    best = math.inf
    for seed in range(2, 5):  # best of three: a shared machine can stall one call
        t0 = time.perf_counter()
        make_run("collapse", 3000, seed=seed, phase_steps=800, batch_size=32, rows_per_batch=2)
        best = min(best, time.perf_counter() - t0)
    assert best < 0.03


def test_bad_widening_keywords_raise_clear_errors():
    with pytest.raises(ValueError, match="probe_every must be an integer >= 1"):
        make_run("healthy", probe_every=0)
    with pytest.raises(ValueError, match="noise_level must be one of"):
        make_run("healthy", noise_level="extreme")
    with pytest.raises(ValueError, match="not both"):
        make_run("healthy", time_scale=2.0, phase_steps=100)
    with pytest.raises(ValueError, match=r"noise_ar must lie in \[0, 1\)"):
        make_run("healthy", noise_ar=1.0)
    with pytest.raises(ValueError, match="displaced must be a share"):
        make_run("healthy", batch_size=8, displaced=1.5)


def test_ar1_noise_is_the_recursion_scipy_computes() -> None:
    # testing.base._ar1 runs y[i] = z[i] + phi y[i-1] itself (scipy is a test dependency only):
    # the same floats as scipy.signal.lfilter([1], [1, -phi]) on the same draws
    import math

    import numpy as np
    from scipy.signal import lfilter

    from lld_monitor.testing.base import _ar1

    for phi in (0.0, 0.3, 0.59):
        got = _ar1(np.random.default_rng(4), 500, 0.2, phi)
        z = np.random.default_rng(4).normal(0.0, 0.2, 500)
        if phi:
            z[1:] *= math.sqrt(1.0 - phi * phi)
            z = lfilter([1.0], [1.0, -phi], z)
        np.testing.assert_array_equal(got, z)
    assert len(_ar1(np.random.default_rng(0), 0, 1.0, 0.5)) == 0


def test_the_package_runs_without_scipy(tmp_path) -> None:
    # scipy is a test dependency only: simulate (AR(1) noise included), analyze and triage with
    # scipy unimportable
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        sys.modules["scipy"] = None  # (import scipy now raises ImportError)
        from lld_monitor.testing import make_run, make_standard_run
        from lld_monitor.analysis import analyze_run
        run = make_run("collapse", seed=1, noise_level="medium", rows_per_batch=2)
        std = make_standard_run("drop", 2)
        print(len(analyze_run(run.steps).alerts) > 0, len(analyze_run(std.steps).phases) > 0)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
