"""Small parts of the monitor: LLDSSwitch.term, gather_and_reduce, the detection Responder."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest
import torch

from lld_monitor import LLDSConfig
from lld_monitor import columns as C
from lld_monitor.events import Alert
from lld_monitor.monitor.actions import ActionPolicy, Responder, phase_message
from lld_monitor.monitor.llds_switch import LLDSSwitch
from lld_monitor.monitor.step_metrics import FIELD_INDEX, StepMetrics, gather_and_reduce

# -- LLDSSwitch.term ---------------------------------------------------------------------------

# One response, two generated tokens (one action), advantage 1 (preserving):
# logp_old [0, 0], logp_new [-0.5, -0.25] -> d = logp_old - logp_new = [0.5, 0.25], sum 0.75 > 0
# so the action is gated; paper normalisation: mean over preserving responses of
# sum(relu d) / n_i = 0.75 / 2 = 0.375.
LOGP_OLD = torch.tensor([[0.0, 0.0]])
LOGP_NEW = torch.tensor([[-0.5, -0.25]])
ADV = torch.tensor([1.0])
MASK = torch.ones(1, 2)


def _switch(**cfg: Any) -> tuple[LLDSSwitch, list[tuple]]:
    changes: list[tuple] = []
    return LLDSSwitch(LLDSConfig(**cfg), lambda *c: changes.append(c)), changes


def test_term_is_lam_times_the_loss_while_on_and_zero_while_off() -> None:
    switch, _ = _switch(lam=0.2)
    term, out = switch.term(LOGP_NEW, LOGP_OLD, ADV, MASK)
    assert out.loss.item() == pytest.approx(0.375)
    assert term.item() == pytest.approx(0.2 * 0.375)
    assert out.frac_gated.item() == 1.0
    switch.disable()
    term, out = switch.term(LOGP_NEW, LOGP_OLD, ADV, MASK)
    assert out is None and term.item() == 0.0 and term.dim() == 0


def test_term_weights_the_answer_span_by_the_configured_beta() -> None:
    # the second token is the answer, weighted by beta 0.5: d = [0.5, 0.125], sum 0.625 -> 0.3125
    switch, _ = _switch(lam=1.0, answer_weighting=0.5)
    answer = torch.tensor([[False, True]])
    _, out = switch.term(LOGP_NEW, LOGP_OLD, ADV, MASK, answer_mask=answer)
    assert out.loss.item() == pytest.approx(0.3125)
    paper, _ = _switch(lam=1.0, answer_weighting="paper")  # beta = min(V / 2, 1) = 0.5 at V=1
    _, out = paper.term(LOGP_NEW, LOGP_OLD, ADV, MASK, answer_mask=answer, mean_valid_searches=1)
    assert out.loss.item() == pytest.approx(0.3125)
    with pytest.raises(ValueError, match="needs mean_valid_searches"):
        paper.term(LOGP_NEW, LOGP_OLD, ADV, MASK, answer_mask=answer)


def test_change_message() -> None:
    assert LLDSSwitch.change_message(True, 0.2, "user") == "LLDS switched on (lambda=0.2) by user"
    assert LLDSSwitch.change_message(False, 0.2, "x") == "LLDS switched off by x"


# -- gather_and_reduce (one process: the gather is the local vector) ------------------------


def test_gather_and_reduce_on_one_rank() -> None:
    acc = StepMetrics()
    acc.add("n_resp", 4.0)
    acc.add_update(grad_norm=3.0, loss=None)
    host, failed = gather_and_reduce(acc.pack(torch.device("cpu"), []))
    assert failed == []
    assert host[FIELD_INDEX["n_resp"]] == 4.0 and host[FIELD_INDEX["grad_max"]] == 3.0
    host, failed = gather_and_reduce(StepMetrics.failed(torch.device("cpu"), 0))
    assert failed == [0]
    assert math.isnan(host[FIELD_INDEX["grad_max"]])


# -- detection.Responder -------------------------------------------------------------------


def test_phase_message() -> None:
    assert phase_message(None, "healthy") is None  # a healthy start says nothing
    assert phase_message(None, "decay") == "phase decay at the first analysed step"
    assert phase_message("healthy", "decay") == "phase healthy -> decay"
    assert phase_message("decay", "decay") is None


class _Scripted:
    """A detector that returns scripted (phase, alert kinds) per update."""

    def __init__(self, script: list[tuple[str, list[str]]]) -> None:
        self.script = iter(script)
        self.phase = "unknown"

    def update(self, row: dict) -> list[Alert]:
        self.phase, kinds = next(self.script)
        return [Alert(row[C.STEP], k, "warning", f"{k} seen") for k in kinds]


def _responder(detector: Any, policy: ActionPolicy, llds: LLDSSwitch, given: bool = False):
    events: list[dict] = []
    sunk: list[Alert] = []
    requests: list[str] = []
    r = Responder(
        detector,
        policy,
        llds,
        llds_given=given,
        emit=events.append,
        alert_sink=sunk.append,
        request=requests.append,
        guard=lambda where: nullcontext(),
    )
    return r, events, sunk, requests


def test_responder_records_phases_and_alerts_and_acts() -> None:
    llds, changes = _switch(lam=0.7, enabled=False)
    det = _Scripted([("healthy", []), ("decay", ["decay"]), ("collapse", ["collapse"])])
    policy = ActionPolicy(True, ("decay",), stop_on_collapse=True, checkpoint_on_collapse=True)
    r, events, sunk, requests = _responder(det, policy, llds)
    assert r.update({C.STEP: 0}, 0) == [] and events == []  # healthy start: nothing
    alerts = r.update({C.STEP: 1}, 1)
    assert [a.kind for a in alerts] == ["decay"] and r.last_alerts == alerts
    assert r.phase == "decay"
    assert [(e[C.EVENT_TYPE], e[C.EVENT_KIND]) for e in events] == [
        ("phase", "decay"),
        ("alert", "decay"),
    ]
    assert events[0][C.EVENT_MESSAGE] == "phase healthy -> decay"
    # auto_llds switched LLDS on at the paper's lambda (no LLDSConfig given), not 0.7
    assert llds.enabled and llds.lam == 0.2
    assert changes == [(True, 0.2, "auto_llds on a decay alert at step 1")]
    r.update({C.STEP: 2}, 2)
    assert requests == ["stop", "checkpoint"]
    assert [e[C.EVENT_KIND] for e in events[2:]] == ["collapse", "collapse", "stop", "checkpoint"]
    assert [a.kind for a in sunk] == ["decay", "collapse"]


def test_responder_keeps_a_given_lambda_and_records_a_refusal() -> None:
    llds, _ = _switch(lam=0.7, enabled=False)
    r, events, _, _ = _responder(None, ActionPolicy(True), llds, given=True)
    assert r.update({C.STEP: 0}, 0) == [] and r.last_alerts == []  # no detector
    r.act(Alert(3, "stagnation", "warning", "m"), 3)
    assert llds.enabled and llds.lam == 0.7
    blocked, _ = _switch(enabled=False)
    blocked.blocked = "the model has active dropout"
    r, events, _, _ = _responder(None, ActionPolicy(True), blocked)
    r.act(Alert(3, "decay", "warning", "m"), 3)
    assert not blocked.enabled
    assert [(e[C.EVENT_KIND], e[C.EVENT_SEVERITY]) for e in events] == [
        ("llds_enable_refused", "warning")
    ]
    assert events[0][C.EVENT_MESSAGE].endswith("refused, the model has active dropout")


def test_responder_a_failing_detector_goes_to_the_guard() -> None:
    class Broken:
        phase = None

        def update(self, row: dict) -> list[Alert]:
            raise RuntimeError("bad row")

    guarded: list[str] = []

    @contextmanager
    def guard(where: str) -> Iterator[None]:
        try:
            yield
        except RuntimeError:
            guarded.append(where)

    llds, _ = _switch(enabled=False)
    r = Responder(
        Broken(),
        ActionPolicy(),
        llds,
        llds_given=False,
        emit=print,
        alert_sink=print,
        request=print,
        guard=guard,
    )
    assert r.update({C.STEP: 0}, 0) == []
    assert guarded == ["detector"]
