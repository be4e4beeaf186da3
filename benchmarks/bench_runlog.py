"""Run-log benchmark: write and load 100k realistic step rows; seconds per 10k rows.

Usage: python benchmarks/bench_runlog.py [--rows 100000] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time
from pathlib import Path

from lld_monitor import columns as C
from lld_monitor.runlog import RunReader, RunWriter, load_run


def realistic_row(step: int, rng: random.Random) -> dict[str, float]:
    """One step row with every canonical column (~35) and a few NaNs, as the monitor writes."""
    row: dict[str, float] = {C.STEP: step}
    for col in C.STEP_COLUMNS[2:]:
        row[col] = rng.gauss(0.0, 1.0)
    row[C.N_CORRECT] = rng.randrange(0, 64)
    row[C.N_INCORRECT] = 64 - row[C.N_CORRECT]
    row[C.LLDS_ENABLED] = int(step > 500)
    if step % 7 == 0:
        row[C.DELTA_LATER_ACTIONS] = math.nan  # no later action this step -> null
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, default=None, help="folder for the run (default: tmp)")
    args = parser.parse_args()
    n = args.rows
    rng = random.Random(0)
    rows = [realistic_row(i, rng) for i in range(n + 100)]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "bench_run"
        t0, c0 = time.perf_counter(), time.process_time()
        writer = RunWriter(path, {"config": {"bench": True}})
        for row in rows[:n]:
            writer.log_step(row)
        t_write, c_write = time.perf_counter() - t0, time.process_time() - c0

        t0, c0 = time.perf_counter(), time.process_time()
        run = load_run(path)
        t_load, c_load = time.perf_counter() - t0, time.process_time() - c0
        if len(run.steps) != n or run.steps.shape[1] != len(rows[0]) + 1:  # + time
            raise SystemExit(f"loaded {run.steps.shape}, expected {n} rows")

        reader = RunReader(path)
        reader.read_steps()  # catch up
        for row in rows[n:]:
            writer.log_step(row)
        t0 = time.perf_counter()
        tail = reader.read_steps()
        t_tail = time.perf_counter() - t0
        t0 = time.perf_counter()
        reader.read_steps()
        t_idle = time.perf_counter() - t0
        writer.close()
        if tail[C.STEP].tolist() != list(range(n, n + 100)):
            raise SystemExit("incremental read returned the wrong rows")
        size_mb = (path / "steps.jsonl").stat().st_size / 1e6

    per10k = 10_000 / n
    print(f"run log: {n} rows x {len(rows[0]) + 1} columns, steps.jsonl {size_mb:.1f} MB")
    # CPU time is printed too: wall time on a shared machine includes waiting for a core.
    print(
        f"  write (log_step, fsync every 1 s) : {t_write * per10k:.3f} s per 10k rows "
        f"(CPU {c_write * per10k:.3f} s)"
    )
    print(
        f"  full load (load_run)              : {t_load * per10k:.3f} s per 10k rows "
        f"(CPU {c_load * per10k:.3f} s; pyarrow may use several threads)"
    )
    print(f"  incremental read of last 100 rows : {t_tail * 1e3:.2f} ms (after {n} rows)")
    print(f"  incremental read, nothing new     : {t_idle * 1e6:.0f} us")
    print(f"  totals: write {t_write:.2f} s, load {t_load:.2f} s for {n} rows")


if __name__ == "__main__":
    main()
