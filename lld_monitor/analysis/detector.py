"""The online phase detector: one row at a time, O(1) amortized, same alerts live and on replay.

Phases (PAPER.md, "The death spiral"): ``stagnation`` = likelihood of correct responses flat while
the reward rises; ``decay`` = that likelihood declines steadily; ``collapse`` = sharp drop with a
grad-norm surge, entropy rise, reward fall (and most correct responses displaced). Without the LLD
columns only ``collapse`` can be seen (from standard metrics); stagnation and decay cannot, and the
phase stays ``unknown`` until then. Non-LLD failures raise their own kinds.

Built from parts, as river builds its drift detectors: ``Signals`` (``analysis/signals.py``)
computes the row's features once; each check (``analysis/checks/``, one small class per kind)
reads them and returns its alerts; ``PhaseMachine`` (``analysis/phases.py``) composes the checks'
ranks into the phase; the words of every alert live in ``analysis/messages.py``. A new check is
one more object in ``PhaseDetector.checks`` (``add_check``).

All windows are in *steps* (the ``step`` column), never in rows, so sparse logging works (one
exception: the ``spike`` baseline is the median of a signal's last logged values, the reference
of a single value, not a time scale). The stagnation and decay trends are tested at every time
scale at once (``analysis/trend.py``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import fields
from typing import Any

from lld_monitor import columns as C
from lld_monitor.analysis.checks import Check, TrendLevels, default_checks
from lld_monitor.analysis.checks.displacement import _DisplacedShare
from lld_monitor.analysis.checks.spike import _Spikes
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.messages import with_llds_state
from lld_monitor.analysis.phases import PhaseMachine
from lld_monitor.analysis.signals import (
    INPUT_COLUMNS,
    Signals,
    _dec,
    _enc,
    _f,
    ema_weight,
)
from lld_monitor.events import Alert

__all__ = [
    "INPUT_COLUMNS",
    "STATE_VERSION",
    "DetectorConfig",
    "PhaseDetector",
    "_DisplacedShare",
    "_Spikes",
    "_dec",
    "_enc",
    "_f",
    "ema_weight",
    "upgrade_state_v1",
]

#: Version of ``PhaseDetector.state_dict()``: 2 = per-part states (signals, checks by key, phases).
STATE_VERSION = 2
_FAILURES = (
    "dead_signal",
    "entropy_collapse",
    "length_blowup",
    "reward_decline",
    "kl_blowup",
    "truncation",
)
_V1_SIGNALS = (
    "n_rows",
    "first_step",
    "last_step",
    "seen",
    "ols",
    "ema",
    "ema_last",
    "rw_peak",
    "rw_min",
    "rw_trough",
    "w_fast",
    "h_early",
    "kl_ref",
    "len_early",
    "early_n",
    "trunc_rows",
    "lp_ms",
    "rw_ms",
    "rw_declining",
)


def upgrade_state_v1(state: Mapping[str, Any]) -> dict[str, Any]:
    """A version-1 ``state_dict()`` (one flat dict) as a version-2 one; what a v1 state lacks
    (saved before a part existed) is left out, so that part starts afresh, as v1 loading did."""
    since, fired = state["since"], state["fired"]
    checks: dict[str, Any] = {
        "displacement": {
            "probe": state["displaced"],
            **({"inbatch": state["inbatch"]} if "inbatch" in state else {}),
        },
        "nonfinite": {"grad_bad": state["grad_bad"], "fired": fired.get("nonfinite", False)},
        "trend_levels": {k: state[k] for k in ("hold1", "hold2", "since1", "since2", "conf")},
        "sharp_collapse": {},
    }
    for col, spikes in state.get("spikes", {}).items():
        checks[f"spike:{col}"] = spikes
    for kind in _FAILURES:
        checks[kind] = {
            "since": since.get(kind),
            "since_off": since.get(kind + "_off"),
            "fired": fired.get(kind, False),
        }
    return {
        "version": STATE_VERSION,
        "params": dict(state["params"]),
        # (no rw_decline: Signals re-tests it on loading, as version 1 did)
        "signals": {k: state[k] for k in _V1_SIGNALS if k in state},
        "phases": {
            "phase": state["phase"],
            "since": {k: since.get(k) for k in ("r3", "below")},
            "below_rank": state["below_rank"],
            "recover": state["recover"],
        },
        "checks": checks,
    }


class PhaseDetector:
    """Online LLD phase detector: ``update(row) -> list[Alert]``, ``.phase``, JSON state.

    Hyperparameters are those of ``DetectorConfig`` and are stored under their names. The parts:
    ``signals`` (``Signals``), ``checks`` (a list of ``Check``, in the order of their alerts within
    a row) and ``machine`` (``PhaseMachine``).
    """

    def __init__(self, config: DetectorConfig | None = None, **hyperparameters: Any) -> None:
        cfg = (config or DetectorConfig()).with_overrides(**hyperparameters)
        self.config = cfg
        for f in fields(cfg):
            setattr(self, f.name, getattr(cfg, f.name))
        self.signals = Signals(cfg)
        self.checks: list[Check] = default_checks(cfg)
        self.machine = PhaseMachine(cfg)
        self._updates: list[Any] = []
        self._trend: TrendLevels | None = None
        self._immediate: list[Any] = []
        self.refresh()

    # --- public API -------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every row seen; keep the hyperparameters and the checks (added ones too)."""
        self.signals.reset()
        for c in self.checks:
            c.reset()
        self.machine.reset()
        self.refresh()

    def add_check(self, check: Check) -> None:
        """Append a check (its alerts come after those of the checks before it in a row)."""
        if not isinstance(check, Check):
            raise TypeError(f"add_check needs a Check instance, got {type(check).__name__}")
        if any(c.key == check.key for c in self.checks):
            raise ValueError(f"the detector already has a check with key {check.key!r}")
        self.checks.append(check)
        self.refresh()

    def refresh(self) -> None:
        """Take ``checks`` as they are now (after an element of the list was replaced): the row
        loop caches their bound updates, the trend check and the ``immediate`` ones."""
        self._updates = [c.update for c in self.checks]
        self._trend = next((c for c in self.checks if isinstance(c, TrendLevels)), None)
        self._immediate = [c for c in self.checks if c.immediate]

    @property
    def fresh(self) -> bool:
        """No row accepted yet (since the last ``reset``)."""
        return not self.signals.n_rows

    def begin_replay(self, columns: Mapping[str, Any], skip: Collection[int] = ()) -> None:
        """A whole table follows, every row reaching the checks (steps strictly increasing),
        into this fresh detector: each check but those at the indices ``skip`` may precompute
        from ``columns`` (input column -> [n] float array; ``Check.begin_replay``) and learns
        the run's horizon (``Check.horizon``: a short run is judged as one)."""
        if not self.fresh:
            raise ValueError("begin_replay needs a fresh detector (it indexes rows from the first)")
        for i, c in enumerate(self.checks):
            if i not in skip:
                c.begin_replay(columns)
                c.horizon(columns)

    def end_replay(self) -> None:
        """The replay is over: every check drops what ``begin_replay`` kept."""
        for c in self.checks:
            c.end_replay()

    @property
    def phase(self) -> str:
        """The current phase, one of ``columns.PHASES``."""
        return self.machine.phase

    @property
    def _phase(self) -> str:  # (the name before the split)
        return self.machine.phase

    @property
    def _seen(self) -> set[str]:
        return self.signals.seen

    def _check(self, key: str) -> Check:
        for c in self.checks:
            if c.key == key:
                return c
        raise KeyError(f"no check with key {key!r}; keys: {[c.key for c in self.checks]}")

    @property
    def _displaced(self) -> _DisplacedShare:
        """The probe's displaced-share test (of the ``displacement`` check)."""
        return self._check("displacement").probe  # type: ignore[attr-defined]

    @property
    def _inbatch(self) -> _DisplacedShare:
        """The in-batch displaced-share test (of the ``displacement`` check)."""
        return self._check("displacement").inbatch  # type: ignore[attr-defined]

    @property
    def signals_used(self) -> list[str]:
        """Input columns that have had a finite value so far."""
        return [c for c in INPUT_COLUMNS if c in self.signals.seen]

    @property
    def signals_missing(self) -> list[str]:
        """Input columns never seen with a finite value."""
        return [c for c in INPUT_COLUMNS if c not in self.signals.seen]

    def limitations(self) -> list[str]:
        """What the missing signals rule out, in words."""
        out: list[str] = []
        if C.LOGP_CORRECT not in self.signals.seen:
            out.append(
                "no logp_correct: stagnation and decay cannot be detected; the phase stays "
                "'unknown' unless a collapse is seen in standard metrics"
            )
        if C.FRAC_CORRECT_DISPLACED not in self.signals.seen:
            out.append("no frac_correct_displaced: the paper's >50% displaced indicator is unused")
        for col, what in (
            (C.REWARD_MEAN, "no reward_mean: stagnation and reward-fall evidence unavailable"),
            (C.GRAD_NORM, "no grad_norm: grad-norm surge and non-finite grad checks unavailable"),
            (C.ENTROPY, "no entropy: entropy rise and entropy collapse checks unavailable"),
            (C.COMPLETION_LENGTH, "no completion_length: length blow-up check unavailable"),
        ):
            if col not in self.signals.seen:
                out.append(what)
        return out

    def update(self, row: Mapping[str, Any]) -> list[Alert]:
        """Feed one step row (keyed by ``columns`` names; missing/NaN allowed); return new alerts.

        Rows whose step is not greater than the last one seen are ignored (duplicates, replays).
        """
        step = _f(row.get(C.STEP))
        if not math.isfinite(step):
            raise ValueError(f"a row needs a numeric {C.STEP!r} value, got {row.get(C.STEP)!r}")
        marks = row.get(C.NONFINITE)
        return self.update_values(
            step,
            tuple([_f(row.get(c)) for c in INPUT_COLUMNS]),
            marks.split(",") if isinstance(marks, str) else None,
        )

    def state_dict(self) -> dict[str, Any]:
        """The full running state as plain JSON (no NaN: encoded as null): version 2, the
        signals, the phase machine and each check's state under its key."""
        return {
            "version": STATE_VERSION,
            "params": self.config.to_dict(),
            "signals": self.signals.state_dict(),
            "phases": self.machine.state_dict(),
            "checks": {c.key: c.state_dict() for c in self.checks},
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> PhaseDetector:
        """A detector with the saved hyperparameters and running state."""
        det = cls(**dict(state["params"]))
        det.load_state_dict(state)
        return det

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()`` (version 2, or 1: upgraded); the hyperparameters must be
        the ones it was saved with. A check the state has no entry for starts afresh."""
        version = state.get("version")
        if version == 1:
            state = upgrade_state_v1(state)
        elif version != STATE_VERSION:
            raise ValueError(
                f"unsupported PhaseDetector state version {version!r}: this version reads 1 "
                f"and {STATE_VERSION}; save the state again with this version of lld_monitor"
            )
        # hyperparameters added since the state was saved take their defaults
        if DetectorConfig.from_dict(state["params"]) != self.config:
            raise ValueError(
                "state was saved with other hyperparameters; build the detector with "
                "PhaseDetector(**state['params']) before loading it"
            )
        self.reset()
        self.signals.load_state_dict(state["signals"])
        self.machine.load_state_dict(state["phases"])
        saved = state["checks"]
        for c in self.checks:
            if c.key in saved:
                c.load_state_dict(saved[c.key])

    # --- the work -----------------------------------------------------------------------------
    def update_values(
        self, step: float, v: tuple[float, ...], marks: list[str] | None = None
    ) -> list[Alert]:
        """``update`` of a row already read: ``step`` a float, ``v`` the floats ordered as
        ``INPUT_COLUMNS`` (NaN: missing); ``marks``: the columns the row says were non-finite
        when logged (``C.NONFINITE``; None: the row does not say, and a NaN counts when the
        column was finite before and the row has other values). The replay's per-row call."""
        s = self.signals
        if not s.update(step, v, marks):
            return []
        machine = self.machine
        s.phase = machine.phase
        alerts: list[Alert] = []
        checks = self.checks
        if len(checks) != len(self._updates):  # (a check appended to the list directly)
            self.refresh()
        for update in self._updates:
            out = update(s)
            if out:
                alerts.extend(out)
        trend = self._trend
        machine.update(s, checks, trend.level if trend is not None else -1, alerts, self._immediate)
        if alerts and s.llds_enabled == s.llds_enabled:  # (the row says whether LLDS is on)
            alerts[:] = [with_llds_state(a, s.llds_enabled, s.llds_lambda) for a in alerts]
        return alerts
