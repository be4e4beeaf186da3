"""Alerts a person can act on (issue 50, item 3): one-line headlines, what to do now, repeats
merged, no clause contradicting another."""

from __future__ import annotations

import functools

import pytest

from lld_monitor.analysis import analyze_run
from lld_monitor.analysis.advice import (
    HEADLINE_CHARS,
    REPEAT_WINDOW_STEPS,
    actions,
    alert_record,
    headline,
    merge_repeats,
    since_step,
)
from lld_monitor.events import Alert
from lld_monitor.testing import CLASSIC_KINDS, FAILURE_KINDS, make_suite
from lld_monitor.testing.standard import make_standard_suite


@functools.cache
def suite_alerts() -> list[tuple[str, Alert]]:
    """(run name, alert) over the classic suite with the failure kinds and the standard-metric
    suite: every alert kind the analyzer raises (seeds whose runs re-raise some kinds: a
    dead signal and a spike come back within the window)."""
    runs = list(make_suite(seed=2026, kinds=CLASSIC_KINDS + FAILURE_KINDS))
    runs += list(make_standard_suite(seed=1))
    return [(run.name, a) for run in runs for a in analyze_run(run.steps).alerts]


def test_every_kind_has_a_one_line_headline_and_something_to_do():
    by_kind: dict[str, list[Alert]] = {}
    for _, a in suite_alerts():
        by_kind.setdefault(a.kind, []).append(a)
    # the suites raise the LLD kinds and the failures (else this test would test little)
    assert {"stagnation", "decay", "collapse", "displacement", "nonfinite", "dead_signal"} <= set(
        by_kind
    ), sorted(by_kind)
    for kind, alerts in by_kind.items():
        for a in alerts:
            line = headline(a)
            assert "\n" not in line and len(line) <= HEADLINE_CHARS, (kind, line)
            if kind != "nonfinite":  # (which names its NaN)
                assert "nan" not in line.lower(), (kind, line)
            assert since_step(a) <= a.step
            if kind != "phase":
                assert actions(a), kind
                assert all("\n" not in t for t in actions(a))


def test_no_alert_is_repeated_within_its_window():
    merged = [a for _, a in suite_alerts() if "repeats" in a.evidence]
    assert merged  # (the replay re-raised these: without the merge this test fails)
    last: dict[tuple[str, str, object], int] = {}
    for name, a in suite_alerts():
        key = (name, a.kind, a.evidence.get("phase_to") or a.evidence.get("signal"))
        if key in last:
            assert a.step - last[key] > REPEAT_WINDOW_STEPS, (name, a.kind, last[key], a.step)
        last[key] = a.step


def test_no_collapse_alert_says_the_reward_both_fell_and_did_not():
    """A level shift (the reward fell from A to B) merged with the LLD evidence used to add
    'not (yet) past threshold: ... reward 0% below its peak': the peak clause is left out."""
    merged = [a for _, a in suite_alerts() if a.evidence.get("detector") == "level_shift"]
    assert merged
    for a in merged:
        assert "below its peak" not in a.message, a.message


def _a(step: int, kind: str = "mode_collapse", severity: str = "warning", **ev) -> Alert:
    return Alert(step, kind, severity, f"{kind} at step {step}", ev)


def test_merge_repeats_by_hand():
    alerts = [
        _a(100),
        _a(104, "spike", "info", signal="grad_norm"),
        _a(108),
        _a(110, "spike", "info", signal="kl"),
        _a(116, severity="critical"),
        _a(116 + REPEAT_WINDOW_STEPS + 1),  # too late: a new alert
    ]
    out = merge_repeats(alerts)
    assert [(a.step, a.kind) for a in out] == [
        (100, "mode_collapse"),
        (104, "spike"),
        (110, "spike"),
        (167, "mode_collapse"),
    ]
    first = out[0]
    assert first.evidence["repeats"] == 3
    assert first.evidence["repeat_steps"] == [100, 108, 116]
    assert first.severity == "critical"  # the most severe of the three
    assert first.message.endswith("(raised 3 times, steps 100-116)")
    assert "repeats" not in out[3].evidence
    assert headline(first).endswith("[x3]")
    rec = alert_record(first)
    assert rec["repeats"] == 3 and rec["headline"] == headline(first)
    assert merge_repeats([]) == []


