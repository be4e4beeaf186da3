"""llds_checks.py: the LLDS pre-checks (pure) and the once-per-run notes."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from lld_monitor import columns as C
from lld_monitor.monitor.llds_checks import (
    ZERO_STD_WARN,
    OnceNotes,
    can_act_problems,
    llds_subject,
    zero_std_problem,
)


def test_subject_names_llds_or_auto_llds_and_none_when_neither_may_act() -> None:
    assert llds_subject(True, False) == "LLDS is on"
    assert llds_subject(True, True, ("decay",)) == "LLDS is on"  # on: auto_llds has no say
    assert llds_subject(False, False, ("decay",)) is None
    assert llds_subject(False, True) == "auto_llds may switch LLDS on"
    assert (
        llds_subject(False, True, ("stagnation", "decay"))
        == "auto_llds may switch LLDS on (stagnation, decay alerts)"
    )


def test_can_act_problems_from_the_settings() -> None:
    on = "LLDS is on"
    assert can_act_problems(None, "one update per batch", 2) == []  # nothing may act
    assert can_act_problems(on, None, 4) == []
    assert can_act_problems(on, "", None) == []
    assert can_act_problems(on, "one update per batch", None) == [
        ("llds_check_reuse", "LLDS is on, but it cannot act: one update per batch", {})
    ]
    (key, msg, evidence), *rest = can_act_problems(on, None, 2)
    assert rest == []
    assert key == "llds_check_generations"
    assert msg.startswith("LLDS is on, but its gate rarely fires with num_generations=2:")
    assert "num_generations >= 4" in msg
    assert evidence == {"num_generations": 2}
    assert can_act_problems(on, None, 3) == []  # 3 is enough not to be warned about
    both = can_act_problems(on, "x", 1)
    assert [k for k, _, _ in both] == ["llds_check_reuse", "llds_check_generations"]


def test_zero_std_problem_at_the_threshold_only() -> None:
    on = "LLDS is on"
    assert ZERO_STD_WARN == 0.75
    msg = zero_std_problem(on, 0.75, 7)
    assert msg is not None
    assert msg.startswith("LLDS is on, but 75% of the prompt groups of the rollout batch at step 7")
    assert f"({C.FRAC_ZERO_STD_GROUPS} >= 0.75)" in msg
    assert zero_std_problem(on, 1, 3) is not None  # an int fraction counts too
    assert zero_std_problem(on, 0.74, 7) is None
    assert zero_std_problem(on, None, 7) is None  # no groups observed
    assert zero_std_problem(on, "0.9", 7) is None  # not a number
    assert zero_std_problem(None, 1.0, 7) is None  # LLDS off and auto_llds off


swallowed: list[str] = []


@contextmanager
def _swallow(where: str) -> Iterator[None]:
    """A failure policy that swallows (as the monitor's non-strict guard does)."""
    try:
        yield
    except RuntimeError:
        swallowed.append(where)


def test_once_notes_say_each_key_once_with_an_event() -> None:
    events: list[dict[str, Any]] = []
    notes = OnceNotes(events.append, _swallow)
    with pytest.warns(UserWarning, match="gate rarely fires"):
        assert notes.say("k1", 3, "the gate rarely fires", "warning", {"n": 2}) is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second time: no warning, no event
        assert notes.say("k1", 4, "the gate rarely fires", "warning", {"n": 2}) is False
        assert notes.say("k2", 5, "an info note", "info", {}) is True  # info: no warning
    assert [(e[C.EVENT_KIND], e[C.EVENT_STEP], e[C.EVENT_SEVERITY]) for e in events] == [
        ("k1", 3, "warning"),
        ("k2", 5, "info"),
    ]
    assert events[0][C.EVENT_TYPE] == "lifecycle"
    assert events[0][C.EVENT_EVIDENCE] == {"n": 2}
    assert notes.said == {"k1", "k2"}


def test_once_notes_a_failing_event_goes_to_the_guard_and_counts_as_said() -> None:
    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("run log closed")

    swallowed.clear()
    notes = OnceNotes(broken, _swallow)
    assert notes.say("k", 0, "note", "info", {}) is True
    assert swallowed == ["llds check event"]
    assert notes.say("k", 1, "note", "info", {}) is False
