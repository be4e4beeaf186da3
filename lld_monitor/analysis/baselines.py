"""Generic collapse detectors to compare against, with the same interface and Alert output.

- ``GradSpikeDetector``: what pre-training stacks do (OLMo-core skips a step when the grad norm is
  more than 6 sigma above the mean of a rolling window of 128 steps). It reacts to Phase III.
- ``RewardDropDetector``: an EMA of the reward falls below half its peak. It reacts when the
  collapse has happened.
Both emit alerts of kind ``collapse`` (severity ``critical``) so any scorer scores any detector.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from lld_monitor import columns as C
from lld_monitor.analysis.detector import _dec, _enc, _f, ema_weight
from lld_monitor.events import Alert


class GradSpikeDetector:
    """Alert when the grad norm's z-score against the last ``window`` values exceeds ``sigma``.

    The z-score uses the mean and standard deviation of the previous values only (at least
    ``min_history`` of them); every value then enters the window, spikes included, as OLMo-core's
    rolling statistics do. Windows count logged values, as OLMo-core counts steps.
    """

    def __init__(self, window: int = 128, sigma: float = 6.0, min_history: int = 64) -> None:
        if window < 2 or not sigma > 0 or not 2 <= min_history <= window:
            raise ValueError("need window >= 2, sigma > 0 and 2 <= min_history <= window")
        self.window = int(window)
        self.sigma = float(sigma)
        self.min_history = int(min_history)
        self.reset()

    def reset(self) -> None:
        self._buf: deque[float] = deque()
        self._last_step = math.nan

    @property
    def phase(self) -> str:
        return "unknown"

    def update(self, row: Mapping[str, Any]) -> list[Alert]:
        """Feed one row; an alert for each spike."""
        step = _f(row.get(C.STEP))
        if not math.isfinite(step) or step <= self._last_step:
            return []
        self._last_step = step
        g = _f(row.get(C.GRAD_NORM))
        if not math.isfinite(g):
            return []
        out: list[Alert] = []
        buf = self._buf
        n = len(buf)
        if n >= self.min_history:
            mean = math.fsum(buf) / n
            var = math.fsum((x - mean) ** 2 for x in buf) / (n - 1)
            sd = math.sqrt(var)
            z = (g - mean) / sd if sd > 0 else (math.inf if g > mean else 0.0)
            if z > self.sigma:
                out.append(
                    Alert(
                        int(step),
                        "collapse",
                        "critical",
                        f"grad-norm spike at step {int(step)}: {g:.4g} is {z:.1f} sigma above the "
                        f"mean {mean:.4g} of the last {n} values (grad-spike baseline, z > "
                        f"{self.sigma:g})",
                        {"detector": "grad_spike", "grad_norm": g, "z": _enc(z), "mean": mean},
                    )
                )
        buf.append(g)
        if len(buf) > self.window:
            buf.popleft()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "params": {"window": self.window, "sigma": self.sigma, "min_history": self.min_history},
            "buf": list(self._buf),
            "last_step": _enc(self._last_step),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if dict(state["params"]) != {
            "window": self.window,
            "sigma": self.sigma,
            "min_history": self.min_history,
        }:
            raise ValueError("state was saved with other hyperparameters")
        self._buf = deque(float(x) for x in state["buf"])
        self._last_step = _dec(state["last_step"])


class RewardDropDetector:
    """Alert once when the EMA (time constant ``tau`` steps) of the reward falls below
    ``fraction`` of its peak; only meaningful for a positive peak."""

    def __init__(self, tau: float = 10.0, fraction: float = 0.5, min_rows: int = 5) -> None:
        if not tau > 0 or not 0 < fraction < 1 or min_rows < 1:
            raise ValueError("need tau > 0, 0 < fraction < 1 and min_rows >= 1")
        self.tau = float(tau)
        self.fraction = float(fraction)
        self.min_rows = int(min_rows)
        self.reset()

    def reset(self) -> None:
        self._ema = math.nan
        self._peak = math.nan
        self._last = math.nan
        self._n = 0
        self._fired = False

    @property
    def phase(self) -> str:
        return "collapse" if self._fired else "unknown"

    def update(self, row: Mapping[str, Any]) -> list[Alert]:
        """Feed one row; one alert, the first time the EMA is below the threshold."""
        step = _f(row.get(C.STEP))
        r = _f(row.get(C.REWARD_MEAN))
        if not math.isfinite(r) or not math.isfinite(step) or step <= self._last:
            return []
        if self._ema != self._ema:
            self._ema = r
        else:
            self._ema += ema_weight(step - self._last, self.tau) * (r - self._ema)
        self._last = step
        self._n += 1
        if not self._ema <= self._peak:
            self._peak = self._ema
        if (
            not self._fired
            and self._n >= self.min_rows
            and self._peak > 0
            and self._ema < self.fraction * self._peak
        ):
            self._fired = True
            return [
                Alert(
                    int(step),
                    "collapse",
                    "critical",
                    f"reward EMA {self._ema:.4g} fell below {self.fraction:g} x its peak "
                    f"{self._peak:.4g} at step {int(step)} (reward-drop baseline)",
                    {"detector": "reward_drop", "reward_ema": self._ema, "peak": self._peak},
                )
            ]
        return []

    def state_dict(self) -> dict[str, Any]:
        return {
            "params": {"tau": self.tau, "fraction": self.fraction, "min_rows": self.min_rows},
            "ema": _enc(self._ema),
            "peak": _enc(self._peak),
            "last": _enc(self._last),
            "n": self._n,
            "fired": self._fired,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if dict(state["params"]) != {
            "tau": self.tau,
            "fraction": self.fraction,
            "min_rows": self.min_rows,
        }:
            raise ValueError("state was saved with other hyperparameters")
        self._ema = _dec(state["ema"])
        self._peak = _dec(state["peak"])
        self._last = _dec(state["last"])
        self._n = int(state["n"])
        self._fired = bool(state["fired"])
