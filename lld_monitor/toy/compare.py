"""Two toy runs side by side (the demo's LLDS-off and automatic-LLDS arms), and the drift check
of a re-run against a stored run.

Everything here reads run folders as written by :func:`lld_monitor.toy.train.monitored_run`
(``steps.jsonl``, ``events.jsonl``, ``toy_summary.json``); nothing trains.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.runlog import load_run

#: "The reward fell": the mean reward of a rollout batch is below this share of the first
#: rollout batch's mean (the demo's stated rule; one rollout batch is the unit the reward is
#: measured on: every update of a batch logs rewards of that batch's responses).
FALL_SHARE = 0.5
#: "The reward fell from its peak" (the spiral study's rule, ``scripts/spiral_sweep.py``): the
#: mean reward of the last ``PEAK_WINDOW`` updates is below ``FALL_SHARE`` of its running peak,
#: a peak of at least ``MIN_PEAK`` (below it there is nothing to fall from). The slow spiral
#: (the d7 preset) rises for hundreds of updates before it falls, so its fall is from the peak,
#: not from the first rollout batch (whose noise the first rule also reads as falls).
PEAK_WINDOW = 96
MIN_PEAK = 0.1
#: "The off arm collapsed" (the demo's seed rule): its final sampled accuracy is below this.
COLLAPSED_ACCURACY = 0.05
#: Columns a re-run is not expected to reproduce (wall-clock time).
DRIFT_IGNORED: frozenset[str] = frozenset({C.TIME})
#: Columns the monitor began writing after the stored runs were made: a re-run may have them
#: where the stored run does not (they are compared wherever both runs have them). The toy
#: trains the same; only the row carries one more measurement.
ADDED_SINCE_STORED: frozenset[str] = frozenset({C.PROBE_STILL})


@dataclass(frozen=True)
class Arm:
    """What the comparison says of one run folder."""

    path: Path
    llds_mode: str
    steps: int
    batch: int  # optimizer updates per rollout batch
    batch_means: tuple[float, ...]  # mean reward of each rollout batch, in order
    fell_at: int | None  # first step of the first batch below FALL_SHARE x the first batch
    alerts: tuple[tuple[str, int, str], ...]  # (kind, first step, worst severity) by step
    llds_on_at: int | None
    llds_on_reason: str
    start_accuracy: float
    final_accuracy: float
    extra: dict[str, Any] = field(default_factory=dict)
    #: (first step the PEAK_WINDOW-update mean reward was below FALL_SHARE of its running peak,
    #: that peak); (None, peak) when it never was
    peak_fall: tuple[int | None, float] = (None, math.nan)


def rollout_batch_means(steps: pd.DataFrame, batch: int) -> list[float]:
    """Mean reward of each rollout batch of ``batch`` consecutive updates (the last may be
    partial); NaN rewards are left out of a batch's mean."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if steps.empty or C.REWARD_MEAN not in steps:
        return []
    r = pd.to_numeric(steps[C.REWARD_MEAN], errors="coerce").to_numpy(dtype=float)
    out = []
    for i in range(0, len(r), batch):
        chunk = r[i : i + batch]
        chunk = chunk[np.isfinite(chunk)]
        out.append(float(chunk.mean()) if chunk.size else math.nan)
    return out


def reward_fall_step(
    steps: pd.DataFrame, batch: int, share: float = FALL_SHARE
) -> tuple[int | None, list[float]]:
    """(first step of the first rollout batch whose mean reward is below ``share`` x the first
    batch's mean, the batch means); None when no batch is (or the first batch earned nothing)."""
    means = rollout_batch_means(steps, batch)
    if not means or not math.isfinite(means[0]) or means[0] <= 0:
        return None, means
    first_steps = steps[C.STEP].to_numpy()[::batch]
    for k in range(1, len(means)):
        if math.isfinite(means[k]) and means[k] < share * means[0]:
            return int(first_steps[k]), means
    return None, means


def peak_fall_step(
    steps: pd.DataFrame, window: int = PEAK_WINDOW, share: float = FALL_SHARE
) -> tuple[int | None, float]:
    """(first step whose trailing ``window``-update mean reward is below ``share`` x its running
    peak (a peak of at least ``MIN_PEAK``), the peak then); (None, the highest mean) when none
    is, or the run is shorter than ``window``."""
    if steps.empty or C.REWARD_MEAN not in steps or len(steps) < window:
        return None, math.nan
    r = pd.to_numeric(steps[C.REWARD_MEAN], errors="coerce")
    mean = r.rolling(window, min_periods=window).mean().to_numpy(dtype=float)
    peak = np.fmax.accumulate(np.where(np.isfinite(mean), mean, -np.inf))
    fallen = np.where((mean < share * peak) & (peak >= MIN_PEAK))[0]
    if not len(fallen):
        return None, float(np.nanmax(mean))
    f = int(fallen[0])
    return int(steps[C.STEP].to_numpy()[f]), float(peak[f])


