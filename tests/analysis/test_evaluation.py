"""Baselines, the scorer and the eval/simulate commands, on hand-made rows and labelled runs."""

from __future__ import annotations

import json
import math

import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.baselines import GradSpikeDetector, RewardDropDetector
from lld_monitor.analysis.evaluation import evaluate, score_run
from lld_monitor.cli import main
from lld_monitor.events import Alert
from lld_monitor.testing import make_run, make_suite


def _alert(step, kind="decay"):
    return Alert(step, kind, "warning", "m")


# --- the scorer ----------------------------------------------------------------------------------


def test_score_run_by_hand():
    lab = {"kind": "collapse", "collapse_step": 100, "name": "r"}
    # first warning at 40: caught before, lead (100 - 40) / 100 = 0.6
    s = score_run("x", [_alert(70, "decay"), _alert(40, "stagnation")], lab)
    assert s.caught_before and s.lead == pytest.approx(0.6) and s.first_warning == 40
    # only after the collapse: not caught before, no lead
    s = score_run("x", [_alert(120, "collapse")], lab)
    assert not s.caught_before and s.lead == 0.0
    # info/phase alerts and non-LLD kinds are not warnings
    s = score_run("x", [_alert(10, "phase"), _alert(20, "dead_signal")], lab)
    assert s.first_warning is None and s.lead == 0.0
    healthy = {"kind": "dip", "collapse_step": None}
    assert score_run("x", [_alert(50, "decay")], healthy).false_alarm
    assert not score_run("x", [_alert(50, "stagnation")], healthy).false_alarm
    failing = {"kind": "nonfinite", "collapse_step": None, "failure": "nonfinite"}
    failing["failure_step"] = 30
    s = score_run("x", [_alert(50, "collapse")], failing)
    assert not s.false_alarm and s.failure_flagged is False
    assert score_run("x", [_alert(31, "nonfinite")], failing).failure_flagged
    assert not score_run("x", [_alert(29, "nonfinite")], failing).failure_flagged  # before it


def test_early_warning_by_hand():
    lab = {"kind": "collapse", "collapse_step": 100, "collapse_start": 80, "name": "r"}
    # displacement at 30 is the first early alert: lead (80 - 30) / 80 = 0.625
    s = score_run("x", [_alert(70, "decay"), _alert(30, "displacement")], lab)
    assert s.early_warning and s.first_early == 30 and s.early_lead == pytest.approx(0.625)
    assert s.caught_before and s.lead == pytest.approx(0.7)  # the classic score counts it too
    # a collapse alert in phase II catches the collapse but is no early warning
    s = score_run("x", [_alert(50, "collapse")], lab)
    assert s.caught_before and not s.early_warning and s.early_lead == 0.0
    # strictly before phase III: an alert at collapse_start is late
    s = score_run("x", [_alert(80, "stagnation")], lab)
    assert not s.early_warning and s.early_lead == 0.0 and s.first_early == 80
    # reward_decline / kl_blowup are not LLD warnings
    s = score_run("x", [_alert(10, "reward_decline"), _alert(20, "kl_blowup")], lab)
    assert s.first_warning is None and s.first_early is None and not s.early_warning
    healthy = {"kind": "warmup", "collapse_step": None, "collapse_start": None}
    for kind, classic, any_ in (
        ("displacement", False, True),
        ("stagnation", False, True),
        ("decay", True, True),
        ("collapse", True, True),
        ("reward_decline", False, False),
        ("kl_blowup", False, False),
    ):
        s = score_run("x", [_alert(50, kind)], healthy)
        assert (s.false_alarm, s.false_alarm_any) == (classic, any_), kind
        assert s.early_lead is None and not s.early_warning


class _AlertAt:
    """A scripted detector: one alert of ``kind`` at the first row at or after ``step``."""

    def __init__(self, kind="displacement", step=40):
        self.kind, self.step, self.done = kind, step, False

    def update(self, row):
        if self.done or row[C.STEP] < self.step:
            return []
        self.done = True
        return [Alert(int(row[C.STEP]), self.kind, "warning", "scripted")]


def test_early_warning_summary_on_labelled_runs():
    runs = make_suite(10, seed=779)  # 4 collapsing (collapse_start >= 90), 6 healthy
    ev = evaluate(((r.steps, r.labels) for r in runs), {"at40": _AlertAt})
    s = ev.summaries["at40"]
    starts = sorted(r.labels["collapse_start"] for r in runs if r.labels["collapse_start"])
    assert s.n_collapse == 4 and s.early_warning == 4 and s.caught_before == 4
    leads = sorted((c - 40) / c for c in starts)
    assert s.median_early_lead == pytest.approx((leads[1] + leads[2]) / 2)
    assert s.n_negative == 6 and s.false_alarm_any_runs == 6 and s.false_alarm_runs == 0
    assert "early warning" in ev.table() and "4/4" in ev.table()
    late = evaluate(((r.steps, r.labels) for r in runs), {"late": lambda: _AlertAt("decay", 119)})
    s = late.summaries["late"]
    assert s.early_warning == 1 == sum(c > 119 for c in starts) and s.false_alarm_any_runs == 6


