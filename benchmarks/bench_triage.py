"""Benchmark the triage of a folder of runs: ``lld-monitor analyze DIR`` on 20 mixed runs.

    python benchmarks/bench_triage.py [--runs 20]

Builds a folder of SIMULATED runs in the formats people have (our run folders, TRL output
folders with trainer_state.json, W&B history CSVs, one unreadable JSON), each 300-3000 rows
(``lld_monitor.testing.make_calibration_run``), then times the whole command as a process
(imports included), median of 3. Target (issue 29): under 10 s on the 2-core machine. Exit 1 on
a miss.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 10.0


def build(root: Path, n: int) -> int:
    from lld_monitor import columns as C
    from lld_monitor.testing import CALIBRATION_KINDS, make_calibration_run, write_run

    rows = 0
    for i in range(n - 1):
        run = make_calibration_run(CALIBRATION_KINDS[i % len(CALIBRATION_KINDS)], 900 + i)
        df = run.steps
        rows += len(df)
        if i % 3 == 0:
            write_run(run, root / f"run-{i:02d}")
        elif i % 3 == 1:
            out = root / f"trl-{i:02d}"
            out.mkdir()
            log = [
                {"step": int(r[C.STEP]), "reward": r[C.REWARD_MEAN], "grad_norm": r[C.GRAD_NORM]}
                for r in df.to_dict("records")
            ]
            (out / "trainer_state.json").write_text(json.dumps({"log_history": log}))
        else:
            lines = ["_step,train/reward,train/grad_norm,train/entropy"]
            lines += [
                f"{int(r[C.STEP])},{r[C.REWARD_MEAN]},{r[C.GRAD_NORM]},{r[C.ENTROPY]}"
                for r in df.to_dict("records")
            ]
            (root / f"wandb-{i:02d}.csv").write_text("\n".join(lines) + "\n")
    (root / "broken.json").write_text('{"log_history": [{"step": 1, ')
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    exe = Path(sys.executable).with_name("lld-monitor")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = build(root, args.runs)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = subprocess.run(
                [str(exe), "analyze", str(root)], capture_output=True, text=True, check=False
            )
            times.append(time.perf_counter() - t0)
        print(res.stdout.splitlines()[0] if res.stdout else res.stderr)
        med = statistics.median(times)
        ok = res.returncode == 0 and med <= TARGET_S
        print(
            f"triage of {args.runs} runs ({rows} rows in all, 1 unreadable): median "
            f"{med:.2f} s of {args.repeats} (min {min(times):.2f}, max {max(times):.2f}); "
            f"target <= {TARGET_S:g} s {'PASS' if ok else 'FAIL'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
