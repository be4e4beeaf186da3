"""The offline change-point search (``offline._change_point``) is ruptures' ``Binseg`` with the
``linear`` cost and one break, reproduced: the same break and the same verdict as ruptures itself
on random series (steps, slopes, noise, ties, constants), and ruptures is not imported by an
analysis."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from lld_monitor.analysis.offline import _best_break, _change_point

rpt = pytest.importorskip("ruptures")


def _ruptures_break(x: np.ndarray, y: np.ndarray, min_size: int = 8) -> int:
    signal = np.column_stack([y, np.ones(len(y)), x - x[0]])
    return rpt.Binseg(model="linear", min_size=min_size, jump=1).fit(signal).predict(n_bkps=1)[0]


def _ruptures_change_point(x, y, *, min_size=8, f_min=25.0):
    """The implementation before ruptures was reproduced (``analysis/offline.py``, 5e2ef61)."""
    n = len(y)
    if n < 3 * min_size:
        return None
    signal = np.column_stack([y, np.ones(n), x - x[0]])
    algo = rpt.Binseg(model="linear", min_size=min_size, jump=1).fit(signal)
    bk = algo.predict(n_bkps=1)[0]
    if not 0 < bk < n:
        return None
    cost = algo.cost
    rss0 = cost.error(0, n)
    rss1 = cost.error(0, bk) + cost.error(bk, n)
    if rss1 <= 0.0:
        return int(x[bk]) if rss0 > 0.0 else None
    f = (rss0 - rss1) / (rss1 / (n - 4))
    return int(x[bk]) if f >= f_min else None


def _series(rng: np.random.Generator, kind: int) -> tuple[np.ndarray, np.ndarray]:
    n = int(rng.integers(24, 300))
    x = np.cumsum(rng.integers(1, 4, n)).astype(float) + float(rng.integers(0, 1000))
    k = int(rng.integers(1, n))
    if kind == 0:  # noise
        y = rng.normal(0.0, 0.05, n)
    elif kind == 1:  # a step
        y = np.r_[np.zeros(k), np.full(n - k, rng.normal(0.0, 0.3))] + rng.normal(0.0, 0.05, n)
    elif kind == 2:  # a slope from row k
        y = np.r_[np.zeros(k), -0.01 * np.arange(n - k)] + rng.normal(0.0, 0.02, n)
    elif kind == 3:  # few distinct values: many equal gains
        y = np.round(rng.normal(0.0, 1.0, n), 1)
    else:  # constant: every gain equal
        y = np.full(n, 0.5)
    return x, y + float(rng.normal(0.0, 3.0))


@pytest.mark.parametrize("kind", range(5))
def test_the_break_and_the_verdict_are_ruptures(kind):
    rng = np.random.default_rng(100 + kind)
    found = 0
    for _ in range(120):
        x, y = _series(rng, kind)
        assert _best_break(x - x[0], y, 8) == _ruptures_break(x, y)
        got = _change_point(x, y)
        assert got == _ruptures_change_point(x, y)
        found += got is not None
    if kind in (1, 2):  # (a real change is found, not only None == None)
        assert found >= 60


def test_an_analysis_does_not_import_ruptures(tmp_path):
    code = (
        "import sys\n"
        "from lld_monitor.analysis import analyze_run\n"
        "from lld_monitor.testing import make_run\n"
        "a = analyze_run(make_run('collapse', n_steps=1500, seed=3).steps)\n"
        "print(any('change point' in s.evidence.get('boundary', '') for s in a.phases),\n"
        "      'ruptures' in sys.modules, 'scipy.stats' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "False", "False"]
