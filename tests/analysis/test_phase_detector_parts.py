"""``PhaseDetector`` as a composition: a new check is one ``add_check``; its state is saved
under its key; a state saved without it loads it fresh."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from lld_monitor import columns as C
from lld_monitor.analysis import PhaseDetector
from lld_monitor.analysis.checks import NO_ALERTS, Check
from lld_monitor.analysis.signals import Signals
from lld_monitor.events import Alert


class _EveryTenthRow(Check):
    """A toy check: an info alert every 10th row it sees (its state: rows seen)."""

    kind = "tenth_row"

    def reset(self) -> None:
        self.rows = 0

    def update(self, s: Signals) -> list[Alert]:
        self.rows += 1
        if self.rows % 10:
            return NO_ALERTS
        return [Alert(int(s.step), self.kind, "info", f"row {self.rows}", {"rows": self.rows})]

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.rows = int(d["rows"])


def _rows(n: int) -> list[dict]:
    return [{C.STEP: s, C.REWARD_STD: 0.0} for s in range(n)]  # dead signal from step 30


def test_add_check_appends_its_alerts_after_the_others() -> None:
    det = PhaseDetector()
    det.add_check(_EveryTenthRow(det.config))
    alerts = [a for r in _rows(40) for a in det.update(r)]
    assert [(a.step, a.kind) for a in alerts] == [
        (9, "tenth_row"),
        (19, "tenth_row"),
        (29, "tenth_row"),
        (30, "dead_signal"),
        (39, "tenth_row"),
    ]
    with pytest.raises(ValueError, match="already has a check"):
        det.add_check(_EveryTenthRow(det.config))


def test_new_check_state_saved_under_its_key_and_fresh_from_an_older_state() -> None:
    det = PhaseDetector()
    old = json.loads(json.dumps(det.state_dict()))  # saved before the check was added
    det.add_check(_EveryTenthRow(det.config))
    for r in _rows(15):
        det.update(r)
    assert det.state_dict()["checks"]["tenth_row"] == {"rows": 15}
    again = PhaseDetector()
    again.add_check(_EveryTenthRow(again.config))
    again.load_state_dict(old)
    assert again.checks[-1].rows == 0


def test_checks_are_in_the_order_of_their_alerts() -> None:
    keys = [c.key for c in PhaseDetector().checks]
    assert keys[:8] == [
        *("displacement", "nonfinite", "no_update", "zero_grad", "sampler_mismatch"),
        *("llds_inert", "spike:kl", "spike:grad_norm"),
    ]
    assert keys[-4:] == ["trend_levels", "sharp_collapse", "mode_collapse", "level_shift"]


def test_reset_keeps_added_checks_and_gives_the_fresh_state() -> None:
    det = PhaseDetector()
    det.add_check(_EveryTenthRow(det.config))
    for r in _rows(45):
        det.update(r)
    det.reset()
    fresh = PhaseDetector()
    fresh.add_check(_EveryTenthRow(fresh.config))
    assert det.state_dict() == fresh.state_dict() and det.phase == "unknown"