_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def first_alerts(events: pd.DataFrame) -> list[tuple[str, int, str]]:
    """(kind, step of its first alert, worst severity of that kind), in order of first step."""
    if events.empty or C.EVENT_TYPE not in events:
        return []
    alerts = events[events[C.EVENT_TYPE] == "alert"]
    first: dict[str, list[Any]] = {}
    for _, ev in alerts.iterrows():
        kind, sev = str(ev[C.EVENT_KIND]), str(ev.get(C.EVENT_SEVERITY, "warning"))
        if kind not in first:
            first[kind] = [int(ev[C.EVENT_STEP]), sev]
        elif _SEVERITY_RANK.get(sev, 1) > _SEVERITY_RANK.get(first[kind][1], 1):
            first[kind][1] = sev
    return [(k, s, sev) for k, (s, sev) in sorted(first.items(), key=lambda kv: kv[1][0])]


def llds_switch(events: pd.DataFrame) -> tuple[int | None, str]:
    """(step at which the monitor switched LLDS on, the alert kind that did it)."""
    if events.empty or C.EVENT_TYPE not in events:
        return None, ""
    on = events[(events[C.EVENT_TYPE] == "intervention") & (events[C.EVENT_KIND] == "llds_enable")]
    if on.empty:
        return None, ""
    evidence = on[C.EVENT_EVIDENCE].iloc[0]
    reason = str(evidence.get("reason", "")) if isinstance(evidence, dict) else ""
    kind = reason.split(" on a ")[-1].split(" alert")[0] if " on a " in reason else reason
    return int(on[C.EVENT_STEP].iloc[0]), kind


def read_arm(path: str | Path) -> Arm:
    """Summarise one toy run folder (its log, events and ``toy_summary.json``)."""
    path = Path(path)
    run = load_run(path)
    summary_file = path / "toy_summary.json"
    if not summary_file.is_file():
        raise FileNotFoundError(f"{path}: no toy_summary.json (not a finished toy run)")
    summary = json.loads(summary_file.read_text())
    cfg = summary.get("config", {})
    batch = int(cfg.get("steps_per_generation", 1)) * int(cfg.get("num_iterations", 1))
    fell, means = reward_fall_step(run.steps, batch)
    on_at, reason = llds_switch(run.events)
    return Arm(
        path=path,
        llds_mode=str(summary.get("llds_mode", "?")),
        steps=len(run.steps),
        batch=batch,
        batch_means=tuple(means),
        fell_at=fell,
        alerts=tuple(first_alerts(run.events)),
        llds_on_at=on_at,
        llds_on_reason=reason,
        start_accuracy=float(summary["start_eval"]["accuracy"]),
        final_accuracy=float(summary["final_eval"]["accuracy"]),
        peak_fall=peak_fall_step(run.steps),
    )


def _alerts_text(arm: Arm) -> str:
    if not arm.alerts:
        return "none"
    return ", ".join(
        f"{kind} {step}" + (" (critical)" if sev == "critical" else "")
        for kind, step, sev in arm.alerts
    )


def _fell_text(arm: Arm) -> str:
    if arm.fell_at is None:
        return "did not fall"
    k = (arm.fell_at - 1) // arm.batch
    return (
        f"step {arm.fell_at} (rollout-batch mean {arm.batch_means[0]:.2f} -> "
        f"{arm.batch_means[k]:.2f})"
    )


def _peak_fall_text(arm: Arm) -> str:
    step, peak = arm.peak_fall
    if step is not None:
        return f"step {step} ({PEAK_WINDOW}-update mean below half its peak {peak:.2f})"
    if arm.steps < PEAK_WINDOW:
        return f"(a run shorter than {PEAK_WINDOW} updates)"
    return f"did not fall (its {PEAK_WINDOW}-update mean peaked at {peak:.2f})"


def comparison_text(off: Arm, auto: Arm) -> str:
    """The demo's two-arm comparison: one block per arm, then a verdict line."""
    blocks = []
    for title, arm in (("LLDS off", off), ("automatic LLDS", auto)):
        if arm.llds_on_at is not None:
            llds = f"switched on at step {arm.llds_on_at} ({arm.llds_on_reason} alert)"
        elif arm.llds_mode == "auto":
            llds = "never switched on (no trigger alert)"
        else:
            llds = arm.llds_mode
        lines = [
            f"reward fell:       {_fell_text(arm)}",
            f"from its peak:     {_peak_fall_text(arm)}",
            f"alerts:            {_alerts_text(arm)}",
            f"LLDS:              {llds}",
            f"sampled accuracy:  {arm.start_accuracy:.2f} -> {arm.final_accuracy:.2f}",
        ]
        blocks.append(f"{title}\n" + "\n".join("  " + line for line in lines))
    return "\n".join(blocks) + "\n" + verdict_line(off, auto)


