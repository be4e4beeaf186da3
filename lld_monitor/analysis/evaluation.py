"""Scoring detectors on labelled runs: early warning of collapses and false alarms.

One scorer for every detector (ours and the baselines): each gives ``Alert`` lists, scored
against the labels written by ``lld_monitor.testing``:
- a collapse is *caught before it happens* when a warning alert fires before ``collapse_step``;
- normalised lead = ``(collapse_step - first_warning_step) / collapse_step`` when caught before,
  0 otherwise (caught late or never: no lead);
- a *false alarm* run is a run that does not collapse (no ``collapse_step``, no non-LLD failure)
  but gets an alert of kind ``decay`` or ``collapse``;
- an *early warning* is a ``stagnation``, ``decay`` or ``displacement`` alert strictly before
  ``collapse_start`` (the onset of phase III, while the reward still rises); its normalised lead
  is ``(collapse_start - first_early_step) / collapse_start``, 0 when there is none;
- a *false-alarm run (any)* is a run that does not collapse but gets an alert of ANY LLD kind
  (``stagnation``, ``decay``, ``displacement`` or ``collapse``): the target is at most 1 in 50.

Alerts not specific to LLD (``reward_decline``, ``kl_blowup``, ``nonfinite``, ...) are neither
warnings nor false alarms here.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lld_monitor.analysis.baselines import GradSpikeDetector, RewardDropDetector
from lld_monitor.analysis.detector import PhaseDetector
from lld_monitor.analysis.offline import prepare_steps, replay
from lld_monitor.events import Alert

#: detector name -> factory; every object has ``update(row) -> list[Alert]``
DETECTORS: dict[str, Callable[[], Any]] = {
    "ours": PhaseDetector,
    "grad_spike": GradSpikeDetector,
    "reward_drop": RewardDropDetector,
}
#: alert kinds that count as a warning of the death spiral
WARNING_KINDS: frozenset[str] = frozenset({"stagnation", "decay", "displacement", "collapse"})
#: alert kinds that are false alarms on a run that does not collapse
FALSE_KINDS: frozenset[str] = frozenset({"decay", "collapse"})
#: alert kinds that warn early, in phase I or II (scored before ``collapse_start``)
EARLY_KINDS: frozenset[str] = frozenset({"stagnation", "decay", "displacement"})
#: every LLD alert kind: any of them on a healthy run is a false alarm (``false_alarm_any``)
LLD_ALERT_KINDS: frozenset[str] = EARLY_KINDS | {"collapse"}


@dataclass(frozen=True)
class RunScore:
    """One detector on one labelled run."""

    detector: str
    run: str
    kind: str
    standard_only: bool
    collapse_step: int | None
    first_warning: int | None
    caught_before: bool
    lead: float | None  # normalised lead (collapse runs only)
    false_alarm: bool
    failure_flagged: bool | None = None  # non-LLD failure runs: its own alert kind fired
    collapse_start: int | None = None  # onset of phase III (label)
    first_early: int | None = None  # first stagnation / decay / displacement alert
    early_warning: bool = False  # ... strictly before collapse_start
    early_lead: float | None = None  # (collapse_start - first_early) / collapse_start, or 0
    false_alarm_any: bool = False  # a healthy run with any LLD alert


@dataclass(frozen=True)
class Summary:
    """One detector over a set of runs."""

    detector: str
    n_collapse: int
    caught_before: int
    median_lead: float | None
    n_negative: int  # runs that neither collapse nor fail otherwise
    false_alarm_runs: int
    by_group: dict[str, dict[str, Any]] = field(default_factory=dict)
    n_failure: int = 0  # runs with a non-LLD failure (nonfinite, dead_signal, ...)
    failures_flagged: int = 0  # ... whose own alert kind fired at or after the failure step
    early_warning: int = 0  # collapse runs warned before phase III
    median_early_lead: float | None = None
    false_alarm_any_runs: int = 0  # healthy runs with any LLD alert


@dataclass(frozen=True)
class Evaluation:
    """Scores of every detector: ``summaries`` by name and every ``RunScore``."""

    summaries: dict[str, Summary]
    scores: list[RunScore]

    def to_dict(self) -> dict[str, Any]:
        return {
            "detectors": {k: asdict(v) for k, v in self.summaries.items()},
            "runs": [asdict(s) for s in self.scores],
        }

    def table(self) -> str:
        """A plain-text table, one line per detector."""
        head = (
            f"{'detector':<12} {'caught before':>14} {'median lead':>12} "
            f"{'false-alarm runs':>17} {'early warning':>14} {'early lead':>11} "
            f"{'any-LLD-alert runs':>19}   LLD cols / standard only: caught, median lead"
        )
        lines = [head, "-" * len(head)]
        n_fail = max((s.n_failure for s in self.summaries.values()), default=0)
        for s in self.summaries.values():
            lead = "n/a" if s.median_lead is None else f"{s.median_lead:.3f}"
            early = "n/a" if s.median_early_lead is None else f"{s.median_early_lead:.3f}"
            groups = "; ".join(
                f"{g}: {v['caught_before']}/{v['n_collapse']}, "
                f"{'n/a' if v['median_lead'] is None else format(v['median_lead'], '.3f')}"
                for g, v in s.by_group.items()
            )
            lines.append(
                f"{s.detector:<12} {f'{s.caught_before}/{s.n_collapse}':>14} {lead:>12} "
                f"{f'{s.false_alarm_runs}/{s.n_negative}':>17} "
                f"{f'{s.early_warning}/{s.n_collapse}':>14} {early:>11} "
                f"{f'{s.false_alarm_any_runs}/{s.n_negative}':>19}   {groups}"
            )
        if n_fail:
            lines.append(
                "non-LLD failure runs flagged with their own kind: "
                + ", ".join(
                    f"{s.detector} {s.failures_flagged}/{s.n_failure}"
                    for s in self.summaries.values()
                )
            )
        return "\n".join(lines)


def run_detector(detector: Any, steps: pd.DataFrame) -> list[Alert]:
    """All alerts of ``detector`` over the rows of ``steps`` (sorted, one row per step)."""
    df = prepare_steps(steps)
    if isinstance(detector, PhaseDetector):
        return replay(df, detector)[0]
    alerts: list[Alert] = []
    for rec in df.to_dict("records"):
        alerts.extend(detector.update(rec))
    return alerts


def score_run(
    detector: str, alerts: Sequence[Alert], labels: Mapping[str, Any], run: str = ""
) -> RunScore:
    """Score one run's alerts against its labels."""
    collapse = labels.get("collapse_step")
    warnings = sorted(a.step for a in alerts if a.kind in WARNING_KINDS)
    first = warnings[0] if warnings else None
    caught = collapse is not None and first is not None and first < collapse
    lead = None
    if collapse is not None:
        lead = (collapse - first) / collapse if caught else 0.0
    failure = labels.get("failure")
    negative = collapse is None and not failure
    false_alarm = negative and any(a.kind in FALSE_KINDS for a in alerts)
    false_any = negative and any(a.kind in LLD_ALERT_KINDS for a in alerts)
    start = labels.get("collapse_start") if collapse is not None else None
    early_steps = sorted(a.step for a in alerts if a.kind in EARLY_KINDS)
    first_early = early_steps[0] if early_steps else None
    early = start is not None and first_early is not None and first_early < start
    early_lead = None
    if start is not None:
        early_lead = (start - first_early) / start if early and start > 0 else 0.0
    flagged = None
    if failure:
        at = labels.get("failure_step") or 0
        flagged = any(a.kind == failure and a.step >= at for a in alerts)
    return RunScore(
        detector=detector,
        run=run or str(labels.get("name", "")),
        kind=str(labels.get("kind", "")),
        standard_only=bool(labels.get("standard_only", False)),
        collapse_step=collapse,
        first_warning=first,
        caught_before=caught,
        lead=lead,
        false_alarm=false_alarm,
        failure_flagged=flagged,
        collapse_start=start,
        first_early=first_early,
        early_warning=early,
        early_lead=early_lead,
        false_alarm_any=false_any,
    )


