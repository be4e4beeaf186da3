"""Contract tests run over EVERY check class (``CHECK_CLASSES``), as river runs its estimator
checks: JSON save/load at every prefix changes nothing, no alert before the minimum evidence,
``reset()`` gives the fresh state."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.checks import CHECK_CLASSES, Check
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.offline import prepare_steps
from lld_monitor.analysis.signals import INPUT_COLUMNS, Signals
from lld_monitor.testing import make_run, make_standard_run

CFG = DetectorConfig()
# checks that wait for the warm-up (Signals.warm) before any alert or rank; the others have
# their own minimum evidence (tested below)
# their minimum evidence is their own, tested in their files: a non-finite value and the paper's
# counts need no warm-up; the standard-metric checks count logged rows (tests/test_level_shift.py)
NOT_WARM_GATED = {
    *("nonfinite", "displacement", "level_shift", "mode_collapse"),
    *("no_update", "zero_grad", "sampler_mismatch", "llds_inert"),  # exact: from row 1
}


def _values(rows_df) -> list[tuple[float, tuple[float, ...]]]:
    df = prepare_steps(rows_df)
    n = len(df)
    cols = [
        df[c].astype(float).tolist() if c in df.columns else [math.nan] * n for c in INPUT_COLUMNS
    ]
    return list(zip(df[C.STEP].astype(float).tolist(), zip(*cols)))


def _runs() -> Iterator[list[tuple[float, tuple[float, ...]]]]:
    # a spiral with every LLD column, a standard-metric collapse logged every 5 steps, and the
    # non-LLD failures: between them every check fires at least once
    yield _values(make_run("collapse", n_steps=300, seed=3).steps)
    yield _values(make_run("collapse", n_steps=400, seed=4, standard_only=True, log_every=5).steps)
    for kind in ("nonfinite", "dead_signal", "entropy_collapse", "length_blowup"):
        yield _values(make_run(kind, n_steps=250, seed=5).steps)
    yield _hostile_rows(120)
    yield _frozen_rows(60)
    # standard-metric collapses in a short console log: mode collapse and a level shift
    yield _values(make_standard_run("mode_collapse", 3, short=True).steps)
    yield _values(make_standard_run("drop_dead", 4, short=True).steps)


def _hostile_rows(n: int) -> list[tuple[float, tuple[float, ...]]]:
    """Rows on which every failure condition holds early: no groups with reward variance,
    spikes of KL and grad norm, all completions truncated, entropy down and length up at step
    20, KL x5000 from step 30 and x100 spikes of it from step 43."""
    out = []
    for s in range(n):
        row = {
            C.REWARD_MEAN: 0.9 - 0.02 * s,
            C.GRAD_NORM: 1e4 if s % 11 == 10 else 1.0,
            C.ENTROPY: 3.0 if s < 20 else 0.01,
            C.KL: 500.0 if s > 40 and s % 11 == 10 else (0.001 if s < 30 else 5.0),
            C.COMPLETION_LENGTH: 10.0 if s < 20 else 5000.0,
            C.LOSS: 1.0,
            C.FRAC_ZERO_STD_GROUPS: 1.0,
            C.REWARD_STD: 0.0,
            C.FRAC_TRUNCATED: 1.0,
            C.LOGP_CORRECT: -0.3 - 0.05 * s,
        }
        out.append((float(s), tuple(row.get(c, math.nan) for c in INPUT_COLUMNS)))
    return out


def _frozen_rows(n: int) -> list[tuple[float, tuple[float, ...]]]:
    """Updates that did nothing (every probe still, steps 0-29 and 45 on, probed every other
    row), zero grad norms while groups differ (steps 10-19 and 40-49) and a sampler that
    disagrees with the trainer (steps 0-14 and 35 on): two episodes each."""
    out = []
    for s in range(n):
        row = {
            C.REWARD_MEAN: 0.4,
            C.LOSS: 0.2,
            C.GRAD_NORM: 0.0 if 10 <= s < 20 or 40 <= s < 50 else 0.5,
            C.FRAC_ZERO_STD_GROUPS: 0.5,
            C.PROBE_STILL: (1.0 if s < 30 or s >= 45 else 0.0) if s % 2 == 0 else math.nan,
            C.IS_RATIO_MEAN: 0.5 if s < 15 or s >= 35 else 1.0,
            C.LLDS_ENABLED: 1,
            C.LLDS_LOSS: 0.0 if s < 25 or s >= 30 else 0.01,
        }
        out.append((float(s), tuple(row.get(c, math.nan) for c in INPUT_COLUMNS)))
    return out


RUNS = list(_runs())


def _out(check: Check, s: Signals) -> tuple[list[dict], int]:
    return [a.to_dict() for a in check.update(s)], check.rank


@pytest.mark.parametrize("cls", CHECK_CLASSES, ids=lambda c: c.__name__)
def test_state_round_trip_at_every_prefix(cls: type[Check]) -> None:
    # one check fed straight through; a second saved to JSON and rebuilt after every row
    fired = 0
    for run in RUNS:
        sa, sb = Signals(CFG), Signals(CFG)
        a = cls(CFG)
        b = cls(CFG)
        for step, values in run:
            sa.update(step, values)
            sb.update(step, values)
            sa.phase = sb.phase = "healthy"
            out_a, out_b = _out(a, sa), _out(b, sb)
            assert out_a == out_b, (cls.__name__, step)
            fired += len(out_a[0]) + (out_a[1] > 0)
            state = json.loads(json.dumps(b.state_dict(), allow_nan=False))  # plain JSON
            b = cls(CFG)
            b.load_state_dict(state)
            assert b.state_dict() == state
    assert fired > 0, f"{cls.__name__} never fired on the contract runs: the test proves nothing"


@pytest.mark.parametrize("cls", CHECK_CLASSES, ids=lambda c: c.__name__)
def test_reset_returns_to_the_fresh_state(cls: type[Check]) -> None:
    fresh = cls(CFG).state_dict()
    moved = False  # the state left the fresh one at some row (else reset proves nothing)
    for run in RUNS:
        check = cls(CFG)
        s = Signals(CFG)
        for i, (step, values) in enumerate(run):
            s.update(step, values)
            s.phase = "healthy"
            check.update(s)
            if i % 7 == 0:
                moved |= check.state_dict() != fresh
        check.reset()
        assert check.state_dict() == fresh
        assert check.rank == 0
    assert moved or not fresh, f"{cls.__name__}'s state never moved on the contract runs"


@pytest.mark.parametrize(
    "cls", [c for c in CHECK_CLASSES if c.kind not in NOT_WARM_GATED], ids=lambda c: c.__name__
)
def test_no_alert_nor_rank_before_the_warm_up(cls: type[Check]) -> None:
    # a short warm-up in steps (so the conditions can hold 10 steps within it) and in rows
    cfg = DetectorConfig(warmup_steps=60, warmup_rows=60)
    s, check = Signals(cfg), cls(cfg)
    for step, values in _hostile_rows(59):
        s.update(step, values)
        assert not s.warm
        assert check.update(s) == [] and check.rank == 0, (cls.__name__, step)


def test_the_hostile_rows_do_fire_once_warm() -> None:
    # the control of the test above: with the usual warm-up, the gated failure checks fire
    s = Signals(CFG)
    checks = [c(CFG) for c in CHECK_CLASSES if c.kind not in NOT_WARM_GATED]
    kinds = set()
    for step, values in _hostile_rows(59):
        s.update(step, values)
        s.phase = "healthy"
        for c in checks:
            kinds.update(a.kind for a in c.update(s))
    assert {"spike", "dead_signal", "truncation", "entropy_collapse", "length_blowup"} <= kinds


def test_every_check_has_a_unique_key_and_a_kind() -> None:
    keys = [c(CFG).key for c in CHECK_CLASSES]
    assert len(set(keys)) == len(keys) and all(c.kind for c in CHECK_CLASSES)


@pytest.mark.parametrize("cls", [c for c in CHECK_CLASSES if c.row_only], ids=lambda c: c.__name__)
def test_a_row_only_check_gives_on_row_records_what_it_gives_in_the_detector(cls) -> None:
    # the replay's second process feeds row_only checks records of exactly these fields
    # (parallel._FIELDS): a check that read anything else would raise here, and one that read
    # the features or the phase would differ
    from collections import namedtuple

    from lld_monitor.analysis.parallel import _FIELDS

    record = namedtuple("Row", _FIELDS)
    fired = 0
    for run in RUNS:
        s, a, b = Signals(CFG), cls(CFG), cls(CFG)
        for step, values in run:
            s.update(step, values)
            s.phase = "healthy"
            got_a = [x.to_dict() for x in a.update(s)], a.rank, a.pending
            row = record(step, *values, s.warm)
            got_b = [x.to_dict() for x in b.update(row)], b.rank, b.pending
            assert got_a == got_b, (cls.__name__, step)
            fired += len(got_a[0]) + (got_a[2] is not None)
        assert a.state_dict() == b.state_dict()
    assert fired > 0, f"{cls.__name__} never fired: the test proves nothing"


@pytest.mark.parametrize("cls", CHECK_CLASSES, ids=lambda c: c.__name__)
def test_begin_replay_changes_no_answer(cls) -> None:
    # a check given the whole table first (begin_replay) answers as one that was not
    import numpy as np

    for run in RUNS:
        columns = {c: np.array([v[i] for _, v in run]) for i, c in enumerate(INPUT_COLUMNS)}
        s, a, b = Signals(CFG), cls(CFG), cls(CFG)
        b.begin_replay(columns)
        for step, values in run:
            s.update(step, values)
            s.phase = "healthy"
            assert _out(a, s) == _out(b, s), (cls.__name__, step)
        b.end_replay()
        assert a.state_dict() == b.state_dict()


@pytest.mark.parametrize("cls", CHECK_CLASSES, ids=lambda c: c.__name__)
def test_a_check_raises_the_kinds_it_declares_and_no_other(cls) -> None:
    # Check.kinds: every alert a check returns or leaves pending is of a declared kind, and
    # every declared kind is raised on the contract runs (a declared kind is not a guess)
    raised: set[str] = set()
    for run in RUNS:
        s, check = Signals(CFG), cls(CFG)
        for step, values in run:
            s.update(step, values)
            s.phase = "healthy"
            kinds = {a.kind for a in check.update(s)}
            if check.pending is not None:
                assert check.immediate, (cls.__name__, "pending without immediate")
                kinds.add(check.pending.kind)
            assert kinds <= set(cls.kinds), (cls.__name__, step, kinds)
            raised |= kinds
    assert raised == set(cls.kinds), (cls.__name__, raised)


def test_the_declared_kinds_by_hand() -> None:
    # the checks whose name is not the alert they raise
    by_name = {c.__name__: c.kinds for c in CHECK_CLASSES}
    assert by_name["TrendLevels"] == () and by_name["SharpDropCollapse"] == ()
    assert by_name["LevelShiftCollapse"] == ("collapse",)
    assert by_name["KlSpike"] == by_name["GradSpike"] == ("spike",)
    assert by_name["Displacement"] == ("displacement",)


def _playback_of(cls: type[Check], run) -> tuple[Check, list]:
    """A fresh ``cls`` fed ``run`` as the replay's child feeds it (row records, by chunks of
    50 rows), and a ``parallel.Playback`` of it holding every record."""
    from collections import namedtuple

    from lld_monitor.analysis.parallel import _FIELDS, Playback, record_rows

    record = namedtuple("Row", _FIELDS)
    s, child = Signals(CFG), cls(CFG)
    rows = []
    for step, values in run:
        s.update(step, values)
        rows.append(record(step, *values, s.warm))
    play = Playback(cls(CFG))
    for lo in range(0, len(rows), 50):
        for recs in record_rows([child], rows[lo : lo + 50], lo):
            play.feed(recs)
    return play, rows


@pytest.mark.parametrize("cls", [c for c in CHECK_CLASSES if c.row_only], ids=lambda c: c.__name__)
def test_the_playback_of_a_row_only_check_is_a_check_that_gives_what_it_gave(cls) -> None:
    # the replay's second process: the parent's detector holds a Playback where the check was.
    # It is a Check (the detector's add_check takes it), declares the check's name, key, kinds
    # and immediate, gives at every row the check's alerts, rank and pending, and its state
    # round-trips through JSON at every prefix
    from lld_monitor.analysis.detector import PhaseDetector
    from lld_monitor.analysis.parallel import Playback

    fired = 0
    for run in RUNS:
        play, rows = _playback_of(cls, run)
        ref = cls(CFG)
        assert isinstance(play, Check)
        assert (play.kind, play.kinds, play.key, play.immediate) == (
            ref.kind,
            ref.kinds,
            ref.key,
            ref.immediate,
        )
        for row in rows:
            want = [a.to_dict() for a in ref.update(row)], ref.rank, ref.pending
            got = [a.to_dict() for a in play.update(None)], play.rank, play.pending
            assert got == want, (cls.__name__, row.step)
            fired += len(want[0]) + (want[2] is not None) + (want[1] > 0)
            state = json.loads(json.dumps(play.state_dict(), allow_nan=False))
            again = Playback(cls(CFG))
            again.load_state_dict(state)
            assert again.state_dict() == state
            play = again
        assert play.state_dict()["records"] == []  # every record played
        play.reset()
        assert play.state_dict() == Playback(cls(CFG)).state_dict()
    assert fired > 0, f"{cls.__name__} never fired: the test proves nothing"
    det = PhaseDetector()
    det.checks = [c for c in det.checks if not isinstance(c, cls)]
    det.add_check(Playback(cls(CFG)))  # (add_check refuses what is not a Check)


def test_a_streak_check_counts_rows_to_a_detector_setting() -> None:
    # the exact-condition checks share checks.base.StreakCheck; each names its DetectorConfig
    # field, and the count it fires at is that field's value
    from dataclasses import fields

    from lld_monitor.analysis.checks.base import StreakCheck

    streaks = [c for c in CHECK_CLASSES if issubclass(c, StreakCheck)]
    assert {c.kind for c in streaks} == {"no_update", "zero_grad", "sampler_mismatch", "llds_inert"}
    names = {f.name for f in fields(DetectorConfig)}
    for cls in streaks:
        assert cls.rows_setting in names, cls
        assert cls(CFG).rows_needed == getattr(CFG, cls.rows_setting) >= 1