def verdict_line(off: Arm, auto: Arm) -> str:
    """One sentence: did the alert come before the fall (a rollout batch below half of the
    first's; and from the peak of the smoothed reward), and did automatic LLDS help."""
    parts = []
    first = off.alerts[0] if off.alerts else None
    if off.fell_at is None:
        parts.append("no rollout batch of the LLDS-off run fell below half of the first batch's")
    elif first is None:
        parts.append(f"the reward fell at step {off.fell_at} with no alert at all")
    elif first[1] < off.fell_at:
        parts.append(
            f"the first alert ({first[0]}, step {first[1]}) came "
            f"{off.fell_at - first[1]} steps before the reward fell"
        )
    else:
        parts.append(
            f"the first alert ({first[0]}, step {first[1]}) came only after the reward "
            f"fell (step {off.fell_at})"
        )
    peak = off.peak_fall[0]  # the slow spiral's fall: from the peak of the smoothed reward
    if peak is not None and first is not None and first[1] < peak:
        parts.append(
            f"from its peak the reward fell at step {peak}, {peak - first[1]} steps after the "
            "first alert"
        )
    elif peak is not None:
        parts.append(f"from its peak the reward fell at step {peak}, with no alert before it")
    diff = auto.final_accuracy - off.final_accuracy
    if auto.llds_on_at is None:
        parts.append("automatic LLDS never switched on")
    else:
        parts.append(
            f"with LLDS switched on at step {auto.llds_on_at} the run ended at "
            f"{auto.final_accuracy:.2f} against {off.final_accuracy:.2f} ({diff:+.2f})"
        )
    return "verdict: " + "; ".join(parts) + "."


# --- drift: a re-run against a stored run ------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    """Where a re-run departs from the stored run (empty ``columns`` and ``events``: none)."""

    rows_compared: int
    columns: dict[str, int]  # column -> first step whose value differs
    missing_columns: tuple[str, ...]
    events: tuple[str, ...]  # alert / intervention events present in one run only

    @property
    def same(self) -> bool:
        return not self.columns and not self.missing_columns and not self.events

    @property
    def same_trajectory(self) -> bool:
        """Every column both runs hold is equal: the training is the same, even if one run
        holds columns the other lacks (added to the monitor since) or other alerts (the
        detector changed since)."""
        return not self.columns

    def describe(self) -> str:
        if self.same:
            return f"identical over {self.rows_compared} rows"
        parts = [f"first differing step of {c}: {s}" for c, s in sorted(self.columns.items())]
        if self.missing_columns:
            parts.append("columns in one run only: " + ", ".join(self.missing_columns))
        parts += [f"event in one run only: {e}" for e in self.events]
        return f"differs over {self.rows_compared} rows: " + "; ".join(parts)


def _event_keys(events: pd.DataFrame, max_step: int) -> set[str]:
    if events.empty or C.EVENT_TYPE not in events:
        return set()
    keep = events[events[C.EVENT_TYPE].isin(["alert", "intervention"])]
    keys = set()
    for _, ev in keep.iterrows():
        step = ev[C.EVENT_STEP]
        if step is None or (isinstance(step, float) and math.isnan(step)) or step > max_step:
            continue
        keys.add(f"{ev[C.EVENT_TYPE]} {ev[C.EVENT_KIND]} at step {int(step)}")
    return keys


def steps_drift(
    stored: str | Path, rerun: str | Path, rows: int | None = None, rtol: float = 0.0
) -> Drift:
    """Compare the first ``rows`` rows (default: all of the shorter run) of two run folders,
    column by column (``rtol`` 0: exact, NaN equal to NaN), and their alert and intervention
    events up to the last compared step. CPU training of the toy is deterministic for one
    machine and one set of package versions, so a stored run and its re-run agree exactly."""
    a, b = load_run(stored), load_run(rerun)
    n = min(len(a.steps), len(b.steps)) if rows is None else rows
    if len(a.steps) < n or len(b.steps) < n:
        raise ValueError(
            f"cannot compare {n} rows: the runs have {len(a.steps)} and {len(b.steps)}"
        )
    sa, sb = a.steps.iloc[:n].reset_index(drop=True), b.steps.iloc[:n].reset_index(drop=True)
    # a column that holds nothing in the compared rows is the same as an absent one
    ca = {c for c in sa.columns if sa[c].notna().any()} - DRIFT_IGNORED
    cb = {c for c in sb.columns if sb[c].notna().any()} - DRIFT_IGNORED
    differing: dict[str, int] = {}
    for col in sorted(ca & cb):
        x = pd.to_numeric(sa[col], errors="coerce").to_numpy(dtype=float)
        y = pd.to_numeric(sb[col], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isclose(x, y, rtol=rtol, atol=0.0, equal_nan=True)
        if bad.any():
            differing[col] = int(sa[C.STEP].iloc[int(bad.argmax())])
    last = int(sa[C.STEP].iloc[-1]) if n else 0
    ea, eb = _event_keys(a.events, last), _event_keys(b.events, last)
    return Drift(
        rows_compared=n,
        columns=differing,
        missing_columns=tuple(sorted((ca ^ cb) - (ADDED_SINCE_STORED - ca))),
        events=tuple(sorted(f"{k} ({'stored' if k in ea else 're-run'})" for k in ea ^ eb)),
    )
