"""``KlSpike`` / ``GradSpike``: single-row spikes of KL and grad norm (info; not LLD-specific).

A value above the median of the signal's last ``spike_window`` logged values + ``spike_k`` *
1.4826 * their MAD, and at least ``spike_ratio`` (KL) / ``spike_grad_ratio`` (grad norm) times
its baseline: the larger of that median and the highest such median so far (KL: at least
``kl_floor``). The window is in rows (the reference of a single value, not a time scale).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

from lld_monitor import columns as C
from lld_monitor.analysis import messages
from lld_monitor.analysis.checks.base import NO_ALERTS, Check
from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.analysis.signals import Signals, _dec, _enc
from lld_monitor.events import Alert

_NAN = float("nan")


class _Spikes:
    """Single-row spikes of one signal against the median / MAD of its last ``window`` values.

    The baseline of the ratio is the larger of the current window median and the highest window
    median so far (``peak``): in a run whose signal collapsed towards 0 (no gradient in most
    steps) an ordinary value is not a spike. ``peak`` is sampled every ``STRIDE`` values (a sort
    of the small window); a value past the ratio test gets the exact median of its window, then
    the MAD (another sort). So a row costs a deque append and a few comparisons.
    """

    STRIDE = 5
    __slots__ = ("buf", "cool", "cool_rows", "floor", "k_mad", "min_rows", "peak", "ratio", "tick")

    def __init__(self, cfg: DetectorConfig, ratio: float, floor: float) -> None:
        self.buf: deque[float] = deque(maxlen=cfg.spike_window)
        self.peak = _NAN  # highest window median so far (sampled every STRIDE values)
        self.tick = 0  # values since peak was last sampled
        self.cool = 0  # values left before the next alert may fire
        self.min_rows = cfg.spike_min_rows
        self.k_mad = cfg.spike_k * 1.4826  # MAD -> sd of normal noise
        self.cool_rows = cfg.spike_cooldown_rows
        self.ratio = ratio
        self.floor = floor

    def _median_of_window(self) -> tuple[float, list[float]]:
        srt = sorted(self.buf)
        n = len(srt)
        h = n >> 1
        m = srt[h] if n & 1 else 0.5 * (srt[h - 1] + srt[h])
        if not m <= self.peak:
            self.peak = m
        return m, srt

    def push(self, x: float, test: bool) -> tuple[float, float, float, int] | None:
        """Add ``x``; (median, MAD, baseline, values) of the window before it when it is a
        spike and ``test`` (the detector is warm), else None."""
        hit = None
        buf = self.buf
        n = len(buf)
        if self.cool > 0:
            self.cool -= 1
        if n >= self.min_rows:
            self.tick += 1
            if self.tick >= self.STRIDE or self.peak != self.peak:
                self.tick = 0
                self._median_of_window()
            peak, floor, ratio = self.peak, self.floor, self.ratio
            if test and self.cool == 0 and x >= ratio * (peak if peak > floor else floor):
                m, srt = self._median_of_window()  # exact, for the value at hand
                base = self.peak if self.peak > floor else floor
                if x >= ratio * base and base > 0.0:
                    h = n >> 1
                    mads = sorted([abs(v - m) for v in srt])
                    mad = mads[h] if n & 1 else 0.5 * (mads[h - 1] + mads[h])
                    if x > m + self.k_mad * mad:
                        hit = (m, mad, base, n)
                        self.cool = self.cool_rows
        buf.append(x)
        return hit

    def state(self) -> dict[str, Any]:
        buf, peak = list(self.buf), _enc(self.peak)
        return {"buf": buf, "peak": peak, "cool": self.cool, "tick": self.tick}

    def load(self, d: Mapping[str, Any]) -> None:
        self.buf.clear()
        self.buf.extend(float(v) for v in d["buf"])
        self.peak = _dec(d["peak"])
        self.cool = int(d["cool"])
        self.tick = int(d.get("tick", 0))


class _SpikeCheck(Check):
    """One signal's spikes: every finite value enters the window; named only once warm."""

    __slots__ = ("spikes",)
    kind = "spike"
    row_only = True  # (reads the signal's raw value, the step and warm)
    signal: ClassVar[str] = ""

    def _spikes(self) -> _Spikes:
        raise NotImplementedError

    @property
    def key(self) -> str:
        return f"spike:{self.signal}"

    def reset(self) -> None:
        self.spikes = self._spikes()

    def update(self, s: Signals) -> list[Alert]:
        x = getattr(s, self.signal)
        if not math.isfinite(x):
            return NO_ALERTS
        hit = self.spikes.push(x, s.warm)
        return NO_ALERTS if hit is None else self._alert(s, x, hit)

    def _alert(self, s: Signals, x: float, hit: tuple[float, float, float, int]) -> list[Alert]:
        return [messages.spike_alert(int(s.step), self.signal, x, *hit)]

    def state_dict(self) -> dict[str, Any]:
        return self.spikes.state()

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.reset()
        self.spikes.load(d)


class KlSpike(_SpikeCheck):
    """A single-row spike of the KL to the reference (baseline at least ``kl_floor``)."""

    __slots__ = ()
    signal = C.KL

    def update(self, s: Signals) -> list[Alert]:  # (the base's, without the getattr)
        x = s.kl
        if not math.isfinite(x):
            return NO_ALERTS
        hit = self.spikes.push(x, s.warm)
        return NO_ALERTS if hit is None else self._alert(s, x, hit)

    def _spikes(self) -> _Spikes:
        cfg = self.config
        return _Spikes(cfg, cfg.spike_ratio, cfg.kl_floor)


class GradSpike(_SpikeCheck):
    """A single-row spike of the pre-clip grad norm."""

    __slots__ = ()
    signal = C.GRAD_NORM

    def update(self, s: Signals) -> list[Alert]:  # (the base's, without the getattr)
        x = s.grad_norm
        if not math.isfinite(x):
            return NO_ALERTS
        hit = self.spikes.push(x, s.warm)
        return NO_ALERTS if hit is None else self._alert(s, x, hit)

    def _spikes(self) -> _Spikes:
        cfg = self.config
        return _Spikes(cfg, cfg.spike_grad_ratio, 0.0)
