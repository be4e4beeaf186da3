"""The GPU device check (benchmarks/device_check.py) rehearsed on CPU, so that the one script a
lent GPU machine runs cannot rot between the times one is available."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.device_check
def test_the_device_check_runs_on_cpu_and_writes_every_figure(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "device_check.py"), "--device", "cpu",
         "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (written,) = tmp_path.glob("device_check_cpu_*.json")
    out = json.loads(written.read_text())
    assert out["pass"] is True and out["environment"]["device"] == "cpu"
    # LLDS: every gate x normalisation, the same value on the same tensors (CPU vs CPU: exact)
    rows = out["llds"]["rows"]
    assert {(r["gate"], r["normalize"]) for r in rows} == {
        (g, n) for g in ("action", "response", "token") for n in ("paper", "token_mean")
    }
    assert all(r["abs_diff"] == 0.0 and r["cpu"] > 0.0 for r in rows)
    tiny = out["overhead"]["tiny"]
    assert tiny["rounds"] == 1 and tiny["rounds_skipped"] == 0
    steps = tiny["median_step_s"]
    assert set(steps) == {"none", "capture", "probe", "llds"}
    assert all(0.0 < v < 60.0 for v in steps.values())
    assert set(tiny["ratios"]) == {"capture/none", "probe/none", "llds/probe"}
    for name, r in tiny["ratios"].items():
        num, den = name.split("/")
        assert r["ratio"] == pytest.approx(steps[num] / steps[den])
        assert len(r["per_round"]) == 1 and math.isfinite(r["per_round"][0])
    # the monitor's hooks ran in every monitored arm (a share of the wall time, not zero)
    assert all(0.0 < v < 1.0 for v in tiny["hook_share"].values())
    assert "peak_gib" not in tiny  # (GPU memory: only on CUDA)
    assert out["tests"]["exit"] in (0, 5) and "skipped" in out["tests"]["summary"]
    assert "LLDS cpu vs cpu" in proc.stdout and "wrote" in proc.stdout
