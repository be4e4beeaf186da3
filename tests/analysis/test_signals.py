"""``Signals``: the row's features, computed once per row, read by every check."""

from __future__ import annotations

import json
import math

import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.signals import EMA_NAMES, INPUT_COLUMNS, Signals

NAN = math.nan


def _update(s: Signals, step: float, **values: float) -> bool:
    return s.update(step, tuple(values.get(c, NAN) for c in INPUT_COLUMNS))


def test_raw_values_under_the_column_names() -> None:
    s = Signals(DetectorConfig())
    values = {c: float(i + 1) for i, c in enumerate(INPUT_COLUMNS)}
    assert _update(s, 7.0, **values)
    for c in INPUT_COLUMNS:
        assert getattr(s, c) == values[c], c
    assert (s.step, s.first_step, s.n_rows) == (7.0, 7.0, 1) and s.prev_step != s.prev_step
    assert s.seen == set(INPUT_COLUMNS)
    _update(s, 8.0, reward_mean=0.5)
    assert s.prev_step == 7.0 and s.n_rows == 2 and math.isnan(s.logp_correct)


def test_steps_not_after_the_last_are_ignored() -> None:
    s = Signals(DetectorConfig())
    _update(s, 5.0, reward_mean=0.5)
    assert not _update(s, 5.0, reward_mean=0.9) and not _update(s, 3.0, reward_mean=0.9)
    assert s.n_rows == 1 and s.reward_mean == 0.5


def test_warm_after_20_steps_and_5_rows() -> None:
    s = Signals(DetectorConfig())
    warm = []
    for step in (0, 10, 20, 21, 22, 23):  # 20 steps at the 3rd row, 5 rows at 22
        _update(s, float(step), reward_mean=0.5)
        warm.append(s.warm)
    assert warm == [False, False, False, False, True, True]


def test_emas_in_step_time_by_hand() -> None:
    # entropy 1.0 at step 0, 0.0 at step 5: fast (tau 5) 1 - (1 - e^-1) = e^-1, slow (tau 50)
    # e^-0.1; mean abs deviation from the fast EMA (slow weight): (1 - e^-0.1) * |0 - 1|
    s = Signals(DetectorConfig())
    _update(s, 0.0, entropy=1.0)
    _update(s, 5.0, entropy=0.0)
    assert s.entropy_ema.fast == pytest.approx(math.exp(-1.0))
    assert s.entropy_ema.slow == pytest.approx(math.exp(-0.1))
    assert s.entropy_ema.dev == pytest.approx(1.0 - math.exp(-0.1))
    # grad norm EMAs are geometric: log(4) then log(1) -> fast log(4) e^-1
    _update(s, 6.0, grad_norm=4.0)
    _update(s, 11.0, grad_norm=1.0)
    assert s.log_grad_ema.fast == pytest.approx(math.log(4.0) * math.exp(-1.0))


def test_reward_peak_and_trough() -> None:
    # reward 0.2 then 0.8 ten steps later (fast EMA 0.2 + 0.6 (1 - e^-2) = 0.7188), then 0.1
    s = Signals(DetectorConfig())
    _update(s, 0.0, reward_mean=0.2)
    _update(s, 10.0, reward_mean=0.8)
    peak = 0.2 + 0.6 * (1 - math.exp(-2.0))
    assert s.reward_peak == pytest.approx(peak) and s.reward_trough == 0.2
    _update(s, 20.0, reward_mean=0.1)
    assert s.reward_peak == pytest.approx(peak) and s.reward_min < peak


def test_state_round_trip_and_reset() -> None:
    cfg = DetectorConfig()
    a, b = Signals(cfg), Signals(cfg)
    for step in range(200):
        row = {
            C.REWARD_MEAN: 0.5 + 0.001 * step + 0.01 * (-1) ** step,
            C.LOGP_CORRECT: -0.3 - 0.0005 * step,
            C.GRAD_NORM: 1.0 + 0.1 * (step % 3),
            C.ENTROPY: 1.0,
        }
        _update(a, float(step), **row)
        _update(b, float(step), **row)
        assert a.ratios() == b.ratios() and a.reward_declining() == b.reward_declining()
        state = json.loads(json.dumps(b.state_dict(), allow_nan=False))
        b = Signals(cfg)
        b.load_state_dict(state)
        assert b.state_dict() == state
    for name in EMA_NAMES:  # (<signal>_<field>: every EMA of every signal)
        signal, field = name.rsplit("_", 1)
        va, vb = (
            getattr(getattr(a, f"{signal}_ema"), field),
            getattr(getattr(b, f"{signal}_ema"), field),
        )
        assert va == vb or (math.isnan(va) and math.isnan(vb)), name
    a.reset()
    assert a.state_dict() == Signals(cfg).state_dict()
