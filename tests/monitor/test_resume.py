"""resume.py: the monitor's resume state and which steps a resumed folder replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lld_monitor import columns as C
from lld_monitor.events import make_event
from lld_monitor.monitor.resume import (
    MonitorState,
    last_logged_step,
    monitor_state,
    parse_state,
    replayed_event,
    replaying,
)
from lld_monitor.runlog import RunWriter


class _Detector:
    def state_dict(self) -> dict:
        return {"phase": "decay", "n": 3}


def test_state_round_trips_through_json() -> None:
    state = monitor_state(
        step=12,
        llds_enabled=True,
        llds_lam=0.2,
        phase="decay",
        detector=_Detector(),
        reward_fn_names=["accuracy", "format"],
        correctness={"rule_max": 0.5, "varying_steps": 2, "warned": False},
    )
    assert state["version"] == 1
    assert state["detector"] == {"phase": "decay", "n": 3}
    parsed = parse_state(json.loads(json.dumps(state)))  # plain JSON: trainer_state.json
    assert parsed == MonitorState(
        step=12,
        llds_enabled=True,
        llds_lam=0.2,
        phase="decay",
        detector={"phase": "decay", "n": 3},
        reward_fn_names=("accuracy", "format"),
        correctness={"rule_max": 0.5, "varying_steps": 2, "warned": False},
    )
    assert parsed.restore_message() == (
        "monitor state restored from the checkpoint before step 12: LLDS on (lambda=0.2), "
        "phase decay"
    )


def test_state_without_a_detector_state_and_llds_off() -> None:
    state = monitor_state(
        step=0,
        llds_enabled=False,
        llds_lam=0.5,
        phase=None,
        detector=None,
        reward_fn_names=[],
        correctness={},
    )
    assert state["detector"] is None
    parsed = parse_state(state)
    assert parsed.restore_message().endswith("LLDS off, phase None")
    assert parsed.llds_lam == 0.5  # kept while off: a later enable() uses it


def test_parse_state_refuses_another_version() -> None:
    with pytest.raises(ValueError, match="unsupported LLDMonitor state version 2"):
        parse_state({"version": 2, "step": 0, "llds": {"enabled": False, "lam": 0.2}})
    with pytest.raises(ValueError, match="version None"):
        parse_state({})


def test_replaying_steps_up_to_the_last_logged_one() -> None:
    assert not replaying(None, 0)  # not resumed
    assert replaying(5, 5) and replaying(5, 0) and replaying(5, 4.0)
    assert not replaying(5, 6)
    assert not replaying(5, None) and not replaying(5, "3")
    alert = make_event("alert", 4, "decay", "m", "warning")
    assert replayed_event(5, alert)
    assert replayed_event(5, make_event("phase", 5, "decay", "m"))
    assert replayed_event(5, make_event("intervention", 2, "stop", "m"))
    assert not replayed_event(5, make_event("lifecycle", 4, "restore", "m"))  # always written
    assert not replayed_event(5, make_event("alert", 6, "decay", "m", "warning"))
    assert not replayed_event(None, alert)


def test_last_logged_step_of_a_run_folder(tmp_path: Path) -> None:
    assert last_logged_step(tmp_path / "absent") is None
    run = tmp_path / "run"
    with RunWriter(run, meta={"trainer": "custom"}) as writer:
        pass
    assert last_logged_step(run) is None  # meta and an empty steps file
    with RunWriter(run, meta={"trainer": "custom"}, resume=True) as writer:
        for step in (0, 1, 3):
            writer.log_step({C.STEP: step, C.TIME: 0.0, C.REWARD_MEAN: 0.5})
    assert last_logged_step(run) == 3


def test_a_restored_llds_switch_that_overrides_the_script_is_said_on_the_console(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint saved with LLDS on, resumed by a script that asks for LLDS off: the switch
    is restored, and the user is told (a warning at their line), not only events.jsonl."""
    from lld_monitor import LLDMonitor, LLDSConfig

    saved = LLDMonitor(tmp_path / "a", detector=None, llds=LLDSConfig(lam=0.3))
    saved.step = 7
    state = saved.state_dict()
    saved.close()
    resumed = LLDMonitor(tmp_path / "b", detector=None)  # LLDS off in this script
    with pytest.warns(UserWarning, match=r"asked for LLDS off.*LLDS is on \(lambda=0\.3\)") as w:
        resumed.load_state_dict(state)
    assert [x.filename for x in w] == [__file__]
    assert resumed.llds.enabled and resumed.llds.lam == 0.3
    resumed.close()
    # the same switch as the script asked: one console line (the log), no warning
    same = LLDMonitor(tmp_path / "c", detector=None, llds=LLDSConfig(lam=0.3))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with caplog.at_level("WARNING", logger="lld_monitor"):
            same.load_state_dict(state)
    assert any("restored from the checkpoint before step 7" in r.message for r in caplog.records)
    same.close()
