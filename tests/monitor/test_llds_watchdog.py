"""The LLDS watchdog (issue 51, item 2): by hand on rows, and through the monitor of a plain loop
where LLDS at a too-large lambda stalls learning: lambda is halved, then LLDS goes off, each an
intervention event with its reason."""

from __future__ import annotations

import json
import math

import pytest

from lld_monitor import LLDMonitor, load_run
from lld_monitor import columns as C
from lld_monitor.monitor.llds_watchdog import LLDSWatchdog, WatchdogConfig, welch_t


def _row(step, reward, **kw):
    return {C.STEP: step, C.REWARD_MEAN: reward, **kw}


def test_welch_t_by_hand():
    # means 1 and 0, variances 2 and 2, n = 2 each: se = sqrt(2/2 + 2/2) = sqrt(2)
    assert welch_t([0.0, 2.0], [-1.0, 1.0]) == pytest.approx(-1 / math.sqrt(2))
    assert math.isnan(welch_t([1.0], [1.0, 2.0]))


def test_backs_off_when_the_reward_falls_after_llds_went_on_with_the_gate_active():
    dog = LLDSWatchdog()
    for s in range(16):  # LLDS off: the reference rows
        assert dog.update(_row(s, 0.5 + 0.01 * (s % 2)), False, 0.2) is None
    decisions = []
    for s in range(16, 80):  # on, gate active, reward down to 0.1
        d = dog.update(_row(s, 0.1 + 0.01 * (s % 2), **{C.LLDS_LOSS: 0.3}), True, 0.2)
        if d is not None:
            decisions.append((s, d.action, d.lam))
    assert decisions[0][:2] == (31, "lower") and decisions[0][2] == pytest.approx(0.1)
    # (the caller applies the new lambda; here lambda stays 0.2 in the calls: lower again)
    assert [a for _, a, _ in decisions] == ["lower"] * len(decisions)


def test_goes_off_below_the_smallest_lambda_and_says_why():
    dog = LLDSWatchdog(WatchdogConfig(reward_rows=4, cooldown_rows=4))
    for s in range(4):
        dog.update(_row(s, 0.6 + 0.01 * s), False, 0.06)
    out = [
        dog.update(_row(s, 0.1 + 0.01 * s, **{C.LLDS_LOSS: 0.2}), True, 0.06) for s in range(4, 9)
    ]
    d = next(x for x in out if x is not None)
    assert d.action == "off" and "LLDS off" in d.reason and "reward 0.615" in d.reason


def test_raises_lambda_while_most_correct_responses_stay_displaced():
    dog = LLDSWatchdog()
    got = []
    lam = 0.2
    for s in range(60):
        d = dog.update(
            _row(s, 0.4, **{C.FRAC_CORRECT_DISPLACED: 0.7, C.LLDS_FRAC_GATED: 0.3}), True, lam
        )
        if d is not None:
            got.append((s, d.action, round(d.lam, 4)))
            lam = d.lam
    assert got[0] == (15, "raise", 0.3)  # after the cooldown, 0.2 x 1.5
    assert [g[0] for g in got] == [15, 31, 47] and got[-1][2] == pytest.approx(0.675)
    # a gate that never fires: no raise (LLDS cannot act; llds_inert says so)
    idle = LLDSWatchdog()
    outs = [
        idle.update(_row(s, 0.4, **{C.FRAC_CORRECT_DISPLACED: 0.7}), True, 0.2) for s in range(60)
    ]
    assert all(o is None for o in outs)


def test_no_back_off_when_the_gate_never_acted_or_the_reward_held():
    dog = LLDSWatchdog()
    for s in range(16):
        dog.update(_row(s, 0.5), False, 0.2)
    held = [
        dog.update(_row(s, 0.5 + 0.02 * (s % 3), **{C.LLDS_LOSS: 0.1}), True, 0.2)
        for s in range(16, 80)
    ]
    assert all(o is None for o in held)