def test_failure_runs_are_scored_apart():
    from lld_monitor.testing import FAILURE_KINDS, HEALTHY_KINDS

    # 8 runs: 3 collapsing, then healthy and the four failure kinds in turn
    runs = make_suite(8, seed=778, kinds=("collapse", *HEALTHY_KINDS[:1], *FAILURE_KINDS))
    ev = evaluate((r.steps, r.labels) for r in runs)
    ours = ev.summaries["ours"]
    assert ours.n_failure == 4 and ours.failures_flagged == 4 and ours.n_negative == 1
    assert ev.summaries["grad_spike"].failures_flagged == 0
    assert "non-LLD failure runs flagged" in ev.table()


# --- baselines ------------------------------------------------------------------------------------


def test_grad_spike_z_score_by_hand():
    # 64 values alternating 1, 3: mean 2, sample sd = sqrt(64 / 63) = 1.00791
    base = [1.0, 3.0] * 32
    sd = math.sqrt(64 / 63)
    for z, fires in ((6.1, True), (5.9, False)):
        det = GradSpikeDetector()
        for i, g in enumerate(base):
            assert det.update({C.STEP: i, C.GRAD_NORM: g}) == []
        out = det.update({C.STEP: 64, C.GRAD_NORM: 2.0 + z * sd})
        assert bool(out) is fires
        if fires:
            assert out[0].kind == "collapse" and "6.1 sigma" in out[0].message


def test_grad_spike_waits_for_history_and_skips_nonfinite():
    det = GradSpikeDetector(window=8, min_history=4)
    for i, g in enumerate([1.0, 1.1, 0.9]):
        det.update({C.STEP: i, C.GRAD_NORM: g})
    assert det.update({C.STEP: 3, C.GRAD_NORM: 100.0}) == []  # 3 values of history < 4
    assert det.update({C.STEP: 4, C.GRAD_NORM: math.nan}) == []
    with pytest.raises(ValueError):
        GradSpikeDetector(window=8, min_history=10)


def test_reward_drop_by_hand():
    # EMA (tau 10) of a reward 1.0 for steps 0..9 then 0: at step 10 + j the EMA is
    # exp(-0.1 (j + 1)); below 0.5 first when j + 1 > 6.93, i.e. j = 6 -> step 16
    det = RewardDropDetector()
    fired = []
    for s in range(40):
        fired += det.update({C.STEP: s, C.REWARD_MEAN: 1.0 if s < 10 else 0.0})
    assert [a.step for a in fired] == [16]
    assert det.phase == "collapse"


def test_reward_drop_needs_a_positive_peak():
    det = RewardDropDetector()
    out = []
    for s in range(30):
        out += det.update({C.STEP: s, C.REWARD_MEAN: -1.0 - s})
    assert out == []


@pytest.mark.parametrize("cls", [GradSpikeDetector, RewardDropDetector])
def test_baseline_state_round_trip(cls):
    run = make_run("collapse", seed=61)
    rows = run.steps.to_dict("records")
    full = cls()
    ref = [a.to_dict() for r in rows for a in full.update(r)]
    det = cls()
    got = [a.to_dict() for r in rows[:140] for a in det.update(r)]
    again = cls()
    again.load_state_dict(json.loads(json.dumps(det.state_dict())))
    got += [a.to_dict() for r in rows[140:] for a in again.update(r)]
    assert got == ref


def test_grad_spike_baseline_fires_on_an_isolated_spike():
    # the hard negative the baseline cannot tell from a collapse
    run = make_run("grad_spikes", seed=62, spike_steps=[150])
    det = GradSpikeDetector()
    alerts = [a for r in run.steps.to_dict("records") for a in det.update(r)]
    assert [a.step for a in alerts][:1] == [150]


# --- evaluation on labelled runs -----------------------------------------------------------------


def test_targets_on_a_held_out_suite():
    # seed 777 was never used for tuning: every collapse with LLD columns caught before it
    # happens, no decay/collapse alert on a non-collapsing run, lead >= 0.2 above grad-spike
    runs = make_suite(20, seed=777)
    ev = evaluate((r.steps, r.labels) for r in runs)
    ours, spike = ev.summaries["ours"], ev.summaries["grad_spike"]
    assert ours.by_group["lld"]["caught_before"] == ours.by_group["lld"]["n_collapse"] > 0
    assert ours.false_alarm_runs == 0 and ours.n_negative == 12
    assert ours.median_lead >= spike.median_lead + 0.2
    assert "ours" in ev.table() and "grad_spike" in ev.table()


