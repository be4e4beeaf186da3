"""Re-run the first updates of every stored toy run in ``sample_runs/`` and compare them step for
step with the stored run (``lld_monitor.toy.compare.steps_drift``).

    python scripts/check_sample_runs.py                      # every kept toy run, 64 updates each
    python scripts/check_sample_runs.py --updates 40 --only auto/ --json drift.json

Each run is rebuilt from its ``meta.json`` (``toy_config``, ``llds_mode``) in a fresh warm start
and trained for ``--updates + 1`` updates (the last row of a short run holds the end-of-training
probe, so it is not compared). CPU training is deterministic for one set of package versions
(``constraints.txt``) and one CPU instruction set, so a run made by today's code matches
exactly; a mismatch says the code, the versions or the machine changed since the run was made.
One line per run ("same": identical; "trajectory": every column both runs hold is equal, but the
stored run lacks columns added to the monitor since, or holds other alerts; "DIFFERS": values
differ); exit 1 when any run's values differ. The full regeneration is
``scripts/make_sample_runs.py`` (see sample_runs/README.md); this is its quick check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROOT = Path(__file__).resolve().parent.parent


def _build(cls: type, values: dict[str, Any]) -> Any:
    """A (frozen) dataclass from its ``asdict`` form; lists back to tuples where the default is."""
    kwargs = {}
    for f in fields(cls):
        if f.name not in values:
            continue
        v = values[f.name]
        default = f.default if f.default is not f.default_factory else None
        if isinstance(v, list) and isinstance(default, tuple):
            v = tuple(v)
        kwargs[f.name] = v
    return cls(**kwargs)


def toy_config_from_meta(meta: dict[str, Any], steps: int):
    """The ``ToyGRPOConfig`` a run was made with, for ``steps`` updates."""
    from dataclasses import replace

    from lld_monitor.toy.rollout import RolloutConfig
    from lld_monitor.toy.sft import SFTConfig
    from lld_monitor.toy.task import ToyTaskConfig
    from lld_monitor.toy.train import ToyGRPOConfig

    raw = dict(meta["toy_config"])
    nested = {
        "task": _build(ToyTaskConfig, raw.pop("task", {})),
        "sft": _build(SFTConfig, raw.pop("sft", {})),
        "rollout": _build(RolloutConfig, raw.pop("rollout", {})),
    }
    cfg = _build(ToyGRPOConfig, raw)
    return replace(cfg, steps=steps, **nested)


def stored_runs(root: Path, only: list[str]) -> list[Path]:
    """Every toy run folder (``meta.json`` with a ``toy_config``) under ``root``, sorted."""
    out = []
    for meta in sorted(root.rglob("meta.json")):
        rel = meta.parent.relative_to(root).as_posix()
        if only and not any(rel.startswith(o) for o in only):
            continue
        try:
            data = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if "toy_config" in data and (meta.parent / "steps.jsonl").is_file():
            out.append(meta.parent)
    return out


def check_one(run_dir: Path, updates: int) -> dict[str, Any]:
    """Re-run ``run_dir``'s first ``updates`` (+1) updates; the drift as a dict."""
    import torch

    from lld_monitor.monitor import AUTO_LLDS_KINDS
    from lld_monitor.runlog import load_run
    from lld_monitor.toy.compare import steps_drift
    from lld_monitor.toy.train import monitored_run

    meta = json.loads((run_dir / "meta.json").read_text())
    stored_rows = len(load_run(run_dir).steps)
    rows = min(updates, stored_rows - 1)
    cfg = toy_config_from_meta(meta, rows + 1)
    mode = meta.get("llds_mode", "off")
    lam = float(meta.get("config", {}).get("llds", {}).get("lam", 0.2))
    auto_on = tuple(meta.get("config", {}).get("auto_llds_on") or AUTO_LLDS_KINDS)
    threads = torch.get_num_threads()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="lld_drift_") as tmp:
        try:
            monitored_run(
                cfg,
                Path(tmp) / "run",
                llds=mode,
                lam=lam,
                progress=False,
                token_samples_per_step=0,
                auto_llds_on=auto_on,
            )
        finally:
            torch.set_num_threads(threads)
        drift = steps_drift(run_dir, Path(tmp) / "run", rows=rows)
    return {
        "run": run_dir.as_posix(),
        "rows": rows,
        "same": drift.same,
        "same_trajectory": drift.same_trajectory,
        "detail": drift.describe(),
        "seconds": round(time.time() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--root", default=str(ROOT / "sample_runs"))
    ap.add_argument("--updates", type=int, default=64, help="updates compared per run (64)")
    ap.add_argument("--only", nargs="*", default=[], help="path prefixes under the root")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args(argv)
    if args.updates < 1:
        ap.error("--updates must be >= 1")
    root = Path(args.root)
    runs = stored_runs(root, args.only)
    if not runs:
        print(f"no toy run folders under {root}", file=sys.stderr)
        return 2
    results = []
    for i, run_dir in enumerate(runs, 1):
        try:
            res = check_one(run_dir, args.updates)
        except Exception as exc:  # one broken run must not hide the others
            res = {
                "run": run_dir.as_posix(),
                "same": False,
                "same_trajectory": False,
                "detail": f"error: {exc!r}",
            }
        res["run"] = run_dir.relative_to(root).as_posix()
        results.append(res)
        mark = "same" if res["same"] else ("trajectory" if res["same_trajectory"] else "DIFFERS")
        print(f"[{i}/{len(runs)}] {mark:7} {res['run']}: {res['detail']}", flush=True)
        if args.json:  # written as it goes: nothing lost when stopped
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    n_same = sum(r["same"] for r in results)
    n_traj = sum(r["same_trajectory"] for r in results)
    print(
        f"{len(results)} stored runs: {n_same} match a re-run of their first updates exactly, "
        f"{n_traj - n_same} in every column both hold (the stored run lacks columns added since, "
        f"or the detector's alerts changed), {len(results) - n_traj} differ in their values"
    )
    return 0 if n_traj == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
