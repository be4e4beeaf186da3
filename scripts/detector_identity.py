"""Record every alert and the phase per row of ``PhaseDetector`` on a fixed set of runs; diff two.

    python scripts/detector_identity.py record OUT.json [--sweep-n 1] [--roundtrip 6]
    python scripts/detector_identity.py diff BASE.json NEW.json

Used to prove that a refactor of the detector changes no alert: record on the old code, record on
the new, diff (messages and evidence included). The runs: the simulated sweep grid
(``scripts/sweep_detector.py``, seeds 1 and 2), the classic suite (``lld-monitor simulate``,
seed 2026, with the failure kinds), every log in ``../shared/real_runs`` (through
``lld_monitor.importers``, as ``lld-monitor analyze`` reads them) and every run folder under
``sample_runs/``. ``--roundtrip K``: on the first K runs of each source, also replay with a JSON
save/load of the detector after every row and record whether the alerts match the plain replay.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

REAL_RUNS = ROOT.parent / "shared" / "real_runs"
SKIP_REAL = {"README.md", "verdicts.tsv"}


def runs(sweep_n: int) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(source, name, step table) of every run, in a fixed order."""
    from sweep_detector import grid

    from lld_monitor.testing import CLASSIC_KINDS, FAILURE_KINDS, make_run, make_suite

    for seed in (1, 2):
        for i, spec in enumerate(grid(seed, n_per_cell=sweep_n, phase_steps=(30, 120, 500))):
            run = make_run(spec["kind"], seed=spec["seed"], **spec["knobs"])
            yield "sweep", f"s{seed}-{i:04d}-{spec['kind']}", run.steps
    for run in make_suite(40, 2026, kinds=CLASSIC_KINDS + FAILURE_KINDS):
        yield "classic", run.labels["name"], run.steps
    from lld_monitor.importers import load_table

    for path in sorted(REAL_RUNS.iterdir()) if REAL_RUNS.is_dir() else []:
        if path.name in SKIP_REAL or path.name.startswith("."):
            continue
        yield "real", path.name, load_table(path)
    from lld_monitor.runlog import find_runs, load_run

    for path in find_runs(ROOT / "sample_runs"):
        yield "sample", str(path.relative_to(ROOT)), load_run(path).steps


def _alert(a: Any) -> dict[str, Any]:
    return {
        "step": a.step,
        "kind": a.kind,
        "severity": a.severity,
        "message": a.message,
        "evidence": a.evidence,
    }


def _phase_runs(phases: list[str]) -> list[list[Any]]:
    """[phase, first row index] of each run of equal phases (the phase per row, compressed)."""
    out: list[list[Any]] = []
    for i, p in enumerate(phases):
        if not out or out[-1][0] != p:
            out.append([p, i])
    return out


def roundtrip_alerts(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Alerts of a replay that saves the detector to JSON and loads a new one after every row."""
    from lld_monitor.analysis.detector import PhaseDetector

    det = PhaseDetector()
    out: list[dict[str, Any]] = []
    for row in df.to_dict("records"):
        out.extend(_alert(a) for a in det.update(row))
        det = PhaseDetector.from_state_dict(json.loads(json.dumps(det.state_dict())))
    return out


def record(out_path: str, sweep_n: int, roundtrip: int) -> int:
    from lld_monitor.analysis.offline import prepare_steps, replay

    t0 = time.perf_counter()
    result: dict[str, Any] = {}
    per_source: dict[str, int] = {}
    n_alerts = 0
    bad_rt: list[str] = []
    for source, name, raw in runs(sweep_n):
        df = prepare_steps(raw)
        alerts, phases, _ = replay(df)
        rec: dict[str, Any] = {
            "rows": len(df),
            "alerts": [_alert(a) for a in alerts],
            "phases": _phase_runs(phases),
        }
        k = per_source.get(source, 0)
        if k < roundtrip:
            rt = roundtrip_alerts(df)
            same = json.dumps(rt, sort_keys=True) == json.dumps(rec["alerts"], sort_keys=True)
            if not same:
                bad_rt.append(f"{source}/{name}")
        per_source[source] = k + 1
        n_alerts += len(alerts)
        result[f"{source}/{name}"] = rec
    Path(out_path).write_text(json.dumps(result, sort_keys=True))
    print(
        f"recorded {len(result)} runs ({per_source}), {n_alerts} alerts, "
        f"{sum(r['rows'] for r in result.values())} rows in {time.perf_counter() - t0:.0f} s "
        f"-> {out_path}"
    )
    if roundtrip:
        n_rt = sum(min(v, roundtrip) for v in per_source.values())
        print(f"round trip at every row: {n_rt - len(bad_rt)}/{n_rt} runs identical {bad_rt}")
    return 1 if bad_rt else 0


def diff(base_path: str, new_path: str) -> int:
    base = json.loads(Path(base_path).read_text())
    new = json.loads(Path(new_path).read_text())
    n_diff = 0
    for key in sorted(set(base) | set(new)):
        a, b = base.get(key), new.get(key)
        if json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True):
            continue
        n_diff += 1
        if n_diff <= 10:
            print(f"DIFF {key}")
            if a is None or b is None:
                print("  missing on one side")
                continue
            for i, (x, y) in enumerate(zip(a["alerts"], b["alerts"])):
                if x != y:
                    print(f"  alert {i}: {json.dumps(x)[:300]}\n       vs: {json.dumps(y)[:300]}")
                    break
            if len(a["alerts"]) != len(b["alerts"]):
                print(f"  {len(a['alerts'])} vs {len(b['alerts'])} alerts")
            if a["phases"] != b["phases"]:
                print(f"  phases {a['phases'][:6]} vs {b['phases'][:6]}")
    n_alerts = sum(len(r["alerts"]) for r in base.values())
    print(f"{len(base)} runs, {n_alerts} alerts in the base: {n_diff} runs differ")
    return 1 if n_diff else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="replay every run, write alerts and phases to OUT")
    r.add_argument("out")
    r.add_argument("--sweep-n", type=int, default=1, help="sweep runs per grid cell (default 1)")
    r.add_argument(
        "--roundtrip", type=int, default=0, help="runs per source also checked by save/load"
    )
    d = sub.add_parser("diff", help="compare two recordings")
    d.add_argument("base")
    d.add_argument("new")
    args = p.parse_args(argv)
    if args.cmd == "record":
        return record(args.out, args.sweep_n, args.roundtrip)
    return diff(args.base, args.new)


if __name__ == "__main__":
    sys.exit(main())