def test_a_window_is_measured_from_the_last_repeat():
    """A chain of repeats each within the window of the one before stays one alert."""
    steps = [0, 40, 80, 120]
    out = merge_repeats([_a(s) for s in steps], window=50)
    assert len(out) == 1 and out[0].evidence["repeat_steps"] == steps


@pytest.mark.parametrize(
    ("ev", "since", "sure"),
    [
        (
            {"change_step": 180.0, "detector": "level_shift", "z": 7.5, "threshold": 3.63},
            180,
            "z 7.5 vs 3.63",
        ),
        ({"window_start": 22.0, "window_steps": 27.0}, 22, "over 27 steps"),
        ({"held_steps": 10.0}, 90, "held 10 steps"),
        ({}, 100, ""),
    ],
)
def test_since_when_and_how_sure(ev, since, sure):
    kind = "collapse" if "detector" in ev else "stagnation" if "window_start" in ev else "kl_blowup"
    a = Alert(100, kind, "warning", "m", ev)
    assert since_step(a) == since
    line = headline(a)
    assert (f"since step {since}" in line) == (since != 100)
    assert sure in line


def test_an_alert_without_its_evidence_is_told_in_its_own_words():
    """A logged event from an older run or another tool has no evidence: the headline takes the
    first clause of its message, never 'nan' or 'n/a'."""
    a = Alert(25, "stagnation", "warning", "logp of correct responses flat; more words", {})
    assert headline(a) == "LLD Phase I (stagnation) at step 25: logp of correct responses flat"
    b = Alert(9, "dead_signal", "warning", "every group gets the same reward (for 3 steps)", {})
    assert "nan" not in headline(b) and "n/a" not in headline(b)


@pytest.mark.parametrize("kind", ["stagnation", "decay", "displacement", "collapse"])
def test_llds_already_on_is_advised_to_act_harder_not_to_switch_on(kind):
    """An LLD alert on a row where LLDS was on (the detector puts the row's state in the
    evidence) does not say 'switch LLDS on': it says to check that LLDS acts and to raise
    lambda; with LLDS off (or a log without the column) the advice is to switch it on."""
    from lld_monitor.analysis.advice import actions

    on = actions(Alert(50, kind, "warning", "m", {"llds_on": 1, "llds_lambda": 0.2}))
    off = actions(Alert(50, kind, "warning", "m", {"llds_on": 0}))
    unknown = actions(Alert(50, kind, "warning", "m", {}))
    assert not any("switch LLDS on" in t for t in on), on
    assert any("llds_frac_gated" in t for t in on)
    assert any("raise lambda" in t or "larger lambda" in t for t in on)
    assert any("switch LLDS on" in t for t in off) and off == unknown
    if kind != "collapse":
        assert on[0].startswith("LLDS is already on at lambda 0.2")


def test_the_detector_puts_the_rows_llds_state_in_an_lld_alert():
    # a spiral with every LLD column, LLDS on at lambda 0.3 from step 100: the LLD alerts after
    # it say so, those before say off; a non-LLD alert carries nothing of it
    import pandas as pd

    from lld_monitor import columns as C
    from lld_monitor.testing import make_run

    steps = make_run("collapse", n_steps=300, seed=3).steps.copy()
    steps[C.LLDS_ENABLED] = (steps[C.STEP] >= 100).astype(float)
    steps[C.LLDS_LAMBDA] = 0.3 * steps[C.LLDS_ENABLED]
    alerts = analyze_run(steps).alerts
    lld = [a for a in alerts if a.kind in ("stagnation", "decay", "displacement", "collapse")]
    assert lld and any(a.step >= 100 for a in lld)
    for a in lld:
        want = {"llds_on": 1, "llds_lambda": 0.3} if a.step >= 100 else {"llds_on": 0}
        assert {k: a.evidence.get(k) for k in want} == pytest.approx(want), a
        assert "llds_lambda" in a.evidence or a.step < 100
    assert all("llds_on" not in a.evidence for a in alerts if a not in lld)
    # without the column: nothing added (a foreign log)
    bare = analyze_run(pd.DataFrame(steps.drop(columns=[C.LLDS_ENABLED, C.LLDS_LAMBDA]))).alerts
    assert all("llds_on" not in a.evidence for a in bare)
