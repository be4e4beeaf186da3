"""Run every benchmark in turn (each prints its own side-by-side ratios and PASS/FAIL lines).

Usage: python benchmarks/run_all.py [--only core,runlog,...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "core",
    "runlog",
    "analyzer",
    "monitor",
    "dashboard",
    "collapse_calibration",
    "triage",
    "scale",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated names")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    failed = []
    for name in names:
        script = HERE / f"bench_{name}.py"
        print(f"\n=== {script.name} ===", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)])
        print(f"=== {script.name}: exit {rc} in {time.perf_counter() - t0:.1f} s ===", flush=True)
        if rc != 0:
            failed.append(name)
    print(f"\nbenchmarks failed: {failed}" if failed else "\nall benchmarks ran")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
