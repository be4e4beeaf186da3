"""The standard-metric checks: collapse as a level shift, mode collapse (analysis/level_shift.py).

Rows are hand-made in the shapes of the logs users have (TRL console logs of 40 rows logged every
5 steps, verl logs that die in the first steps); the expected rows of each alert are derived in
the comments.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.analysis import PhaseDetector, analyze_run
from lld_monitor.analysis.checks.level_shift import (
    LevelShiftCollapse,
    LevelShiftConfig,
    ModeCollapse,
    ModeCollapseConfig,
)
from lld_monitor.testing import (
    STANDARD_COLLAPSE_KINDS,
    STANDARD_HEALTHY_KINDS,
    make_standard_run,
)

_COLS = (
    C.REWARD_MEAN,
    C.GRAD_NORM,
    C.ENTROPY,
    C.COMPLETION_LENGTH,
    C.FRAC_ZERO_STD_GROUPS,
    C.REWARD_STD,
    C.FRAC_TRUNCATED,
)


def _rows(**cols: list[float]) -> list[SimpleNamespace]:
    """Rows as the checks read them: ``step`` plus the standard columns (NaN when absent)."""
    n = len(cols[C.STEP])
    return [
        SimpleNamespace(
            **{c: float(cols[c][i]) if c in cols else math.nan for c in (C.STEP, *_COLS)}
        )
        for i in range(n)
    ]


def _feed(check, rows):
    return [(int(r.step), a) for r in rows if (a := check.observe(r)) is not None]


def _trl_console_collapse(corroborated: bool) -> dict[str, list[float]]:
    """40 rows logged every 5 steps: reward 0.30 -> 0.82-0.95 held, then 0.38 at row 29 (step
    145), 0.25, 0.10 and 0.00 for the last rows (the issue's TRL console log)."""
    held = [0.30, 0.45, 0.6, 0.7, 0.82, 0.9, 0.88, 0.85, 0.95, 0.9] + [0.82, 0.9, 0.95, 0.88] * 5
    held = held[:28]
    reward = held + [0.38, 0.25, 0.10] + [0.0] * 9
    steps = [5 * (i + 1) for i in range(40)]
    out = {C.STEP: steps, C.REWARD_MEAN: reward}
    if corroborated:  # entropy 0.06 -> 5, completions to the cap, grad norm exactly 0 after
        out[C.ENTROPY] = [0.06] * 28 + [1.0, 3.0] + [5.0] * 10
        out[C.GRAD_NORM] = [0.3] * 28 + [2.0, 1.0] + [0.0] * 10
        out[C.FRAC_TRUNCATED] = [0.0] * 28 + [0.6, 0.9] + [1.0] * 10
    return out


@pytest.mark.parametrize("corroborated", [False, True])
def test_collapse_in_a_short_console_log_within_three_rows_of_the_fall(corroborated: bool) -> None:
    rows = _rows(**_trl_console_collapse(corroborated))
    check = LevelShiftCollapse()
    hits = _feed(check, rows)
    assert len(hits) == 1, hits
    step, alert = hits[0]
    # the fall is row 29 (step 145): 0.38, 0.25, 0.10, 0.00. The held level is the 16 rows
    # before it (rows 13-28: [0.82, 0.90, 0.95, 0.88] x 4, mean 0.8875); the start is the mean
    # of rows 1-3, 0.45. The run learned 0.8875 - (0.45 + 2 sd / sqrt 3) = 0.34 (sd ~0.089),
    # over a quarter of its level: back at or below its start counts as collapsed. At step 150
    # the last 2 rows, mean 0.315, + 2 standard errors (2 x 0.089 / sqrt 2 = 0.126) are at
    # 0.44 <= 0.45: the 2nd fallen row, z = 8.6 against 5.33
    assert step == 150
    assert alert.kind == "collapse" and alert.severity == "critical"
    ev = alert.evidence
    assert ev["detector"] == "level_shift" and ev["statistic"] == "glr_z"
    assert ev["change_step"] == 145 and ev["window_rows"] == 2 and ev["reference_rows"] == 16
    assert ev["reward_held"] == pytest.approx(0.8875) == ev["reward_reference"]
    assert ev["reward_recent"] == pytest.approx(0.315)
    assert ev["reward_start"] == pytest.approx((0.30 + 0.45 + 0.6) / 3)
    assert ev["reward_floor"] == 0.0 and ev["collapsed_by"] == "start"
    assert ev["collapsed_line"] == pytest.approx(0.45)
    # the signals corroborate from row 29 (entropy, truncation, grad norm), which takes 3 rows
    # in a row (step 155): the fall is called first, at the plain threshold
    assert ev["threshold"] == pytest.approx(check.threshold)
    # z = (0.8875 - 0.315) / (sd * sqrt(1/2 + 1/16)), sd as estimated from the run
    se = ev["noise_sd"] * math.sqrt(1 / 2 + 1 / 16)
    assert ev["z"] == pytest.approx((0.8875 - 0.315) / se)
    assert ev["rows_per_false_alarm"] == pytest.approx(1_500_000)
    assert ev["corroborated_by"] == []
    assert "standard metrics" in alert.message and "false alarm per" in alert.message


def test_the_detector_reports_the_collapse_phase_and_keeps_it_while_the_run_is_dead() -> None:
    df = pd.DataFrame(_trl_console_collapse(True))
    a = analyze_run(df)
    crit = [x for x in a.alerts if x.severity == "critical"]
    assert crit and crit[0].step == 150 and crit[0].kind == "collapse"
    assert a.phases[-1].phase == "collapse"  # dead to the end: never healthy or unknown again
    assert a.collapse_step is not None and a.collapse_step <= 150


def test_a_plateau_near_the_maximum_and_a_stable_low_reward_are_not_collapses() -> None:
    rng = np.random.default_rng(3)
    n = 400
    steps = list(range(1, n + 1))
    plateau = list(np.clip(0.9 + rng.normal(0, 0.04, n), 0, 1))
    # held low (as LLDS holds a run): 0.05 -> 0.25 over 100 steps, then 0.2-0.3 to the end,
    # with a dip to 0.15 for 20 steps (still above start + 0.3 * gain = 0.11)
    low = [0.05 + 0.2 * min(i / 100, 1.0) + rng.normal(0, 0.02) for i in range(n)]
    for i in range(250, 270):
        low[i] = 0.15 + rng.normal(0, 0.01)
    for reward in (plateau, low):
        assert _feed(LevelShiftCollapse(), _rows(step=steps, reward_mean=reward)) == []


def test_a_run_that_never_learned_does_not_collapse_without_a_corroborating_signal() -> None:
    rng = np.random.default_rng(4)
    # flat at 0.02 with 0.003 noise, a blip to 0.035 at rows 99-104, then 0.012: a fall of
    # 0.035 - 0.012 = 0.023, under min_scale 0.1 * min_drop_frac 0.25 = 0.025 of movement,
    # however many noise sd it is
    reward = list(np.clip(0.02 + rng.normal(0, 0.003, 300), 0, 1))
    reward[99:105] = [0.035] * 6
    reward[105:] = [0.012] * 195
    assert _feed(LevelShiftCollapse(), _rows(step=list(range(1, 301)), reward_mean=reward)) == []


def test_a_run_that_falls_from_its_first_steps_to_below_its_start_collapses() -> None:
    """The shape of a verl run that died at step 3: score -0.68 -> -1.0 (its floor), responses
    1759 -> 1 token; no level was held but the start."""
    reward = [-0.676, -0.717, -0.844, -0.88, -0.918, -0.94, -0.966, -0.98, -0.998] + [-1.0] * 30
    length = [1759, 1500, 1200, 1014, 800, 600, 278, 88, 20] + [1.0] * 30
    grad = [0.40, 0.5, 0.6, 0.9, 1.2, 2.0, 4.07, 17.4, 4.9] + [1e-4] * 30
    steps = list(range(1, len(reward) + 1))
    rows = _rows(step=steps, reward_mean=reward, completion_length=length, grad_norm=grad)
    hits = _feed(LevelShiftCollapse(), rows)
    assert len(hits) == 1
    step, alert = hits[0]
    # the start (mean of the first 3 rows, -0.746) is below zero, so it is the floor; the test
    # needs 8 rows before the change: the 2 rows from step 9 against rows 1-8 (mean -0.865) at
    # step 10, corroborated (length 20 <= 0.25 x its median; grad norm dead)
    assert step == 10
    assert alert.evidence["corroborated_by"]
    assert alert.evidence["reward_floor"] == pytest.approx(-0.7456666, abs=1e-6)
    assert alert.evidence["reward_held"] == pytest.approx(sum(reward[:8]) / 8)
    # without the corroborating signals the higher threshold is crossed a row later
    plain = _feed(LevelShiftCollapse(), _rows(step=steps, reward_mean=reward))
    assert [s for s, _ in plain] == [11]


def test_a_single_corroborating_spike_does_not_shorten_the_window() -> None:
    rows = _rows(**_trl_console_collapse(False))
    rows[28].grad_norm = 50.0  # one spike at the first low row; grad norm 0.3 elsewhere
    for r in rows:
        if r.grad_norm != r.grad_norm:
            r.grad_norm = 0.3
    rows[28].grad_norm = 50.0
    hits = _feed(LevelShiftCollapse(), rows)
    assert [s for s, _ in hits] == [150]  # as without corroboration
    # the uncorroborated threshold
    assert hits[0][1].evidence["threshold"] == LevelShiftCollapse().threshold


def test_the_scale_of_the_reward_does_not_change_the_alert_rows() -> None:
    # (an offset does: zero is the floor of a reward that starts at or above it)
    cols = _trl_console_collapse(False)
    base = [s for s, _ in _feed(LevelShiftCollapse(), _rows(**cols))]
    cols2 = dict(cols, reward_mean=[2.5 * r for r in cols[C.REWARD_MEAN]])
    assert [s for s, _ in _feed(LevelShiftCollapse(), _rows(**cols2))] == base == [150]


def test_repeated_rows_of_a_rollout_batch_are_not_taken_as_zero_noise() -> None:
    """8 rows per rollout batch repeat one noisy value: consecutive differences are mostly 0,
    which must not shrink the noise; a wandering healthy reward does not collapse."""
    rng = np.random.default_rng(7)
    batches = 0.45 + np.cumsum(rng.normal(0, 0.03, 60)) * 0.5 + rng.normal(0, 0.08, 60)
    reward = np.repeat(batches, 8)
    reward[:24] = np.repeat([0.3, 0.35, 0.4], 8)  # rises from 0.3
    steps = list(range(1, len(reward) + 1))
    assert _feed(LevelShiftCollapse(), _rows(step=steps, reward_mean=list(reward))) == []


def test_mode_collapse_short_identical_answers_not_a_dead_start() -> None:
    # log_history of 40 steps: length 60 -> 9 tokens from step 12, reward_std 0 at most steps
    steps = list(range(1, 41))
    length = [60.0, 58.0, 62.0] + [50.0] * 8 + [9.0] * 29
    rstd = [0.4] * 11 + ([0.0, 0.0, 0.3, 0.0, 0.0] * 6)[:29]
    rows = _rows(step=steps, completion_length=length, reward_std=rstd)
    hits = _feed(ModeCollapse(), rows)
    # from step 12 the share of zero-std rows over the last 5 climbs: 1/5, 2/5, 2/5, 3/5 at
    # step 15 (>= 0.6) with length 9 <= 0.35 * 60: held at 15 and 16 -> alert at step 16
    assert [s for s, _ in hits] == [16]
    assert hits[0][1].kind == "mode_collapse" and hits[0][1].severity == "warning"
    # a run that never learned: identical groups from the start, length unchanged -> nothing
    dead = _rows(step=steps, completion_length=[50.0] * 40, reward_std=[0.0] * 40)
    assert _feed(ModeCollapse(), dead) == []


@pytest.mark.parametrize("check", [LevelShiftCollapse, ModeCollapse])
def test_state_round_trip_at_every_prefix_gives_the_same_alerts(check) -> None:
    run = make_standard_run("drop_corroborated", 11, short=True)
    df = run.steps
    rows = _rows(**{c: df[c].tolist() for c in (C.STEP, *_COLS) if c in df})
    full = [(s, a.message) for s, a in _feed(check(), rows)]
    for cut in range(0, len(rows) + 1, 3):
        first = check()
        head = [(s, a.message) for s, a in _feed(first, rows[:cut])]
        second = check()
        second.load_state_dict(first.state_dict())
        assert second.state_dict() == first.state_dict()
        tail = [(s, a.message) for s, a in _feed(second, rows[cut:])]
        assert head + tail == full


@pytest.mark.parametrize("check", [LevelShiftCollapse, ModeCollapse])
def test_reset_returns_to_a_fresh_state(check) -> None:
    c = check()
    _feed(c, _rows(**_trl_console_collapse(True)))
    c.reset()
    assert c.state_dict() == check().state_dict()


def test_bad_hyperparameters_are_refused_with_the_name() -> None:
    with pytest.raises(ValueError, match="p_false_run"):
        LevelShiftConfig(p_false_run=0.0)
    with pytest.raises(ValueError, match="floor_frac must be below 1"):
        LevelShiftConfig(floor_frac=1.5)
    with pytest.raises(ValueError, match="never raises it"):
        LevelShiftConfig(p_false_run=0.01, p_false_run_corroborated=0.001)
    with pytest.raises(ValueError, match="length_frac"):
        ModeCollapseConfig(length_frac=-1.0)


def test_level_shift_settings_are_detector_settings_saved_with_the_state() -> None:
    import json

    from lld_monitor.analysis.config import DetectorConfig
    from lld_monitor.analysis.stats import glr_threshold

    det = PhaseDetector(**{"level_shift.p_false_run": 0.02, "mode_collapse.persist_rows": 4})
    shift = next(c for c in det.checks if isinstance(c, LevelShiftCollapse))
    mode = next(c for c in det.checks if isinstance(c, ModeCollapse))
    assert shift.threshold == glr_threshold(0.02) < glr_threshold(0.002)
    assert mode.mode.persist_rows == 4
    # a whole section as a mapping of some of its settings: the rest keep their defaults
    cfg = DetectorConfig(level_shift={"min_drop": 0.1})
    assert cfg.level_shift == LevelShiftConfig(min_drop=0.1)
    # saved as plain JSON with the state, and read back (tuples as lists)
    state = json.loads(json.dumps(det.state_dict()))
    assert state["params"]["level_shift"]["p_false_run"] == 0.02
    assert state["params"]["level_shift"]["block_rows"] == [2, 4, 8]
    assert PhaseDetector.from_state_dict(state).config == det.config
    with pytest.raises(ValueError, match="other hyperparameters"):
        PhaseDetector().load_state_dict(state)
    # a state saved before the sections existed loads into the default detector
    old = json.loads(json.dumps(PhaseDetector().state_dict()))
    del old["params"]["level_shift"], old["params"]["mode_collapse"]
    PhaseDetector().load_state_dict(old)
    with pytest.raises(ValueError, match="p_false_run must be below 1"):
        PhaseDetector(**{"level_shift.p_false_run": 1.5})
    with pytest.raises(
        ValueError, match=r"unknown DetectorConfig.level_shift setting\(s\) \['x'\]"
    ):
        PhaseDetector(**{"level_shift.x": 1})


def test_a_looser_false_alarm_rate_fires_where_the_default_does_not() -> None:
    # the uncorroborated TRL log: the default (p 0.002) fires at row 30 (step 150); a rate of
    # 0.04 has a lower threshold and fires no later, and its alert states that threshold
    from lld_monitor.analysis.config import DetectorConfig
    from lld_monitor.analysis.stats import glr_threshold

    rows = _rows(**_trl_console_collapse(False))
    strict = _feed(LevelShiftCollapse(), rows)
    loose = _feed(LevelShiftCollapse(DetectorConfig(level_shift={"p_false_run": 0.04})), rows)
    assert strict and loose and loose[0][0] <= strict[0][0]
    assert loose[0][1].evidence["threshold"] == pytest.approx(glr_threshold(0.04))
    assert strict[0][1].evidence["threshold"] == pytest.approx(glr_threshold(0.002))


def test_detector_state_round_trip_keeps_the_level_shift() -> None:
    df = pd.DataFrame(_trl_console_collapse(False))
    recs = df.to_dict("records")
    a = PhaseDetector()
    alerts = [x for r in recs[:30] for x in a.update(r)]
    b = PhaseDetector.from_state_dict(a.state_dict())
    alerts += [x for r in recs[30:] for x in b.update(r)]
    ref = PhaseDetector()
    assert [(x.step, x.kind) for x in alerts] == [
        (x.step, x.kind) for r in recs for x in ref.update(r)
    ]


@pytest.mark.parametrize("kind", STANDARD_COLLAPSE_KINDS + STANDARD_HEALTHY_KINDS)
def test_standard_generators_label_what_they_draw(kind: str) -> None:
    run = make_standard_run(kind, 5, short=True)
    lab = run.labels
    assert 30 <= len(run.steps) <= 61 and lab["log_every"] in (5, 10)
    assert not set(run.steps.columns) & set(C.LLD_COLUMNS)  # standard metrics only
    if kind in STANDARD_COLLAPSE_KINDS:
        assert lab["collapse_start"] is not None and lab["collapse_start"] <= lab["n_steps"]
    else:
        assert lab["collapse_start"] is None and lab["collapse_step"] is None
    again = make_standard_run(kind, 5, short=True)
    pd.testing.assert_frame_equal(run.steps, again.steps)  # deterministic per seed


def test_no_collapse_before_the_minimum_rows_of_evidence() -> None:
    """The test needs 8 rows before the change and 2 after it: a reward alternating 0.85 / 0.95
    for 12 rows that falls to 0 at row 13 is called at row 14 (2 rows since), with or without a
    dead gradient. A log of exact repeats with a single change is not tested at all: its rows
    may be two rollout batches logged 12 times each, two observations, not 24."""
    reward = [0.85, 0.95] * 6 + [0.0] * 12
    grad = [0.3] * 12 + [0.0] * 12
    for kw in ({}, {"grad_norm": grad}):
        hits = _feed(LevelShiftCollapse(), _rows(step=list(range(1, 25)), reward_mean=reward, **kw))
        assert [s for s, _ in hits] == [14]
        assert hits[0][1].evidence["change_step"] == 13
    for first in (3, 12):
        repeats = [0.9] * first + [0.0] * (24 - first)
        rows = _rows(step=list(range(1, 25)), reward_mean=repeats)
        assert _feed(LevelShiftCollapse(), rows) == []


def _bernoulli_rows(rng, p, n, samples, scale=1.0):
    return list(scale * rng.binomial(samples, p, n) / samples)


def test_a_long_noisy_bimodal_healthy_run_gets_no_critical_alert() -> None:
    """The shape of a tool-calling agent's TRL log: one prompt a step, reward 0 or 2, mean 0.9
    from start to end (its first rows high, 1.6), 2400 steps, single-step entropy spikes."""
    rng = np.random.default_rng(11)
    reward = [2.0, 2.0, 0.0, 2.0, 2.0, *_bernoulli_rows(rng, 0.45, 2395, 1, 2.0)]
    entropy = list(rng.uniform(0.3, 0.4, 2400))
    for i in rng.choice(2400, 24, replace=False):
        entropy[i] *= 10.0
    df = pd.DataFrame(
        {C.STEP: range(1, 2401), C.REWARD_MEAN: reward, C.ENTROPY: entropy, C.GRAD_NORM: 0.5}
    )
    a = analyze_run(df)
    assert not [x for x in a.alerts if x.severity == "critical"], [
        x.message for x in a.alerts if x.severity == "critical"
    ]


@pytest.mark.parametrize("held", [0.91, 0.88, 0.85])
def test_a_run_that_starts_at_its_plateau_collapses_on_time(held: float) -> None:
    """No rise to measure a gain by: 900 rows at ``held`` (8 samples a row), then near zero
    (0.02): a fall of about 7-8 row sd, called within 3 rows, uncorroborated."""
    rng = np.random.default_rng(int(held * 100))
    reward = _bernoulli_rows(rng, held, 900, 8) + _bernoulli_rows(rng, 0.02, 100, 8)
    hits = _feed(LevelShiftCollapse(), _rows(step=list(range(1, 1001)), reward_mean=reward))
    assert len(hits) == 1
    assert 901 <= hits[0][0] <= 903
    assert hits[0][1].evidence["corroborated_by"] == []


def test_the_online_statistic_is_the_batch_statistic() -> None:
    """The alert's z is ``stats.glr_scan``'s at that row and length, with the alert's noise."""
    from lld_monitor.analysis.stats import glr_scan

    rng = np.random.default_rng(5)
    reward = list(0.6 + rng.normal(0, 0.05, 300)) + list(0.1 + rng.normal(0, 0.05, 20))
    hits = _feed(LevelShiftCollapse(), _rows(step=list(range(1, 321)), reward_mean=reward))
    step, alert = hits[0]
    ev = alert.evidence
    z, _ = glr_scan(reward[:step], ev["noise_sd"], lengths=[ev["window_rows"]])
    assert z[step - 1] == pytest.approx(ev["z"])


def test_a_dense_log_that_starts_at_its_plateau_is_called_within_a_few_rows() -> None:
    """The shape of a Search-R1 run on verl: score ~0.32 from its first step (noise sd 0.055 a
    row), falling to ~0.055 at step 301 and staying there, nothing else moving (the level-shift
    check of before called it at step 337). A fall of about 5 row sd: the level since the change
    is near the floor (0.35 x 0.32 = 0.112) by its mean + 2 standard errors from 4 rows on."""
    rng = np.random.default_rng(301)
    reward = list(0.32 + rng.normal(0, 0.055, 300)) + list(0.055 + rng.normal(0, 0.02, 90))
    hits = _feed(LevelShiftCollapse(), _rows(step=list(range(1, 391)), reward_mean=reward))
    assert len(hits) == 1
    step, alert = hits[0]
    assert 301 <= step <= 305  # within 2% of the run (7.8 rows)
    assert alert.evidence["collapsed_by"] == "floor"
    assert alert.evidence["change_step"] == pytest.approx(301, abs=1)


def test_rows_that_repeat_rollout_batches_count_once_a_batch() -> None:
    """8 rows per rollout batch (TRL steps_per_generation): an early batch at 0.0 among batches
    at ~0.25 is one low observation, not 8 (no alert); a fall of the batches from ~0.6 to 0.02
    after 30 of them is a collapse, called within 3 batches of the fall."""
    rng = np.random.default_rng(8)
    batches = [0.25, 0.3, 0.0, *(np.linspace(0.3, 0.6, 27) + rng.normal(0, 0.04, 27))]
    batches += [0.02] * 6
    reward = list(np.repeat(batches, 8))
    hits = _feed(
        LevelShiftCollapse(), _rows(step=list(range(1, len(reward) + 1)), reward_mean=reward)
    )
    assert len(hits) == 1
    step = hits[0][0]
    assert 30 * 8 < step <= 33 * 8, step
    # the noise is the batches' (sd ~0.04-0.06 a batch) x sqrt(8 rows a batch), not the rows'
    assert hits[0][1].evidence["noise_sd"] > 0.08