def _summarise(name: str, scores: Sequence[RunScore]) -> Summary:
    col = [s for s in scores if s.collapse_step is not None]
    fail = [s for s in scores if s.failure_flagged is not None]
    neg = [s for s in scores if s.collapse_step is None and s.failure_flagged is None]
    groups: dict[str, dict[str, Any]] = {}
    for g, members in (
        ("lld", [s for s in col if not s.standard_only]),
        ("standard", [s for s in col if s.standard_only]),
    ):
        leads = [s.lead for s in members if s.lead is not None]
        early = [s.early_lead for s in members if s.early_lead is not None]
        groups[g] = {
            "n_collapse": len(members),
            "caught_before": sum(s.caught_before for s in members),
            "median_lead": statistics.median(leads) if leads else None,
            "early_warning": sum(s.early_warning for s in members),
            "median_early_lead": statistics.median(early) if early else None,
        }
    leads = [s.lead for s in col if s.lead is not None]
    early = [s.early_lead for s in col if s.early_lead is not None]
    return Summary(
        detector=name,
        n_collapse=len(col),
        caught_before=sum(s.caught_before for s in col),
        median_lead=statistics.median(leads) if leads else None,
        n_negative=len(neg),
        false_alarm_runs=sum(s.false_alarm for s in neg),
        by_group=groups,
        n_failure=len(fail),
        failures_flagged=sum(bool(s.failure_flagged) for s in fail),
        early_warning=sum(s.early_warning for s in col),
        median_early_lead=statistics.median(early) if early else None,
        false_alarm_any_runs=sum(s.false_alarm_any for s in neg),
    )


def evaluate(
    runs: Iterable[tuple[pd.DataFrame, Mapping[str, Any]]],
    detectors: Mapping[str, Callable[[], Any]] | None = None,
) -> Evaluation:
    """Score each detector (a fresh one per run) on ``(steps, labels)`` pairs."""
    detectors = dict(detectors or DETECTORS)
    scores: list[RunScore] = []
    for steps, labels in runs:
        for name, factory in detectors.items():
            alerts = run_detector(factory(), steps)
            scores.append(score_run(name, alerts, labels))
    if not scores:
        raise ValueError("no labelled runs to evaluate")
    summaries = {n: _summarise(n, [s for s in scores if s.detector == n]) for n in detectors}
    return Evaluation(summaries, scores)


def load_labelled_runs(root: str | Path) -> list[tuple[pd.DataFrame, dict[str, Any]]]:
    """Every run folder under ``root`` whose meta has ``labels`` (as ``simulate`` writes)."""
    from lld_monitor.runlog import find_runs, load_run

    out = []
    for path in find_runs(root):
        run = load_run(path)
        labels = run.meta.get("labels")
        if isinstance(labels, dict):
            labels = {**labels, "name": labels.get("name", path.name)}
            out.append((run.steps, labels))
    return out