def test_a_plain_loop_monitor_lowers_then_switches_llds_off(tmp_path):
    """LLDS switched on at a too-large lambda while the reward falls: the monitor halves it
    once the cooldown has passed, then switches LLDS off; both are intervention events."""
    m = LLDMonitor(tmp_path / "run", detector=None, llds_watchdog=True)
    for s in range(1, 17):
        m.end_step(step=s, reward_mean=0.5 + 0.01 * (s % 2))
    m.llds.enable(0.16, reason="user: lambda too large for this run")
    for s in range(17, 60):
        m.end_step(step=s, reward_mean=0.05 + 0.01 * (s % 2), llds_loss=0.4)
    m.close()
    ev = load_run(tmp_path / "run").events
    inter = ev[ev[C.EVENT_TYPE] == "intervention"]
    assert inter[C.EVENT_KIND].tolist() == ["llds_enable", "llds_enable", "llds_disable"]
    msgs = inter[C.EVENT_MESSAGE].tolist()
    assert "llds_watchdog" in msgs[1] and "lambda 0.16 -> 0.08" in msgs[1], msgs[1]
    assert "LLDS off" in msgs[2]
    steps = load_run(tmp_path / "run").steps.set_index(C.STEP)
    assert steps.loc[59, C.LLDS_ENABLED] == 0


def test_the_watchdog_is_off_unless_asked(tmp_path):
    """Off by default, with auto_llds too: it did worse than a fixed lambda on the testbed."""
    assert LLDMonitor(tmp_path / "a", auto_llds=True).watchdog is None
    assert LLDMonitor(tmp_path / "b").watchdog is None
    assert LLDMonitor(tmp_path / "c", auto_llds=True, llds_watchdog=True).watchdog is not None


def test_a_reward_repeated_on_the_rows_of_its_batch_counts_once():
    """A rollout batch's reward logged on each of its 16 updates is one measurement (the toy's
    d7 preset): one low batch after LLDS went on is not 16 samples (they gave t = -inf and a
    back-off one batch after the switch); the test waits for 16 batches."""
    dog = LLDSWatchdog()
    step = 0

    def feed(values, enabled):
        nonlocal step
        out = []
        for v in values:
            for _ in range(16):
                step += 1
                out.append(dog.update(_row(step, v, **{C.LLDS_LOSS: 0.1}), enabled, 0.2))
        return [d for d in out if d is not None]

    assert feed([0.5, 0.52, 0.48, 0.51, 0.49, 0.5, 0.53, 0.47], False) == []
    assert feed([0.1], True) == []  # one batch, 16 rows: one measurement
    assert (len(dog.before), len(dog.after)) == (8, 1)
    assert feed([0.1 + 0.01 * (i % 3) for i in range(1, 15)], True) == []  # 15 measurements
    decisions = feed([0.09], True)  # the 16th
    assert [d.action for d in decisions] == ["lower"] and decisions[0].lam == pytest.approx(0.1)
    assert "over the 8 rewards logged before" in decisions[0].reason


def test_the_watchdog_resumes_from_the_checkpoint_state(tmp_path):
    """The monitor's state_dict (saved with every Trainer checkpoint) carries the watchdog's:
    a monitor resumed at step 30 lowers lambda at the same steps as the uninterrupted one."""

    def feed(m, steps):
        for s in steps:
            if s == 17:
                m.llds.enable(0.16, reason="user")
            low = s >= 17
            m.end_step(step=s, reward_mean=(0.05 if low else 0.5) + 0.01 * (s % 2), llds_loss=0.4)

    def lowered_at(run):
        ev = load_run(run).events
        inter = ev[ev[C.EVENT_TYPE] == "intervention"]
        return inter[inter[C.EVENT_MESSAGE].str.contains("llds_watchdog")][C.EVENT_STEP].tolist()

    whole = LLDMonitor(tmp_path / "whole", detector=None, llds_watchdog=True)
    feed(whole, range(1, 50))
    whole.close()
    first = LLDMonitor(tmp_path / "first", detector=None, llds_watchdog=True)
    feed(first, range(1, 31))
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    assert state["watchdog"]["on"] is True and len(state["watchdog"]["after"]) == 14
    resumed = LLDMonitor(tmp_path / "resumed", detector=None, llds_watchdog=True)
    with pytest.warns(UserWarning, match="the checkpoint's switch wins"):  # (LLDS was on)
        resumed.load_state_dict(state)
    assert resumed.watchdog.state_dict() == state["watchdog"]
    feed(resumed, range(31, 50))
    resumed.close()
    assert lowered_at(tmp_path / "resumed") == lowered_at(tmp_path / "whole") == [32, 48]
