"""What the simulators share: the labelled run, the smooth curve pieces, AR(1) noise."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class LabelledRun:
    """A simulated run: the step table (one row per logged step) and its ground truth."""

    steps: pd.DataFrame
    labels: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """A short file-system-safe name (``labels["name"]``)."""
        return str(self.labels.get("name", self.labels.get("kind", "run")))


def _smoothstep(x: np.ndarray) -> np.ndarray:
    """0 for x<=0, 1 for x>=1, smooth in between; shape of x."""
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def _bump(t: np.ndarray, start: float, down: float, up: float) -> np.ndarray:
    """Transient dip profile in [0, 1]: in over ``down`` steps from ``start``, out over ``up``."""
    rise = _smoothstep((t - start) / down)
    fall = _smoothstep((t - start - down) / up)
    return rise * (1.0 - fall)


def _ar1(rng: np.random.Generator, n: int, sd: float, phi: float) -> np.ndarray:
    """A stationary AR(1) series of length ``n``: marginal sd ``sd``, lag-1 correlation ``phi``."""
    z = rng.normal(0.0, sd, n)
    if phi == 0.0 or n == 0:
        return z
    z[1:] *= math.sqrt(1.0 - phi * phi)
    # y[i] = z[i] + phi y[i-1], y[0] = z[0]: the recursion scipy.signal.lfilter([1], [1, -phi])
    # computes, in the same float operations (a test checks them equal where scipy is
    # installed: it is a test dependency, not one of the package's)
    values = z.tolist()
    prev = 0.0
    for i, v in enumerate(values):
        prev = v + phi * prev
        values[i] = prev
    return np.array(values)
