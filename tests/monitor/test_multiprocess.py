"""Two processes (gloo, CPU) training a GRPOTrainer: exact cross-rank reduction, rank 0 writes.

Launches tests/lld_grpo_script.py with ``accelerate launch``. On a CPU-only machine
``accelerate launch --cpu --num_processes 2`` starts a single process unless mpirun is set up,
so the test uses accelerate's torchrun launcher (``--multi_gpu``) with ``ACCELERATE_USE_CPU``:
two CPU ranks on the gloo backend.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from lld_monitor import LLDMonitor, load_run
from lld_monitor import columns as C
from lld_monitor.metrics import SUM_FIELDS, displacement_sums, stats_from_sums

SCRIPT = Path(__file__).resolve().parents[1] / "lld_grpo_script.py"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out: Path, mode: str = "ok", timeout: int = 240) -> subprocess.CompletedProcess:
    accelerate = Path(sys.executable).with_name("accelerate")
    env = {
        **os.environ,
        "ACCELERATE_USE_CPU": "true",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()), str(SCRIPT), str(out), mode,
    ]  # fmt: skip
    # A hang (a rank left waiting in a collective) fails the test with TimeoutExpired.
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: Any) -> Path:
    out = tmp_path_factory.mktemp("mp")
    proc = _launch(out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _load(out: Path) -> list[dict[str, Any]]:
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]  # really two processes
    return ranks


def test_rank0_alone_writes_one_row_per_step(two_rank_run: Path) -> None:
    run = load_run(two_rank_run / "run")
    assert run.steps[C.STEP].tolist() == [1, 2, 3]
    assert list(run.events[C.EVENT_KIND]) == ["start", "attach", "end"]  # one writer
    ranks = _load(two_rank_run)
    for s0, s1 in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        row = run.steps.set_index(C.STEP).loc[s0["step"]]
        # Every rank computed the same reduced row; the file holds rank 0's.
        for key, value in s0["row"].items():
            if key in (C.TIME, C.STEP) or value is None:
                continue
            assert s1["row"][key] == pytest.approx(value, nan_ok=True), key
            assert row[key] == pytest.approx(value, nan_ok=True), key


def test_reduction_is_exact_sums_not_means_of_means(two_rank_run: Path) -> None:
    std_fields, k = LLDMonitor.sum_layout()
    n_std = len(std_fields)
    assert k == len(SUM_FIELDS)
    ranks = _load(two_rank_run)
    probed_steps = 0
    for s0, s1 in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        local = [torch.tensor(s["local"], dtype=torch.float64) for s in (s0, s1)]
        total = local[0] + local[1]
        row = s0["row"]
        # Standard columns: global sums / global counts.
        i = {name: j for j, name in enumerate(std_fields)}
        assert row[C.REWARD_MEAN] == pytest.approx(
            float(total[i["reward_sum"]] / total[i["n_rewarded"]])
        )
        assert row[C.ENTROPY] == pytest.approx(
            float(total[i["entropy_sum"]] / total[i["entropy_count"]])
        )
        if not s0["probes"]:
            continue
        probed_steps += 1
        # Each rank's local probe sums are what its own probe tensors give ...
        pooled_delta, pooled_correct = [], []
        for s, loc in zip((s0, s1), local, strict=True):
            sums = torch.zeros(k, dtype=torch.float64)
            for p in s["probes"]:
                old, new = torch.tensor(p["logp_old"]), torch.tensor(p["logp_new"])
                mask, correct = torch.tensor(p["mask"]), torch.tensor(p["correct"])
                sums += displacement_sums(
                    logp_old=old, logp_new=new, mask=mask, correct=correct
                ).double()
                keep = mask.sum(1) > 0
                pooled_delta.append(((new - old).double() * mask).sum(1)[keep])
                pooled_correct.append(correct[keep])
            torch.testing.assert_close(loc[n_std + k : n_std + 2 * k], sums, rtol=1e-6, atol=1e-6)
        # ... and the row equals the statistics of both ranks' responses pooled together.
        stats = stats_from_sums(total[n_std + k : n_std + 2 * k]).as_row()
        delta, correct = torch.cat(pooled_delta), torch.cat(pooled_correct)
        assert row[C.N_INCORRECT] == int((~correct).sum()) == stats[C.N_INCORRECT]
        if (~correct).any():
            assert row[C.DELTA_INCORRECT] == pytest.approx(float(delta[~correct].mean()), abs=1e-6)
        if correct.any():
            assert row[C.DELTA_CORRECT] == pytest.approx(float(delta[correct].mean()), abs=1e-6)
    assert probed_steps == 2  # steps 2 and 3 (train end) probed


@pytest.mark.slow
def test_failures_on_one_rank_are_recorded_and_both_ranks_train_on(tmp_path: Any) -> None:
    """Layer forwards are collectives; rank 1 fails preparing a probe and packing a step."""
    proc = _launch(tmp_path, "recover", timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = _load(tmp_path)
    for r in ranks:  # both ranks trained every step and got the same rows
        assert [s["step"] for s in r["steps"]] == [1, 2, 3, 4]
    for s0, s1 in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        for key, value in s0["row"].items():
            if key != C.TIME:
                assert s1["row"][key] == pytest.approx(value, nan_ok=True), key
    run = load_run(tmp_path / "run")
    steps = run.steps.set_index(C.STEP)
    assert list(steps.index) == [1, 2, 3, 4]
    # The first probe (step 2) was skipped on both ranks; the second (step 4) ran.
    assert C.N_CORRECT not in ranks[0]["steps"][1]["row"]
    assert C.N_CORRECT in ranks[0]["steps"][3]["row"]
    assert [len(s["probes"]) for s in ranks[1]["steps"]] == [0, 0, 0, 1]
    # Step 3 is written (from rank 0's sums) and is the row both ranks computed.
    assert ranks[0]["steps"][2]["row"][C.REWARD_MEAN] == pytest.approx(steps.loc[3, C.REWARD_MEAN])
    errors = run.events[run.events[C.EVENT_TYPE] == "error"]
    assert [(e[C.EVENT_KIND], e[C.EVENT_EVIDENCE]["ranks"]) for _, e in errors.iterrows()] == [
        ("post-update probe", [1]),
        ("end_step", [1]),
    ]
    assert "injected: preparing the probe failed" in proc.stderr  # rank 1's own log


@pytest.mark.slow
def test_failure_inside_the_probe_forward_stops_both_ranks_with_one_clear_error(
    tmp_path: Any,
) -> None:
    """Rank 1 fails between two layer collectives: no hang, the run stops with the reason."""
    proc = _launch(tmp_path, "forward", timeout=180)
    assert proc.returncode != 0
    assert "post-update probe forward failed on rank 1 of 2" in proc.stderr
    assert "injected: out of memory in the probe forward" in proc.stderr
    assert not (tmp_path / "rank0.json").exists() and not (tmp_path / "rank1.json").exists()
