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
    hits = _feed(LevelShiftCollapse(), rows)
    assert len(hits) == 1, hits
    step, alert = hits[0]
    # the fall is row 29 (step 145). Start = (0.30 + 0.45 + 0.60) / 3 = 0.45, best 3-row block
    # ~0.91, so the line is 0.45 + 0.3 * 0.46 = 0.59. Uncorroborated: the 3-row window at step
    # 150, (0.90 + 0.38 + 0.25) / 3 = 0.51, is the first below it (and its last row too), and
    # the low level must hold 8 steps: 155 (5 steps) is too soon, 160 (10 steps) fires, the
    # 3rd row after the fall. Corroborated (entropy x17, completions at the cap, from step 145:
    # three rows in a row by step 155): the 2-row window at step 155, (0.25 + 0.10) / 2, fires
    # at once, the 2nd row after the fall.
    assert step == (155 if corroborated else 160)
    assert alert.kind == "collapse" and alert.severity == "critical"
    ev = alert.evidence
    assert ev["detector"] == "level_shift"
    assert ev["reward_start"] == pytest.approx((0.30 + 0.45 + 0.6) / 3)
    assert bool(ev["corroborated_by"]) is corroborated
    assert "standard metrics" in alert.message


def test_the_detector_reports_the_collapse_phase_and_keeps_it_while_the_run_is_dead() -> None:
    df = pd.DataFrame(_trl_console_collapse(True))
    a = analyze_run(df)
    crit = [x for x in a.alerts if x.severity == "critical"]
    assert crit and crit[0].step == 155 and crit[0].kind == "collapse"
    assert a.phases[-1].phase == "collapse"  # dead to the end: never healthy or unknown again
    assert a.collapse_step is not None and a.collapse_step <= 155


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


def test_a_run_that_falls_from_its_first_steps_collapses_with_corroboration() -> None:
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
    # corroborated from row 9 on (length 20 <= 0.25 x median 1014 and below every earlier
    # value; grad norm 1e-4 from row 10); the 2-row windows need 3 blocks clear of them and
    # the noise of the declining block means (~0.1) to be beaten: within 20 rows of the onset
    assert step <= 20
    assert alert.evidence["corroborated_by"]
    # without the length the same rewards are a run that never gained: no collapse alert
    assert _feed(LevelShiftCollapse(), _rows(step=steps, reward_mean=reward)) == []


def test_a_single_corroborating_spike_does_not_shorten_the_window() -> None:
    rows = _rows(**_trl_console_collapse(False))
    rows[28].grad_norm = 50.0  # one spike at the first low row; grad norm 0.3 elsewhere
    for r in rows:
        if r.grad_norm != r.grad_norm:
            r.grad_norm = 0.3
    rows[28].grad_norm = 50.0
    hits = _feed(LevelShiftCollapse(), rows)
    assert [s for s, _ in hits] == [160]  # as without corroboration


def test_scale_and_offset_of_the_reward_do_not_change_the_alert_rows() -> None:
    cols = _trl_console_collapse(False)
    base = [s for s, _ in _feed(LevelShiftCollapse(), _rows(**cols))]
    cols2 = dict(cols, reward_mean=[2.5 * r - 1.0 for r in cols[C.REWARD_MEAN]])
    assert [s for s, _ in _feed(LevelShiftCollapse(), _rows(**cols2))] == base == [160]


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
    with pytest.raises(ValueError, match="windows"):
        LevelShiftConfig(windows=(1, 3))
    with pytest.raises(ValueError, match="keep_frac"):
        LevelShiftConfig(keep_frac=0.0)
    with pytest.raises(ValueError, match="length_frac"):
        ModeCollapseConfig(length_frac=-1.0)


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
    """The shortest window (2 rows, corroborated) needs 3 blocks of 2 clear of it: no alert
    before row 8, however hard the reward falls; the 3-row window needs 3 x 3 + 3 = 12 rows."""
    reward = [0.9, 0.9, 0.9, 0.0] + [0.0] * 20
    grad = [0.3, 0.3, 0.3, 0.0] + [0.0] * 20  # dead from row 4: corroborated from row 6 on
    rows = _rows(step=list(range(1, 25)), reward_mean=reward, grad_norm=grad)
    hits = _feed(LevelShiftCollapse(), rows)
    assert hits and hits[0][0] >= 8
    # without corroboration: the 3-row window, 12 rows in, and held 8 steps
    plain = _feed(LevelShiftCollapse(), _rows(step=list(range(1, 25)), reward_mean=reward))
    assert plain == [] or plain[0][0] >= 12
