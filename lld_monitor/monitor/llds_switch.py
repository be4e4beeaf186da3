"""The LLDS switch: thread-safe on/off and lambda; each change goes to an ``on_change`` callback.

:meth:`LLDSSwitch.term` is the loss term the switch adds while on (``lam * L_LLDS``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any


class LLDSSwitch:
    """Thread-safe LLDS on/off switch with its lambda; every change is an intervention event."""

    def __init__(self, config: Any, on_change: Callable[[bool, float, str], None]) -> None:
        self._lock = threading.Lock()
        self._config = config
        self._enabled = bool(config.enabled)
        self._lam = float(config.lam)
        self._on_change = on_change

    @property
    def config(self) -> Any:
        """The ``LLDSConfig`` (gate, normalisation, answer weighting) with the lambda in force."""
        with self._lock:
            return replace(self._config, lam=self._lam, enabled=self._enabled)

    @property
    def enabled(self) -> bool:
        with self._lock:
            return self._enabled

    @property
    def lam(self) -> float:
        """Lambda that applies while enabled (kept when disabled)."""
        with self._lock:
            return self._lam

    #: Why LLDS may not be switched on in this run (e.g. active dropout), or None.
    blocked: str | None = None

    def block(self, reason: str) -> None:
        """Refuse every later ``enable`` with ``reason`` (an adapter's finding, e.g. dropout)."""
        self.blocked = reason

    def enable(self, lam: float | None = None, *, reason: str = "user") -> None:
        """Switch LLDS on from the next loss computation; optionally set lambda."""
        if lam is not None and (not math.isfinite(float(lam)) or float(lam) < 0):
            raise ValueError(f"LLDS lambda must be a finite number >= 0, got {lam!r}")
        if self.blocked is not None:
            raise ValueError(f"LLDS cannot be switched on: {self.blocked}")
        with self._lock:
            self._enabled = True
            if lam is not None:
                self._lam = float(lam)
            enabled, lam_now = self._enabled, self._lam
        self._on_change(enabled, lam_now, reason)

    def disable(self, *, reason: str = "user") -> None:
        """Switch LLDS off from the next loss computation."""
        with self._lock:
            self._enabled = False
            lam_now = self._lam
        self._on_change(False, lam_now, reason)

    def term(
        self,
        logp_new: Any,
        logp_old: Any,
        advantages: Any,
        mask: Any,
        **kw: Any,
    ) -> tuple[Any, Any | None]:
        """``(lam * L_LLDS, LLDSOutput)`` under the config in force; ``(0, None)`` while off.

        [B, L] log-probs and mask, [B] advantages. With ``answer_mask`` [B, L] and the config's
        ``answer_weighting`` the answer span is weighted by beta (adaptive schedules need
        ``mean_valid_searches``); other keywords (``action_ids``) go to ``llds_loss``.
        """
        cfg = self.config
        if not cfg.enabled:
            return logp_new.new_zeros(()), None
        from lld_monitor.llds import llds_loss

        searches = kw.pop("mean_valid_searches", None)
        if kw.get("answer_mask") is not None and "answer_weight" not in kw:
            kw["answer_weight"] = cfg.answer_weight(searches)
        out = llds_loss(
            logp_new=logp_new,
            logp_old=logp_old.detach(),
            advantages=advantages,
            mask=mask,
            gate=cfg.gate,
            normalize=cfg.normalize,
            **kw,
        )
        return cfg.lam * out.loss, out

    @staticmethod
    def change_message(enabled: bool, lam: float, reason: str) -> str:
        """The intervention message of a change: ``LLDS switched on (lambda=0.2) by <reason>``."""
        state = f"on (lambda={lam:g})" if enabled else "off"
        return f"LLDS switched {state} by {reason}"

    def _sync(self, enabled: bool, lam: float) -> bool:
        """Adopt rank 0's state without an event; True when it changed."""
        with self._lock:
            changed = enabled != self._enabled or (enabled and abs(lam - self._lam) > 1e-12)
            self._enabled, self._lam = enabled, lam if enabled else self._lam
        return changed
