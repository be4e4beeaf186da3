"""Sweep the detector and the two baselines over the widened simulator's grid; markdown tables.

    python scripts/sweep_detector.py --seed 1 [--n-per-cell 2] [--json OUT] [--jobs 1]
        [--config key=value ...] [--phase-steps 30,60,...] [--log-every ...] [--probe-every ...]
        [--rows-per-batch ...] [--noise low,medium,high] [--kinds collapse,healthy,...] [--full]

Every run is SIMULATED (``lld_monitor.testing.make_run``). The grid crosses phase length
(``phase_steps``: the mean stagnation length; decay lasts about as long, collapse to half reward
0.4-1.0 of it), log interval, noise level and kind (collapse and every healthy kind). Probe interval
and rows per rollout batch are assigned to the cells at random, every (probe interval, rows per
batch) pair equally often per kind, unless ``--full`` crosses them too. ``--n-per-cell`` runs per
cell, collapsing cells ``--collapse-weight`` times as many. Knobs not on the grid (AR(1)
coefficient, noise sd within the level, probed batch size, phase II decline, displaced share) are
drawn per run from ``--seed``.
``small_batch`` runs are always high noise (4-8 responses probed), whatever their cell's level.

Scores (``lld_monitor.analysis.evaluation.score_run``): early warning = a stagnation, decay or
displacement alert strictly before phase III (``collapse_start``), its normalised lead
``(collapse_start - first) / collapse_start``; lead = the classic score (any LLD warning before
``collapse_step``, normalised by it); false alarm = a healthy run with ANY LLD alert (stagnation,
decay, displacement, collapse). The baselines only emit ``collapse`` alerts: they never warn early.
"plain" collapsing runs: a least-squares line through ``logp_correct`` over the true phase II has
t <= -8 (the decline is plain in hindsight).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from lld_monitor import columns as C
from lld_monitor.analysis.baselines import GradSpikeDetector, RewardDropDetector
from lld_monitor.analysis.config import SECTIONS
from lld_monitor.analysis.detector import DetectorConfig, PhaseDetector
from lld_monitor.analysis.evaluation import LLD_ALERT_KINDS, run_detector, score_run
from lld_monitor.testing import COLLAPSE_KINDS, HEALTHY_KINDS, NOISE_LEVELS, make_run, wide_knobs

PHASE_STEPS: tuple[int, ...] = (30, 60, 120, 250, 500, 1000)
LOG_EVERY: tuple[int, ...] = (1, 2, 5, 10)
PROBE_EVERY: tuple[int, ...] = (1, 2, 4, 8)
ROWS_PER_BATCH: tuple[int, ...] = (1, 2, 4, 8)
NOISE: tuple[str, ...] = tuple(NOISE_LEVELS)
KINDS: tuple[str, ...] = COLLAPSE_KINDS + HEALTHY_KINDS
DETECTOR_NAMES: tuple[str, ...] = ("ours", "grad_spike", "reward_drop")
# evidence of our LLD alerts kept in the records (``--json``: what raised a false alarm)
ALERT_EVIDENCE: tuple[str, ...] = (
    "trend_level",
    "logp_t",
    "logp_t_crit",
    "logp_change",
    "window_steps",
    "reward_t",
    "reward_fall_frac",
)
PLAIN_T = -8.0  # hindsight t of the phase II slope below which a decline is "plain"


def parse_config(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` strings -> ``DetectorConfig`` overrides, typed like the setting's default;
    a section's setting as ``section.name`` (``level_shift.p_false_run=0.01``)."""
    base = DetectorConfig()
    names = [f.name for f in dataclasses.fields(DetectorConfig) if f.name not in SECTIONS]
    names += [f"{sec}.{f.name}" for sec, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in names:
            raise ValueError(f"--config {item!r}: want key=value with key one of {sorted(names)}")
        section, dot, name = key.partition(".")
        default = getattr(getattr(base, section), name) if dot else getattr(base, key)
        try:
            if isinstance(default, bool):
                value: Any = raw.strip().lower() in ("1", "true", "yes", "on")
            elif isinstance(default, int):
                value = int(raw)
            elif isinstance(default, float):
                value = float(raw)
            elif isinstance(default, tuple):
                value = tuple(int(v) for v in raw.split(","))
            else:
                value = raw
        except ValueError as exc:
            raise ValueError(f"--config {item!r}: {exc}") from exc
        out[key] = value
    base.with_overrides(**out)  # the config's own checks, with its own message
    return out


def grid(
    seed: int,
    *,
    n_per_cell: int = 2,
    collapse_weight: int = 2,
    phase_steps: Sequence[int] = PHASE_STEPS,
    log_every: Sequence[int] = LOG_EVERY,
    probe_every: Sequence[int] = PROBE_EVERY,
    rows_per_batch: Sequence[int] = ROWS_PER_BATCH,
    noise: Sequence[str] = NOISE,
    kinds: Sequence[str] = KINDS,
    full: bool = False,
) -> list[dict[str, Any]]:
    """One spec per run: ``{"kind", "seed", "knobs"}`` (``make_run`` keywords), in grid order."""
    specs: list[dict[str, Any]] = []
    combos = list(itertools.product(phase_steps, log_every, noise))
    pairs = list(itertools.product(probe_every, rows_per_batch))
    # without --full: per kind, every (probe interval, rows per batch) pair equally often (up to
    # one), in a random order over the cells
    assign: dict[str, list[tuple[int, int]]] = {}
    for i, kind in enumerate(kinds):
        reps = n_per_cell * (collapse_weight if kind in COLLAPSE_KINDS else 1)
        need = len(combos) * reps
        order = pairs * (need // len(pairs) + 1)
        rng = np.random.default_rng([int(seed), i, 0x1A7])
        head = [order[k] for k in rng.permutation(len(pairs) * (need // len(pairs)))]
        tail = [pairs[k] for k in rng.permutation(len(pairs))[: need % len(pairs)]]
        assign[kind] = head + tail
        rng.shuffle(assign[kind])
    for c, (p, le, nl) in enumerate(combos):
        inner: list[Any] = pairs if full else [None]
        for kind in kinds:
            reps = n_per_cell * (collapse_weight if kind in COLLAPSE_KINDS else 1)
            for cell_inner in inner:
                for j in range(reps):
                    pe, r = cell_inner if cell_inner is not None else assign[kind][c * reps + j]
                    run_seed = len(specs)
                    rng = np.random.default_rng([int(seed), run_seed, 0x5CE])
                    fixed: dict[str, Any] = {
                        "phase_steps": p,
                        "log_every": le,
                        "probe_every": pe,
                        "rows_per_batch": r,
                    }
                    if kind != "small_batch":
                        fixed["noise_level"] = nl
                    knobs = wide_knobs(rng, kind, **fixed)
                    specs.append(
                        {"kind": kind, "seed": int(seed) * 1_000_003 + run_seed, "knobs": knobs}
                    )
    return specs


def phase2_t(steps: Any, labels: dict[str, Any]) -> float | None:
    """t statistic of the least-squares slope of ``logp_correct`` over the true phase II rows."""
    start, end = labels.get("decay_start"), labels.get("collapse_start")
    if start is None or end is None or C.LOGP_CORRECT not in steps.columns:
        return None
    s = steps[(steps[C.STEP] >= start) & (steps[C.STEP] < end)]
    x = s[C.STEP].to_numpy(float)
    y = s[C.LOGP_CORRECT].to_numpy(float)
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 4 or np.ptp(x) == 0:
        return None
    xc = x - x.mean()
    slope = float((xc * (y - y.mean())).sum() / (xc * xc).sum())
    resid = y - y.mean() - slope * xc
    se = math.sqrt(float((resid * resid).sum()) / (len(x) - 2) / float((xc * xc).sum()))
    return slope / se if se > 0 else -math.inf if slope < 0 else math.inf


def run_one(spec: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Generate one run, score the three detectors on it: a plain-JSON record."""
    run = make_run(spec["kind"], seed=spec["seed"], **spec["knobs"])
    lab = run.labels
    factories: dict[str, Callable[[], Any]] = {
        "ours": functools.partial(PhaseDetector, **overrides),
        "grad_spike": GradSpikeDetector,
        "reward_drop": RewardDropDetector,
    }
    scores = {}
    lld_alerts: list[dict[str, Any]] = []
    other_alerts: dict[str, int] = {}
    for name, factory in factories.items():
        alerts = run_detector(factory(), run.steps)
        s = score_run(name, alerts, lab)
        if name == "ours":
            lld_alerts = [
                {
                    "step": a.step,
                    "kind": a.kind,
                    "message": a.message,
                    **{k: a.evidence.get(k) for k in ALERT_EVIDENCE if k in a.evidence},
                }
                for a in alerts
                if a.kind in LLD_ALERT_KINDS
            ]
            for a in alerts:
                if a.kind not in LLD_ALERT_KINDS:
                    other_alerts[a.kind] = other_alerts.get(a.kind, 0) + 1
        scores[name] = {
            "early_warning": s.early_warning,
            "early_lead": s.early_lead,
            "first_early": s.first_early,
            "caught_before": s.caught_before,
            "lead": s.lead,
            "first_warning": s.first_warning,
            "false_alarm_any": s.false_alarm_any,
            "false_alarm": s.false_alarm,
        }
    t = phase2_t(run.steps, lab)
    return {
        "kind": spec["kind"],
        "seed": spec["seed"],
        "knobs": spec["knobs"],
        "collapse": lab["collapse_step"] is not None,
        "phase_steps": spec["knobs"]["phase_steps"],
        "log_every": lab["log_every"],
        "probe_every": lab["probe_every"],
        "rows_per_batch": lab["rows_per_batch"],
        "noise": lab["noise_level"],
        "n_steps": lab["n_steps"],
        "n_rows": len(run.steps),
        "decay_start": lab["decay_start"],
        "collapse_start": lab["collapse_start"],
        "collapse_step": lab["collapse_step"],
        "phase2_t": None if t is None else round(t, 3),
        "plain": None if t is None else bool(t <= PLAIN_T),
        "scores": scores,
        "lld_alerts": lld_alerts,  # our detector's LLD alerts (what a false alarm was)
        "other_alerts": other_alerts,  # our non-LLD alerts (spike, kl_blowup, ...): kind -> count
    }


def sweep(
    specs: Sequence[dict[str, Any]], overrides: dict[str, Any], jobs: int = 1
) -> list[dict[str, Any]]:
    """Records of every spec, in order; ``jobs`` > 1 uses a process pool."""
    work = functools.partial(run_one, overrides=overrides)
    if jobs <= 1:
        return [work(s) for s in specs]
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(jobs) as pool:
        return list(pool.imap(work, specs, chunksize=8))


# --- tables ----------------------------------------------------------------------------------


def _rate(k: int, n: int) -> str:
    return f"{k}/{n} ({100.0 * k / n:.0f}%)" if n else "-"


def _median(xs: Iterable[float | None]) -> str:
    vals = [x for x in xs if x is not None]
    return f"{statistics.median(vals):.3f}" if vals else "-"


def figures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts and medians of one group of records (JSON)."""
    col = [r for r in records if r["collapse"]]
    neg = [r for r in records if not r["collapse"]]
    out: dict[str, Any] = {"n_collapse": len(col), "n_healthy": len(neg)}
    for d in DETECTOR_NAMES:
        early = [r["scores"][d]["early_lead"] for r in col]
        leads = [r["scores"][d]["lead"] for r in col]
        out[d] = {
            "early_warning": sum(r["scores"][d]["early_warning"] for r in col),
            "median_early_lead": statistics.median(early) if early else None,
            "caught_before": sum(r["scores"][d]["caught_before"] for r in col),
            "median_lead": statistics.median(leads) if leads else None,
            "false_alarm_runs": sum(r["scores"][d]["false_alarm_any"] for r in neg),
        }
    return out


AXES: tuple[tuple[str, str], ...] = (
    ("phase_steps", "phase length (steps)"),
    ("log_every", "log interval (steps)"),
    ("probe_every", "probe interval (rollout batches)"),
    ("rows_per_batch", "rows per rollout batch"),
    ("noise", "noise level"),
    ("kind", "kind"),
    ("plain", "phase II decline plain in hindsight (t <= -8)"),
)


def table(records: Sequence[dict[str, Any]], key: str | None, title: str) -> str:
    """One markdown table: a row per level of ``key`` (or one overall row)."""
    head = (
        f"| {title} | collapsing runs | ours: early warning | ours: median early lead "
        "| ours: caught before collapse | ours: median lead | grad_spike: median lead "
        "| reward_drop: median lead | healthy runs | ours: false-alarm runs "
        "| grad_spike: false-alarm runs | reward_drop: false-alarm runs |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    if key is None:
        groups: list[tuple[Any, list[dict[str, Any]]]] = [("all", list(records))]
    else:
        levels = sorted(
            {r[key] for r in records if r[key] is not None},
            key=lambda v: (
                (NOISE.index(v) if v in NOISE else KINDS.index(v) if v in KINDS else 0, str(v))
                if isinstance(v, str)
                else (v, "")
            ),
        )
        groups = [(v, [r for r in records if r[key] == v]) for v in levels]
    for level, rs in groups:
        col = [r for r in rs if r["collapse"]]
        neg = [r for r in rs if not r["collapse"]]

        def sc(d: str, f: str, rows: Sequence[dict[str, Any]]) -> list[Any]:
            return [r["scores"][d][f] for r in rows]

        cells = [
            str(level),
            str(len(col)),
            _rate(sum(sc("ours", "early_warning", col)), len(col)),
            _median(sc("ours", "early_lead", col)),
            _rate(sum(sc("ours", "caught_before", col)), len(col)),
            _median(sc("ours", "lead", col)),
            _median(sc("grad_spike", "lead", col)),
            _median(sc("reward_drop", "lead", col)),
            str(len(neg)),
            *(_rate(sum(sc(d, "false_alarm_any", neg)), len(neg)) for d in DETECTOR_NAMES),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(records: Sequence[dict[str, Any]], header: str) -> str:
    """The markdown report: the overall figures, then one table per axis."""
    parts = [header, "", "### Overall", "", table(records, None, "runs")]
    for key, title in AXES:
        parts += ["", f"### By {title}", "", table(records, key, title)]
    return "\n".join(parts) + "\n"


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _words(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True, help="seed of the sweep (tune on one)")
    ap.add_argument("--n-per-cell", type=int, default=2, help="runs per grid cell (default 2)")
    ap.add_argument(
        "--collapse-weight",
        type=int,
        default=2,
        help="collapsing cells hold this many times --n-per-cell runs (default 2)",
    )
    ap.add_argument("--json", metavar="OUT", help="also write the per-run records and figures")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a DetectorConfig override for our detector (repeatable)",
    )
    ap.add_argument("--phase-steps", type=_ints, default=PHASE_STEPS)
    ap.add_argument("--log-every", type=_ints, default=LOG_EVERY)
    ap.add_argument("--probe-every", type=_ints, default=PROBE_EVERY)
    ap.add_argument("--rows-per-batch", type=_ints, default=ROWS_PER_BATCH)
    ap.add_argument("--noise", type=_words, default=NOISE)
    ap.add_argument("--kinds", type=_words, default=KINDS)
    ap.add_argument(
        "--full", action="store_true", help="cross probe interval and rows per batch too (x16)"
    )
    args = ap.parse_args(argv)
    try:
        overrides = parse_config(args.config)
        bad = [k for k in args.kinds if k not in KINDS]
        bad += [n for n in args.noise if n not in NOISE]
        if bad:
            raise ValueError(f"unknown kinds / noise levels {bad}; use {KINDS} and {NOISE}")
        axes = (args.phase_steps, args.log_every, args.probe_every, args.rows_per_batch)
        if min(args.n_per_cell, args.collapse_weight, args.jobs) < 1 or not all(axes):
            raise ValueError("--n-per-cell, --collapse-weight, --jobs and every axis need >= 1")
        if min(min(a) for a in axes) < 1:
            raise ValueError("every level of an axis must be >= 1")
    except ValueError as exc:
        print(f"sweep_detector: {exc}", file=sys.stderr)
        return 2
    specs = grid(
        args.seed,
        n_per_cell=args.n_per_cell,
        collapse_weight=args.collapse_weight,
        phase_steps=args.phase_steps,
        log_every=args.log_every,
        probe_every=args.probe_every,
        rows_per_batch=args.rows_per_batch,
        noise=args.noise,
        kinds=args.kinds,
        full=args.full,
    )
    t0 = time.perf_counter()
    records = sweep(specs, overrides, jobs=args.jobs)
    wall = time.perf_counter() - t0
    rows = sum(r["n_rows"] for r in records)
    cfg = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "default"
    header = (
        f"## Detector sweep, seed {args.seed} (SIMULATED runs)\n\n"
        f"{len(records)} runs ({sum(r['collapse'] for r in records)} collapsing), {rows} rows, "
        f"PhaseDetector config: {cfg}; {wall:.0f} s with {args.jobs} job(s).\n"
        "Early warning: stagnation/decay/displacement alert strictly before phase III, lead "
        "(collapse_start - first) / collapse_start; lead: any LLD warning before the collapse "
        "step, (collapse_step - first) / collapse_step, 0 when none; false-alarm runs: healthy "
        "runs with any stagnation/decay/displacement/collapse alert."
    )
    print(report(records, header), end="")
    if args.json:
        groups: dict[str, Any] = {"overall": figures(records)}
        for key, _ in AXES:
            levels = sorted({str(r[key]) for r in records if r[key] is not None})
            groups[key] = {v: figures([r for r in records if str(r[key]) == v]) for v in levels}
        doc = {
            "seed": args.seed,
            "config": overrides,
            "n_runs": len(records),
            "n_rows": rows,
            "wall_s": round(wall, 2),
            "figures": groups,
            "runs": records,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
