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

from lld_monitor.analysis.stats import GLR_CAL_ROWS, GLR_MIN_REF, glr_scan, series_noise_sd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=int, default=GLR_CAL_ROWS)
    p.add_argument(
        "--online",
        action="store_true",
        help="short runs: at every row, the noise from the rows so far (the check's online "
        "estimate: its error at small n is part of the false-alarm rate), the statistic of "
        "that row; GLR_SHORT_CALIBRATION is --rows 64 --online --min-ref 3",
    )
    p.add_argument(
        "--min-ref",
        type=int,
        default=GLR_MIN_REF,
        help="the least rows before a test's post-change rows (a short run: GLR_SHORT_MIN_REF)",
    )
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    peaks = np.empty(args.runs)
    for i in range(args.runs):
        x = rng.normal(0.0, 1.0, args.rows)
        if args.online:
            zs = [
                glr_scan(x[:n], series_noise_sd(x[:n], blocks=(2, 4)), min_ref=args.min_ref)[0][-1]
                for n in range(GLR_MIN_REF + 1, args.rows + 1)
            ]
            peaks[i] = np.nanmax(zs)
        else:
            z, _ = glr_scan(x, series_noise_sd(x), min_ref=args.min_ref)
            peaks[i] = np.nanmax(z)
    print(f"{args.runs} runs x {args.rows} rows in {time.perf_counter() - t0:.1f} s")
    for c in (3.0, 3.25, 3.5, 3.75, 4.0, 4.25, 4.5, 4.75, 5.0, 5.5, 6.0, 6.5):
        print(f"c={c:.2f}  P(run crosses)={np.mean(peaks >= c):.5f}")


if __name__ == "__main__":
    main()
