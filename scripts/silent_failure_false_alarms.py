"""False alarms of the silent-failure checks (issue 51: no_update, zero_grad, sampler_mismatch,
llds_inert) per 100 healthy runs, on seeds the tests do not use (97, 98): simulated healthy
kinds, the standard healthy kinds (a third short), long noisy healthy logs that rise or start near
their plateau, and short 20-60-row logs.

    .venv/bin/python scripts/silent_failure_false_alarms.py     # about a minute on 2 cores

The simulators write neither ``probe_still`` nor the sampler columns: there a 0 says only that
grad norms and the LLDS columns do not trip the checks (the stored toy runs and the shared real
logs are the real-training side: tests/analysis/test_silent_failure_checks_on_healthy_runs.py).
"""

from __future__ import annotations

import warnings

from lld_monitor.analysis import analyze_run
from lld_monitor.testing import HEALTHY_KINDS, make_suite
from lld_monitor.testing.standard import (
    CALIBRATION_HEALTHY_KINDS,
    STANDARD_HEALTHY_KINDS,
    make_calibration_run,
    make_standard_run,
    make_standard_suite,
)

SILENT_FAILURE_KINDS = {"no_update", "zero_grad", "sampler_mismatch", "llds_inert"}


def groups() -> dict[str, list]:
    """Name -> step tables of healthy runs."""
    return {
        "simulated healthy kinds, seed 97 (LLD columns, standard-only, sparse)": [
            r.steps for r in make_suite(100, 97, kinds=HEALTHY_KINDS, frac_collapse=0.0)
        ],
        "standard healthy kinds, seed 97 (a third short)": [
            r.steps for r in make_standard_suite(10, 97, kinds=STANDARD_HEALTHY_KINDS)
        ],
        "long noisy healthy logs (rise, near-plateau), seed 97": [
            make_calibration_run(k, 9700 + i).steps
            for k in CALIBRATION_HEALTHY_KINDS
            for i in range(20)
        ],
        "short standard healthy logs, seed 98": [
            make_standard_run(k, 9800 + i, short=True).steps
            for k in STANDARD_HEALTHY_KINDS
            for i in range(5)
        ],
    }


def main() -> int:
    warnings.filterwarnings("ignore")
    for name, runs in groups().items():
        hit = sum(
            1 for df in runs if any(a.kind in SILENT_FAILURE_KINDS for a in analyze_run(df).alerts)
        )
        rows = [len(d) for d in runs]
        print(
            f"{name}: {len(runs)} runs, {min(rows)}-{max(rows)} rows; runs with a "
            f"silent-failure alert: {hit} ({100 * hit / len(runs):.1f} per 100)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