def test_simulate_then_eval_cli(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", str(out), "--n", "4", "--seed", "5"]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and "collapse_step=" in text
    meta = json.loads(next(out.glob("000_*")).joinpath("meta.json").read_text())
    assert meta["simulated"] is True and meta["labels"]["kind"] == "collapse"
    assert main(["eval", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)  # exactly one JSON object
    assert set(d["detectors"]) == {"ours", "grad_spike", "reward_drop"}
    assert len(d["runs"]) == 12
    assert {"early_warning", "median_early_lead", "false_alarm_any_runs"} <= set(
        d["detectors"]["ours"]
    )
    assert main(["eval", str(out)]) == 0
    text = capsys.readouterr().out
    assert "caught before" in text and "early warning" in text and "any-LLD-alert" in text
    # a clash and an empty folder are one-line errors, exit 2
    assert main(["simulate", str(out), "--n", "4", "--seed", "5"]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["eval", str(empty)]) == 2
    assert "no labelled runs" in capsys.readouterr().err


def test_simulate_one_kind(tmp_path, capsys):
    from lld_monitor import runlog

    out = tmp_path / "k"
    args = ["simulate", str(out), "--n", "2", "--kind", "nonfinite", "--log-every", "5"]
    assert main(args) == 0
    runs = runlog.find_runs(out)
    assert len(runs) == 2
    run = runlog.load_run(runs[0])
    assert run.meta["labels"]["failure"] == "nonfinite"
    assert (run.steps[C.STEP] % 5 == 0).all()


@pytest.mark.parametrize(
    "factory",
    [
        lambda: __import__("lld_monitor.analysis", fromlist=["PhaseDetector"]).PhaseDetector(),
        GradSpikeDetector,
        RewardDropDetector,
    ],
    ids=["PhaseDetector", "GradSpikeDetector", "RewardDropDetector"],
)
def test_detector_contract(factory):
    # every detector: Alerts with valid kinds/severities, reset() replays identically,
    # JSON state round trip, rows with missing values accepted
    run = make_run("collapse", seed=63, log_every=2)
    rows = run.steps.to_dict("records")
    det = factory()
    first = [a for r in rows for a in det.update(r)]
    assert all(isinstance(a, Alert) and a.severity in C.SEVERITIES for a in first)
    assert any(a.kind == "collapse" for a in first)
    det.reset()
    assert [a.to_dict() for r in rows for a in det.update(r)] == [a.to_dict() for a in first]
    json.loads(json.dumps(det.state_dict()))
    assert det.update({C.STEP: 10**6}) == []  # a bare row is accepted (and raises nothing)
    assert isinstance(det.phase, str)


def test_simulate_wide_cli(tmp_path, capsys):
    from lld_monitor import runlog

    out = tmp_path / "wide"
    assert main(["simulate", str(out), "--wide", "--n", "5", "--seed", "2"]) == 0
    assert "time_scale=" in capsys.readouterr().out
    runs = [runlog.load_run(p) for p in runlog.find_runs(out)]
    labels = [r.meta["labels"] for r in runs]
    assert [lab["kind"] for lab in labels] == [
        "collapse",
        "collapse",
        "healthy",
        "grad_spikes",
        "plateau",
    ]
    from lld_monitor.testing import make_wide_suite

    expected = make_wide_suite(5, seed=2)
    assert [lab["n_steps"] for lab in labels] == [r.labels["n_steps"] for r in expected]
    # blank probe cells stay blank through the run log
    for run, exp in zip(runs, expected):
        if C.FRAC_CORRECT_DISPLACED in exp.steps.columns:
            got = run.steps[C.FRAC_CORRECT_DISPLACED].notna().sum()
            assert got == exp.steps[C.FRAC_CORRECT_DISPLACED].notna().sum()
    # one kind, knobs given on the command line
    one = tmp_path / "one"
    args = ["simulate", str(one), "--kind", "healthy", "--n", "1", "--probe-every", "4"]
    assert main([*args, "--rows-per-batch", "2", "--batch-size", "16"]) == 0
    run = runlog.load_run(runlog.find_runs(one)[0])
    lab = run.meta["labels"]
    assert (lab["probe_every"], lab["rows_per_batch"], lab["batch_size"]) == (4, 2, 16)
    probed = run.steps.loc[run.steps[C.N_CORRECT].notna(), C.STEP]
    assert probed.tolist() == list(range(0, lab["n_steps"], 8))
    assert main(["simulate", str(tmp_path / "bad"), "--kind", "healthy", "--probe-every", "0"]) == 2
    assert "probe_every must be an integer >= 1" in capsys.readouterr().err
