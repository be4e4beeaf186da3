"""Calibrate the change-in-level test's threshold by simulation (lld_monitor/analysis/stats.py).

    python scripts/calibrate_level_shift.py --runs 4000 --seed 0

Draws runs of GLR_CAL_ROWS rows of white Gaussian noise, estimates each run's noise as the check
does (``stats.series_noise_sd``: trimmed sd of the consecutive differences, the long-run sd from
2-, 4- and 8-row block means, the largest), computes the statistic at every row (``glr_scan``)
and prints, for each threshold c, the share of runs whose statistic ever crosses c: the table
``GLR_CALIBRATION`` in stats.py.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from lld_monitor.analysis.stats import GLR_CAL_ROWS, glr_scan, series_noise_sd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=int, default=GLR_CAL_ROWS)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    peaks = np.empty(args.runs)
    for i in range(args.runs):
        x = rng.normal(0.0, 1.0, args.rows)
        z, _ = glr_scan(x, series_noise_sd(x))
        peaks[i] = np.nanmax(z)
    print(f"{args.runs} runs x {args.rows} rows in {time.perf_counter() - t0:.1f} s")
    for c in (3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5):
        print(f"c={c:.1f}  P(run crosses)={np.mean(peaks >= c):.5f}")


if __name__ == "__main__":
    main()
