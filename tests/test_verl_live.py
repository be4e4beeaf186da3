"""verl's driver-side live monitor: run folder, alerts, runtime LLDS, probe, flight recorder.

The slow test runs tests/verl_live_driver.py: a local Ray cluster with two verl TrainingWorker
processes (FSDP2 over gloo on CPU) driven for 4 steps by VerlLiveMonitor, while this process
follows the run folder with the dashboard's own reader. No mocks of verl or Ray. The fast tests
check the driver-side pieces on hand-made tensors.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.verl

verl = pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from verl.trainer.ppo import core_algos  # noqa: E402

from lld_monitor import columns as C  # noqa: E402
from lld_monitor.events import Alert  # noqa: E402
from lld_monitor.integrations import verl as lv  # noqa: E402
from lld_monitor.integrations.verl_live import (  # noqa: E402
    FlightRecorder,
    LLDSControl,
    VerlLiveMonitor,
    response_rewards,
)
from lld_monitor.llds import llds_loss  # noqa: E402
from lld_monitor.metrics import likelihood_displacement  # noqa: E402
from lld_monitor.runlog import load_run as Run  # noqa: E402

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
LAM = 0.2


# --- fast: the driver-side pieces on hand-made tensors --------------------------------------------


def hand_batch():
    """3 responses x 4 tokens; row 0 correct (reward 1), rows 1-2 not."""
    old = torch.tensor([[-1.0, -2.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0], [-2.0] * 4])
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    scores = torch.zeros(3, 4)
    scores[0, 3] = 1.0
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4, [-0.5] * 4])
    batch = {
        "responses": torch.tensor([[5, 6, 7, 8], [5, 5, 5, 5], [9, 9, 9, 9]]),
        "response_mask": mask,
        "old_log_probs": old,
        "advantages": adv * mask,
        "token_level_scores": scores,
        "ref_log_prob": old - 0.5,
    }
    return batch


class OneAlert:
    """A detector (the monitor's update(row) -> alerts interface) with one scripted alert."""

    phase = "healthy"

    def __init__(self, step: int, kind: str, severity: str) -> None:
        self.at, self.kind, self.severity = step, kind, severity

    def update(self, row):
        if int(row[C.STEP]) == self.at:
            return [Alert(self.at, self.kind, self.severity, f"scripted {self.kind}")]
        return []


def test_end_step_row_by_hand(tmp_path):
    live = VerlLiveMonitor(tmp_path / "run", control=None, detector=None, flight_recorder=None)
    batch = hand_batch()
    new = batch["old_log_probs"][[0, 2]] + torch.tensor([[0.5, -0.5, 9.0, -1.0], [0.0, 0, 0, -1]])
    metrics = {"actor/grad_norm": 2.0, "actor/pg_loss": 0.25, "actor/lld/llds_loss": 0.125}
    row = live.end_step(1, batch, metrics, probe_log_probs=new, probe_rows=torch.tensor([0, 2]))
    live.close()
    assert row[C.REWARD_MEAN] == pytest.approx(1 / 3) and row[C.ACCURACY] == pytest.approx(1 / 3)
    assert row[C.GRAD_NORM] == 2.0 and row[C.LOSS] == 0.25 and row[C.LLDS_LOSS] == 0.125
    assert row[C.LOGP_CORRECT] == pytest.approx(-4 / 3)  # row 0's generated tokens
    assert row[C.KL] == pytest.approx(0.5)  # old - ref on every generated token
    # probe: row 0 (correct) changes 0.5 - 0.5 - 1.0 on its generated tokens (the 9.0 is masked)
    assert row[C.DELTA_CORRECT] == pytest.approx(-1.0)
    assert row[C.DELTA_INCORRECT] == pytest.approx(-1.0)  # row 2
    assert row[C.N_CORRECT] == 1 and row[C.N_INCORRECT] == 1
    steps = Run(tmp_path / "run").steps
    assert list(steps[C.STEP]) == [1]


@pytest.mark.parametrize("is_mean", [0.57, 0.99])
def test_verls_sampler_metrics_reach_the_row_and_the_mismatch_check(tmp_path, is_mean):
    """verl's rollout-correction IS-ratio mean and rollout-vs-actor probability difference, as
    its trainer puts them in the step's metrics, are written live (issue 51, item 4): at 0.57
    the sampler_mismatch warning comes at the third row; at 0.99 (and a small difference)
    none."""
    live = VerlLiveMonitor(tmp_path / "run", control=None, flight_recorder=None)
    diff = 0.2 if is_mean < 0.8 else 0.001
    for step in range(1, 6):
        metrics = {
            "actor/grad_norm": 1.0,
            "actor/pg_loss": 0.1,
            "rollout_corr/rollout_is_mean": is_mean,
            "training/rollout_probs_diff_mean": diff,
        }
        row = live.end_step(step, hand_batch(), metrics)
        assert row[C.IS_RATIO_MEAN] == pytest.approx(is_mean)
        assert row[C.SAMPLER_PROB_DIFF] == pytest.approx(diff)
    live.close()
    events = Run(tmp_path / "run").events
    alerts = events[events[C.EVENT_TYPE] == "alert"]
    mismatch = alerts[alerts[C.EVENT_KIND] == "sampler_mismatch"]
    assert mismatch[C.EVENT_STEP].tolist() == ([3] if is_mean < 0.8 else [])


def test_response_rewards_and_probe_rows(tmp_path):
    assert response_rewards(hand_batch()).tolist() == [1.0, 0.0, 0.0]
    assert response_rewards({"rewards": torch.tensor([0.5, 1.0])}).tolist() == [0.5, 1.0]
    assert response_rewards({}) is None
    live = VerlLiveMonitor(tmp_path / "r", control=None, detector=None, probe_fraction=0.3)
    rows = live.probe_rows(10, multiple=4)  # ceil(3) -> 4
    assert len(rows) == 4 and rows.tolist() == sorted(set(rows.tolist()))
    assert len(live.probe_rows(10)) == 3 and len(live.probe_rows(5, multiple=8)) == 5
    correct = torch.tensor([False] * 8 + [True, True])
    picked = live.probe_rows(10, multiple=4, correct=correct)  # correct first, then incorrect
    assert len(picked) == 4 and {8, 9} <= set(picked.tolist())
    live.close()
    off = VerlLiveMonitor(tmp_path / "o", control=None, detector=None, probe_fraction=0.0)
    assert off.probe_rows(10) is None
    off.close()


def test_control_versions():
    c = LLDSControl(False, 0.0)
    assert c.get() == {"enabled": False, "lam": 0.0, "version": 0, "step": None}
    assert c.set(True, 0.3, 5)["version"] == 1
    assert c.get() == {"enabled": True, "lam": 0.3, "version": 1, "step": 5}


def test_unreadable_control_keeps_the_configured_loss(caplog):
    # no Ray in this process: the loss warns once and keeps llds_enabled / llds_lambda
    old = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    new = torch.tensor([[-1.5, -1.0], [-1.0, -0.5]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.ones(2, 2, dtype=torch.long)
    from verl.workers.config import FSDPActorConfig

    cfg = FSDPActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=2,
        policy_loss=lv.LLDSPolicyLossConfig(llds_lambda=0.3, llds_control="no_such_actor"),
    )
    fn = core_algos.get_policy_loss_fn("llds")
    for _ in range(2):
        _, m = fn(old, new, adv, mask, "token-mean", cfg, None)
        assert m["lld/llds_lambda"] == 0.3 and "lld/llds_control_version" not in m
    assert sum("cannot read the LLDS control" in r.getMessage() for r in caplog.records) == 1


def test_flight_recorder_bounds_and_triggers(tmp_path):
    fr = FlightRecorder(tmp_path, before=1, after=1, max_rows=2, max_tokens=3, max_triggers=1)
    batch = hand_batch()

    def snap(step, probe=None, rows=None):
        return fr.snapshot(
            step, batch, {"actor/grad_norm": float(step)}, probe_log_probs=probe, probe_rows=rows
        )

    assert fr.observe(snap(1), None) == []  # kept in the ring, nothing written
    assert fr.observe(snap(2), None) == []  # ring of 1: step 1 dropped
    probe = torch.full((1, 4), -7.0)
    assert fr.observe(snap(3, probe, torch.tensor([2])), "critical collapse alert") == [2, 3]
    assert fr.observe(snap(4), None) == [4]  # one step after
    assert fr.observe(snap(5), None) == []
    assert fr.observe(snap(6), "non-finite actor/grad_norm") == []  # max_triggers=1
    files = sorted(p.name for p in (tmp_path / "flight").iterdir())
    assert files == [
        "index.jsonl",
        *[f"step_00000{s}.{e}" for s in (2, 3, 4) for e in ("json", "npz")],
    ]
    arrays = np.load(tmp_path / "flight" / "step_000003.npz")
    assert arrays["old_log_probs"].shape == (2, 3)  # bounded: 2 rows, 3 tokens
    # the probed row comes first; its current log-probs are the probe's, the other's NaN
    meta = json.loads((tmp_path / "flight" / "step_000003.json").read_text())
    assert meta["rows"] == [2, 0] and meta["scalars"]["actor/grad_norm"] == 3.0
    assert arrays["log_probs"][0].tolist() == [-7.0] * 3 and np.isnan(arrays["log_probs"][1]).all()
    assert arrays["kl"][0].tolist() == pytest.approx([0.5] * 3)
    index = [json.loads(x) for x in (tmp_path / "flight" / "index.jsonl").read_text().splitlines()]
    assert index[0]["steps"] == [2, 3] and index[0]["reason"] == "critical collapse alert"
    with pytest.raises(ValueError, match="max_rows must be >= 1"):
        FlightRecorder(tmp_path, max_rows=0)


def test_flight_recorder_on_non_finite_grad_norm(tmp_path):
    live = VerlLiveMonitor(
        tmp_path / "run", control=None, detector=None, tokenizer=None, probe_fraction=0.0
    )
    for step, g in ((1, 1.0), (2, float("nan"))):
        live.end_step(step, hand_batch(), {"actor/grad_norm": g})
    live.close()
    index = (tmp_path / "run" / "flight" / "index.jsonl").read_text()
    assert "non-finite actor/grad_norm" in index
    assert (tmp_path / "run" / "flight" / "step_000002.npz").exists()
    events = Run(tmp_path / "run").events
    assert "flight_record" in set(events[C.EVENT_KIND])


def test_manual_switch_without_ray_is_recorded(tmp_path):
    live = VerlLiveMonitor(tmp_path / "run", control=None, detector=OneAlert(1, "decay", "warning"))
    live.llds.enable(0.3)
    assert live.before_update(1) == 0  # no control: nothing to push
    row = live.end_step(1, hand_batch(), {})
    live.llds.disable()
    live.close()
    assert row[C.LLDS_ENABLED] == 1 and row[C.LLDS_LAMBDA] == 0.3
    kinds = list(Run(tmp_path / "run").events[C.EVENT_KIND])
    assert "llds_enable" in kinds and "llds_disable" in kinds and "decay" in kinds


def test_monitor_failures_never_stop_training(tmp_path):
    # no Ray here: the control cannot be created; a batch without old_log_probs cannot be read.
    # Both are reported once as error events and training carries on (strict=False).
    import ray

    live = VerlLiveMonitor(tmp_path / "run", control=True, detector=None)
    assert live.before_update(1) == 0 and not ray.is_initialized()
    bad = {k: v for k, v in hand_batch().items() if k != "old_log_probs"}
    row = live.end_step(1, bad, {"actor/grad_norm": 1.0})
    assert row[C.STEP] == 1 and row[C.GRAD_NORM] == 1.0  # the rest of the row is still written
    live.close()
    errors = Run(tmp_path / "run").events
    errors = errors[errors[C.EVENT_TYPE] == "error"]
    assert list(errors[C.EVENT_KIND]) == ["verl before_update", "verl end_step rollout"]
    assert "Ray is not initialised" in errors[C.EVENT_MESSAGE].iloc[0]
    strict = VerlLiveMonitor(tmp_path / "strict", control=None, detector=None, strict=True)
    with pytest.raises(KeyError, match="old_log_probs"):
        strict.end_step(1, bad, {})
    strict.close()


def test_trainer_settings_through_verls_hydra_config():
    # the documented overrides compose with verl's own ppo_trainer config
    from hydra import compose, initialize_config_dir

    from lld_monitor.integrations.verl_live import settings_from, sinks_from
    from lld_monitor.sinks import ConsoleSink, WebhookSink

    cfg_dir = Path(verl.__file__).parent / "trainer" / "config"
    overrides = [
        line.strip().rstrip("\\").strip().replace('"$RUN_DIR"', "/runs/lld_run")
        for line in (REPO / "examples" / "verl_live_monitor.sh").read_text().splitlines()
        if line.strip().startswith(("+lld_monitor.", "trainer.v1.trainer_mode"))
    ]
    assert "trainer.v1.trainer_mode=lld_monitor" in overrides
    with initialize_config_dir(config_dir=str(cfg_dir), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    settings = settings_from(cfg)
    assert settings["auto_llds"] is True and settings["probe_fraction"] == 0.25
    assert settings["run_dir"] == "/runs/lld_run" and settings["webhook"] is None
    assert [type(x) for x in sinks_from({**settings, "webhook": "http://127.0.0.1:9"})] == [
        ConsoleSink,
        WebhookSink,
    ]
    with initialize_config_dir(config_dir=str(cfg_dir), version_base=None):
        bad = compose(config_name="ppo_trainer", overrides=["+lld_monitor.probe=0.5"])
    with pytest.raises(ValueError, match=r"unknown keys \['probe'\]"):
        settings_from(bad)
    assert settings_from(cfg.trainer)["auto_llds"] is False  # no section: the defaults


def test_trainer_mode_registered_and_verls_hooks_still_there():
    # verl's v1 trainer imports transfer_queue (installed by `make verl-venv`); the trainer itself
    # needs GPUs and a rollout engine (not run here), but its registration and the verl methods
    # it overrides are checked, so a verl release that renames them fails here
    pytest.importorskip("transfer_queue")
    import inspect

    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from lld_monitor.integrations import verl_trainer as vt

    assert get_trainer_cls(vt.TRAINER_MODE) is vt.LLDMonitorTrainer
    assert issubclass(vt.LLDMonitorTrainer, PPOTrainerSync)
    for name in ("_update_actor", "_compute_metrics", "fit"):
        ours = inspect.signature(getattr(vt.LLDMonitorTrainer, name))
        theirs = inspect.signature(getattr(PPOTrainerSync, name))
        assert list(ours.parameters) == list(theirs.parameters), name
    base = inspect.getsource(PPOTrainerSync.__mro__[1])  # verl's PPOTrainer: what we use of it
    for used in ("self.actor_rollout_wg", "self.use_reference_policy", "self.global_steps"):
        assert used in base, used
    meta = KVBatchMeta(partition_id="train", keys=["a", "b"], tags=[{}, {"is_padding": True}])
    assert meta.extra_info == {} and meta.keys == ["a", "b"]


# --- slow: real Ray, two FSDP2 workers --------------------------------------------------------


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    pytest.importorskip("ray")
    pytest.importorskip("fastapi")  # verl's worker module imports it; verl does not declare it
    sys.path.insert(0, str(REPO))
    from lld_monitor.report.dashboard import sources

    out = tmp_path_factory.mktemp("verl_live")
    run_dir = out / "run"
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "verl_live_driver.py"), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=out,
    )
    seen: list[int] = []  # rows the dashboard's reader saw, polled while the driver runs
    live = None
    deadline = time.monotonic() + 400
    while proc.poll() is None and time.monotonic() < deadline:
        if live is None and (run_dir / "meta.json").exists():
            live = sources.LiveRun(sources.Target("run", run_dir.resolve(), "run"))
        if live is not None:
            live.refresh()
            if not seen or live.n_rows != seen[-1]:
                seen.append(live.n_rows)
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    log = proc.communicate()[0]
    assert proc.returncode == 0, log[-6000:]
    result = json.loads((out / "result.json").read_text())
    result["seen_by_dashboard"] = seen
    result["run_dir"] = str(run_dir)
    return result


def _t(x):
    return torch.tensor(x, dtype=torch.float32)


@pytest.mark.slow
def test_run_folder_grows_step_by_step(ray_run):
    steps = ray_run["steps"]
    assert [s["run_rows_on_disk"] for s in steps] == [1, 2, 3, 4]  # after each end_step
    seen = ray_run["seen_by_dashboard"]
    assert seen[-1] == 4 and seen == sorted(seen) and len(set(seen) - {0}) >= 3, seen
    run = Run(ray_run["run_dir"])
    assert list(run.steps[C.STEP]) == [1, 2, 3, 4] and run.meta["engine"] == "verl"
    assert sorted(run.token_steps()) == [1, 2, 3, 4]  # drill-down samples from the probe
    # `lld-monitor analyze` reads it like a TRL run folder
    from lld_monitor.analysis.offline import analyze_run

    used = analyze_run(ray_run["run_dir"]).signals_used
    assert C.LOGP_CORRECT in used and C.FRAC_CORRECT_DISPLACED in used and C.GRAD_NORM in used


@pytest.mark.slow
def test_alert_switches_llds_on_and_the_next_loss_includes_it(ray_run):
    steps = ray_run["steps"]
    mask, adv = _t(ray_run["mask"]), _t(ray_run["adv"])
    events = Run(ray_run["run_dir"]).events
    switches = events[events[C.EVENT_KIND].isin(["llds_enable", "llds_disable"])]
    assert list(zip(switches[C.EVENT_STEP], switches[C.EVENT_KIND], strict=True)) == [
        (2, "llds_enable"),  # auto_llds on the stagnation alert of step 2
        (4, "llds_disable"),  # manual, before step 4
    ]
    # the control's version as the workers' losses read it: one change per switch
    assert [s["control_version"] for s in steps] == [1, 1, 2, 3]
    on = [bool(s["row"][C.LLDS_ENABLED]) for s in steps]
    assert on == [False, False, True, False]
    for s, is_on in zip(steps, on, strict=True):
        second = s["second"]
        assert second["actor/lld/llds_control_version"] == s["control_version"]
        # verl's pg_loss of mini-batch 2 (rows 4-7; one row per micro-batch, two per worker),
        # recomputed from the log-probs the workers saw: old, and mid (after mini-batch 1).
        # verl: each micro-batch's loss is pre-scaled by global_batch_info; the metric is the
        # sum over micro-batches of the mean over the two ranks = (1/2) * sum over the 4 rows.
        old, mid = _t(s["old"]), _t(s["mid"])
        rows = range(4, 8)
        cfg = lv.LLDSPolicyLossConfig()
        from verl.workers.config import FSDPActorConfig

        actor = FSDPActorConfig(
            strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=cfg
        )
        actor.global_batch_info.update(
            dp_size=2, batch_num_tokens=int(mask[4:].sum()), global_batch_size=4
        )
        vanilla = core_algos.get_policy_loss_fn("vanilla")
        v = sum(
            float(vanilla(old[[i]], mid[[i]], adv[[i]], mask[[i]], "token-mean", actor, None)[0])
            for i in rows
        )
        pen = [
            float(
                llds_loss(
                    logp_new=mid[[i]], logp_old=old[[i]], advantages=adv[[i], 0], mask=mask[[i]]
                ).loss
            )
            for i in rows
        ]
        lam = LAM if is_on else 0.0
        want = (v + lam * 0.5 * sum(pen)) / 2  # llds scale: 1 row / 4 rows * dp 2 = 0.5
        assert second["actor/pg_loss"] == pytest.approx(want, rel=2e-3, abs=2e-4), s["step"]
        if is_on:
            assert sum(pen) > 0.05  # LLDS really adds something on this step
            assert second["actor/lld/llds_loss"] == pytest.approx(sum(pen) / 4, rel=2e-3)
            assert second["actor/pg_loss"] - v / 2 == pytest.approx(LAM * 0.25 * sum(pen), 2e-2)
        else:
            assert "actor/lld/llds_loss" not in second


@pytest.mark.slow
def test_probe_columns_equal_a_recomputation(ray_run):
    mask = _t(ray_run["mask"])
    rewards = _t(ray_run["rewards"])
    for s in ray_run["steps"]:
        rows = torch.tensor(s["probe_rows"])
        assert len(rows) == 4  # probe_fraction 0.5 of 8, a multiple of 2 ranks x 2
        old, new = _t(s["old"])[rows], _t(s["probe"])
        want = likelihood_displacement(
            logp_old=old, logp_new=new, mask=mask[rows], rewards=rewards[rows]
        ).as_row()
        for col in C.DISPLACEMENT_COLUMNS:
            assert s["row"].get(col, float("nan")) == pytest.approx(want[col], nan_ok=True), col
        conf = likelihood_displacement(
            logp_old=_t(s["old"]), logp_new=None, mask=mask, rewards=rewards
        ).as_row()
        assert s["row"][C.LOGP_CORRECT] == pytest.approx(conf[C.LOGP_CORRECT])


@pytest.mark.slow
def test_flight_recorder_writes_the_steps_around_the_critical_alert(ray_run):
    flight = Path(ray_run["run_dir"]) / "flight"
    index = [json.loads(x) for x in (flight / "index.jsonl").read_text().splitlines()]
    assert index[0]["step"] == 3 and index[0]["steps"] == [1, 2, 3]
    assert "critical collapse" in index[0]["reason"] and index[1]["step"] == 4
    steps = {s["step"]: s for s in ray_run["steps"]}
    for step in (1, 2, 3, 4):
        arrays = np.load(flight / f"step_{step:06d}.npz")
        meta = json.loads((flight / f"step_{step:06d}.json").read_text())
        rows = meta["rows"]
        assert rows[: len(steps[step]["probe_rows"])] == steps[step]["probe_rows"]
        old = _t(steps[step]["old"])[rows]
        assert arrays["old_log_probs"] == pytest.approx(old.numpy())
        assert arrays["log_probs"] == pytest.approx(np.asarray(steps[step]["probe"]))
        assert len(meta["texts"]) == len(rows) and all(meta["texts"])
        assert meta["scalars"]["actor/grad_norm"] == pytest.approx(
            steps[step]["first"]["actor/grad_norm"] / 2
            + steps[step]["second"]["actor/grad_norm"] / 2
        )
    assert "flight_record" in set(Run(ray_run["run_dir"]).events[C.EVENT_KIND])


@pytest.mark.slow
def test_overhead_figures(ray_run):
    steps = ray_run["steps"][1:]  # step 1 starts the control actor (one-off)
    share = sum(s["monitor_seconds"] for s in steps) / sum(s["seconds"] for s in steps)
    probe = sum(s["seconds_probe"] for s in steps) / sum(s["seconds_old_log_prob"] for s in steps)
    print(
        f"\nverl driver-side monitor: {share:.1%} of step time (steps 2-4); probe (4 of 8 rows) "
        f"= {probe:.2f} x one compute_log_prob pass over the batch; first step "
        f"{ray_run['steps'][0]['monitor_seconds']:.2f} s (control actor start); setup "
        f"{ray_run['setup_seconds']:.0f} s"
    )
    assert 0 < share < 0.5 and probe > 0
