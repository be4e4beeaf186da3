"""``Displacement``: the paper's ">50% of correct responses displaced" indicator, as a test.

Two sources of the same indicator, one alert for one displacement: the probe's share
(``frac_correct_displaced`` with ``n_correct``) and the in-batch counts
(``inbatch_n_correct[_displaced]``, measured inside a reused rollout batch after updates on it).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from statistics import NormalDist
from typing import Any

from lld_monitor.analysis import messages
from lld_monitor.analysis.checks.base import NO_ALERTS, Check
from lld_monitor.analysis.signals import Signals, _dec, _enc
from lld_monitor.events import Alert

_NAN = float("nan")


class _DisplacedShare:
    """The paper's indicator as a test: is the share of correct responses displaced above
    ``frac`` (0.5), with evidence in counts?

    Each probe gives ``k`` displaced out of ``n`` correct responses (``n`` from ``n_correct``,
    else ``default_n``). Counts are pooled with weight ``memory`` per earlier probe (half-life
    of about one probe at 0.5), so one large rollout batch or two consecutive small ones can
    carry the evidence; a probe that repeats the previous one exactly (a rollout batch's value
    logged on each of its rows) is not counted again. It fires when the latest probe and the
    pooled share are above ``frac`` and the pooled one-sided z (binomial variance at ``frac``,
    weights squared) reaches ``z``; it re-arms once the pooled share is back below ``frac``.
    """

    __slots__ = (
        "decay",
        "default_n",
        "fired",
        "frac",
        "half_life",
        "k",
        "last",
        "memory",
        "min_n",
        "n",
        "probes",
        "recent",
        "s2",
        "total",
        "win",
        "windows",
        "z",
        "z_window",
    )

    def __init__(
        self,
        frac: float,
        z: float,
        memory: float,
        default_n: float,
        min_n: float,
        half_life: float = _NAN,
        decay: float = 0.0,
        windows: int = 0,
        z_window: float = math.inf,
    ) -> None:
        self.frac, self.z, self.memory, self.default_n = frac, z, memory, default_n
        self.min_n, self.half_life, self.decay = min_n, half_life, decay
        self.total = 0.0  # responses counted so far, unweighted (push_counts)
        self.k = self.n = self.s2 = 0.0  # weighted displaced, weighted correct, sum w^2 n
        self.last: tuple[float, float] = (_NAN, _NAN)
        self.probes: deque[tuple[float, float, float]] = deque(maxlen=4)  # (step, k, n)
        self.fired = False
        # the last ``windows`` probes' counts, unweighted: a share that climbs past ``frac``
        # slowly is tested over the last 2, 4, 8, ... of them (``z_window``: the z each
        # window needs); the exponential pool above forgets too fast to see a share of 0.6
        self.windows, self.z_window = int(windows), float(z_window)
        self.recent: deque[tuple[float, float]] = deque(maxlen=max(self.windows, 1))
        self.win: tuple[float, float, float, float] | None = None  # (probes, k, n, z) that fired

    def push(self, step: float, share: float, n_correct: float) -> bool:
        """Add one probe; True when the test newly fires."""
        n = n_correct if n_correct == n_correct and n_correct > 0 else self.default_n
        if (share, n_correct) == self.last or not 0.0 <= share <= 1.0:
            return False
        self.last = (share, n_correct)
        k = share * n
        m = self.memory
        self.k = m * self.k + k
        self.n = m * self.n + n
        self.s2 = m * m * self.s2 + n
        self.probes.append((step, k, n))
        if self.windows:
            self.recent.append((k, n))
        return self._decide(share > self.frac)

    def push_counts(self, step: float, k: float, n: float) -> bool:
        """Add ``k`` displaced of ``n`` correct responses not counted before (the in-batch
        measurement: distinct responses, a few per row). Earlier counts keep the weight
        0.5 ** (n / half_life), a half-life counted in responses, not rows; fires on the pooled
        share alone (one row holds too few responses for a share of its own)."""
        if not (n > 0 and 0.0 <= k <= n):
            return False
        m = 0.5 ** (n / self.half_life)
        self.k = m * self.k + k
        self.n = m * self.n + n
        self.s2 = m * m * self.s2 + n
        self.total += n
        self.probes.append((step, k, n))
        return self._decide(True)

    def _decide(self, latest_above: bool) -> bool:
        """Re-arm once the pooled share is back below ``frac``; else fire (True) when the
        latest evidence and the pooled share are above it with enough counts and z."""
        if self.fired:
            if self.k < self.frac * self.n:
                self.fired = False
            return False
        if not latest_above:
            return False
        if self.k > self.frac * self.n and self.n >= self.min_n and self.stat() >= self.z_crit():
            self.fired = True
            self.win = None
            return True
        if self.windows and self._windows_fire():
            self.fired = True
            return True
        return False

    def _windows_fire(self) -> bool:
        """The plain binomial z of the last 2, 4, 8, ... probes (newest first) against
        ``frac``; True (and ``win`` set) when one window reaches ``z_window``."""
        f = self.frac
        sd = math.sqrt(f * (1.0 - f))
        k = n = 0.0
        size, nxt = 0, 2
        recent = self.recent
        for i in range(len(recent) - 1, -1, -1):
            ki, ni = recent[i]
            k += ki
            n += ni
            size += 1
            if size == nxt or (i == 0 and size > 1):
                nxt *= 2
                if k > f * n and n >= self.min_n:
                    z = (k - f * n) / (sd * math.sqrt(n))
                    if z >= self.z_window:
                        self.win = (float(size), k, n, z)
                        return True
        return False

    def z_crit(self) -> float:
        """The z the pooled counts must reach. Tested on every row, the in-batch counts would
        almost surely cross a fixed level in a long run whose share sits near ``frac``; as the
        trend tests do, the level shrinks as (window / responses so far) ** ``decay`` once more
        responses than one window (half_life / ln 2) have been counted."""
        window = self.half_life / math.log(2.0)
        if not self.decay or not self.total > window:
            return self.z
        alpha = (1.0 - NormalDist().cdf(self.z)) * (window / self.total) ** self.decay
        return NormalDist().inv_cdf(1.0 - alpha)

    def stat(self) -> float:
        """One-sided z of the pooled share against ``frac``."""
        if self.s2 <= 0.0:
            return _NAN
        f = self.frac
        return (self.k - f * self.n) / math.sqrt(f * (1.0 - f) * self.s2)

    def evidence(self) -> dict[str, Any]:
        if self.win is not None:  # a window of the last probes fired: its counts
            size, k, n, z = self.win
            return {
                "displaced_share": self.probes[-1][1] / self.probes[-1][2],
                "displaced_pooled_share": k / n,
                "displaced_pooled_n": n,
                "displaced_z": z,
                "displaced_z_needed": self.z_window,
                "displaced_window_probes": int(size),
                "displaced_probes": [[int(s), round(k, 3), round(n, 3)] for s, k, n in self.probes],
            }
        return {
            "displaced_share": self.probes[-1][1] / self.probes[-1][2] if self.probes else _NAN,
            "displaced_pooled_share": self.k / self.n if self.n > 0 else _NAN,
            "displaced_pooled_n": self.n,
            "displaced_z": self.stat(),
            "displaced_z_needed": self.z_crit(),
            "displaced_probes": [[int(s), round(k, 3), round(n, 3)] for s, k, n in self.probes],
        }

    def state(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "k": self.k,
            "n": self.n,
            "s2": self.s2,
            "last": [_enc(v) for v in self.last],
            "probes": [list(p) for p in self.probes],
            "fired": self.fired,
            "recent": [list(p) for p in self.recent],
            "win": None if self.win is None else list(self.win),
        }

    def load(self, d: Mapping[str, Any]) -> None:
        self.k, self.n, self.s2 = float(d["k"]), float(d["n"]), float(d["s2"])
        self.total = float(d.get("total", 0.0))
        a, b = (_dec(v) for v in d["last"])
        self.last = (a, b)
        self.probes = deque((tuple(map(float, p)) for p in d["probes"]), maxlen=4)
        self.fired = bool(d["fired"])
        self.recent.clear()  # (absent in states saved before the windows existed)
        self.recent.extend((float(k), float(n)) for k, n in d.get("recent", []))
        w = d.get("win")
        self.win = None if w is None else (float(w[0]), float(w[1]), float(w[2]), float(w[3]))


class Displacement(Check):
    """Probe and in-batch tests (``_DisplacedShare``); either fires the alert unless the other
    has already fired (one alert for one displacement). A row whose optimizer did not step
    (lr 0 in warm-up, a non-finite grad norm) displaced nothing and is no evidence either way.
    Not gated by the warm-up: the test's own minimum counts (``displaced_min_n``) are."""

    __slots__ = ("inbatch", "probe")
    kind = "displacement"

    def reset(self) -> None:
        cfg = self.config
        self.probe = _DisplacedShare(
            cfg.displaced_frac,
            cfg.displaced_z,
            cfg.displaced_memory,
            cfg.displaced_default_n,
            cfg.displaced_min_n,
            windows=cfg.displaced_windows,
            z_window=cfg.displaced_window_z,
        )
        self.inbatch = _DisplacedShare(
            cfg.displaced_frac,
            cfg.displaced_z,
            1.0,
            cfg.displaced_default_n,
            cfg.displaced_min_n,
            cfg.inbatch_half_life,
            cfg.inbatch_alpha_decay,
        )

    def update(self, s: Signals) -> list[Alert]:
        fd, inc, ink = s.frac_correct_displaced, s.inbatch_n_correct, s.inbatch_n_correct_displaced
        fin = math.isfinite
        out = NO_ALERTS
        if (
            fin(fd)
            and not (s.learning_rate == 0.0 or s.bad_grad)
            and self.probe.push(s.step, fd, s.n_correct)
            and not self.inbatch.fired
        ):
            out = [self._alert(int(s.step), self.probe)]
        if (
            fin(inc)
            and fin(ink)
            and not s.bad_grad
            and self.inbatch.push_counts(s.step, ink, inc)
            and not self.probe.fired
        ):
            alert = self._alert(int(s.step), self.inbatch)
            out = [alert] if out is NO_ALERTS else [*out, alert]
        return out

    def _alert(self, step: int, test: _DisplacedShare) -> Alert:
        return messages.displacement_alert(
            step, test.evidence(), test is self.inbatch, self.config.displaced_frac
        )

    def state_dict(self) -> dict[str, Any]:
        return {"probe": self.probe.state(), "inbatch": self.inbatch.state()}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.reset()
        self.probe.load(d["probe"])
        if "inbatch" in d:  # saved before the in-batch counts existed: start afresh
            self.inbatch.load(d["inbatch"])
