"""Run rlwatch, rldoctor and rlprobe side by side with lld_monitor on the same logs.

The peers are NOT project dependencies. Install them in a scratch virtual environment outside the
repository and run this script with that environment's python (see docs/peers.md):

    python3 -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install rlwatch==0.5.1 rldoctor==0.2.0 rlprobe==0.1.0
    /tmp/peers-venv/bin/python scripts/compare_peers.py \\
        sample_runs/auto/s1-small-32upd-lr3e-3-seed0-off /work/shared/real_runs/X_trainer_state.json

Each input is turned into the per-step dicts TRL's GRPOTrainer hands to a callback's `on_log`
(our run folders: steps.jsonl with our column names renamed to TRL's keys, see TRL_NAMES;
a trainer_state.json: its log_history as is). Every peer then gets those dicts through its own
TRL path, with its default settings:

- rlwatch: its TRL callback (`rlwatch.core._build_trl_callback`) on an `RLWatch` monitor, one
  `on_log` per logged step; the alerts are what its AlertManager let through (cooldown, limits).
- rldoctor: post hoc `diagnose()` on the whole log, and its `LiveMonitor` (check every 25
  records after 60) to say when each finding first appears.
- rlprobe: its TRL key map (`rlprobe.integrations.trl._map_logs`) into a `Recorder`, then
  post hoc `diagnose()` (onset step per finding) and the live schedule of its TRL callback
  (diagnose at steps divisible by 25), with the step its default `HaltPolicy` would stop at.

`--live-toy PRESET` instead trains a toy run (LLDS off) with LLDMonitor and the three peers' TRL
callbacks attached to the same `GRPOTrainer`; run it with the project's python (torch, trl) and
`--peers-site /tmp/peers-venv/lib/python3.11/site-packages`:

    PYTHONPATH=. .venv/bin/python scripts/compare_peers.py --live-toy s1-small-32upd-lr3e-3 \\
        --peers-site /tmp/peers-venv/lib/python3.11/site-packages --out /tmp/peers-live

lld_monitor's `analyze --json` runs on the original input (not the renamed dicts), in a separate
python given by --lld-python (default: the repository's .venv, else this python).

The TRL callbacks of rlwatch and rlprobe import `transformers.TrainerCallback` at import time;
when transformers is not installed here, a stand-in module with `TrainerCallback = object` is
put in its place (the callbacks only use it as a base class). No torch is needed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# our steps.jsonl column -> the key TRL's GRPOTrainer logs (docs/importers.md, the reverse map)
TRL_NAMES = {
    "reward_mean": "reward",
    "reward_std": "reward_std",
    "frac_zero_std_groups": "frac_reward_zero_std",
    "completion_length": "completions/mean_length",
    "entropy": "entropy",
    "kl": "kl",
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
}


def _ensure_transformers() -> str:
    try:
        import transformers

        return "transformers " + transformers.__version__
    except ImportError:
        stub = types.ModuleType("transformers")
        stub.TrainerCallback = object
        sys.modules["transformers"] = stub
        return "stand-in (TrainerCallback = object)"


def load_trl_logs(path: Path) -> list[dict]:
    """The per-step log dicts a TRL callback would have received for this input."""
    if path.is_dir():
        rows = []
        for line in (path / "steps.jsonl").read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            logs = {"step": int(row["step"])}
            for ours, trl in TRL_NAMES.items():
                if isinstance(row.get(ours), (int, float)):
                    logs[trl] = float(row[ours])
            for key, value in row.items():
                if key.startswith("reward_fn/") and isinstance(value, (int, float)):
                    logs["rewards/" + key.split("/", 1)[1] + "/mean"] = float(value)
            rows.append(logs)
        return rows
    if path.suffix == ".json":
        state = json.loads(path.read_text())
        history = state["log_history"] if isinstance(state, dict) else state
        # training rows only: a trainer's final summary row has train_runtime and no reward
        return [dict(r) for r in history if "step" in r and "train_runtime" not in r]
    raise SystemExit(f"{path}: expected a run folder with steps.jsonl or a trainer_state.json")


class _State:
    def __init__(self, step: int) -> None:
        self.global_step = step


def run_rlwatch(logs: list[dict], workdir: Path) -> dict:
    from rlwatch.config import RLWatchConfig
    from rlwatch.core import RLWatch, _build_trl_callback

    config = RLWatchConfig()
    config.framework = "manual"
    config.run_id = "compare"
    config.storage.log_dir = str(workdir / "rlwatch")
    monitor = RLWatch(config)
    monitor.start()
    callback = _build_trl_callback(monitor)()
    with contextlib.redirect_stderr(io.StringIO()):  # its rich console panels
        for row in logs:
            metrics = {k: v for k, v in row.items() if k != "step"}
            callback.on_log(None, _State(int(row["step"])), None, logs=metrics)
    alerts = [
        {
            "step": a["step"],
            "detector": a["detector"],
            "severity": a["severity"],
            "message": a["message"],
        }
        for a in monitor.store.get_alerts("compare")
    ]
    monitor.stop()
    return {"alerts": alerts}


def run_rldoctor(logs: list[dict]) -> dict:
    from rl_doctor.detectors.base import Severity
    from rl_doctor.diagnosis import diagnose
    from rl_doctor.ingest.base import run_from_records
    from rl_doctor.live import LiveMonitor

    post = diagnose(run_from_records(logs, name="compare"))
    findings = [
        {"detector": f.detector, "severity": f.severity.name, "summary": f.summary}
        for f in post.findings
        if f.severity >= Severity.WARNING
    ]
    live = LiveMonitor(on_finding=lambda f: None)
    first_seen = []
    for row in logs:
        for f in live.log({k: v for k, v in row.items() if k != "step"}, step=int(row["step"])):
            first_seen.append(
                {"step": int(row["step"]), "detector": f.detector, "severity": f.severity.name}
            )
    skipped = [f.detector for f in post.findings if f.severity == Severity.SKIPPED]
    return {"findings": findings, "live_first_seen": first_seen, "skipped": skipped}


def run_rlprobe(logs: list[dict], workdir: Path) -> dict:
    from rlprobe.doctor.engine import diagnose_view
    from rlprobe.doctor.live import HaltPolicy
    from rlprobe.doctor.runview import RunView
    from rlprobe.integrations.trl import _map_logs
    from rlprobe.recorder import Recorder
    from rlprobe.storage import RunReader

    run_dir = workdir / "rlprobe"
    rec = Recorder(run_dir, algorithm="grpo", capture_env=False, install_handlers=False)
    for row in logs:
        rec.log_step(int(row["step"]), **_map_logs({k: v for k, v in row.items() if k != "step"}))
    rec.close()
    reader = RunReader(run_dir)
    records = reader.steps()
    post = diagnose_view(RunView(reader.manifest, records))
    findings = [
        {
            "signature": f.signature_id,
            "severity": f.severity,
            "onset": f.first_step,
            "confidence": round(f.confidence, 2),
            "explanation": f.explanation,
        }
        for f in post
    ]
    # the live schedule of its TRL callback: diagnose the recording so far at steps % 25 == 0
    seen: set = set()
    first_seen, halt_step, policy = [], None, HaltPolicy()
    for i, r in enumerate(records):
        if r.step == 0 or r.step % 25 != 0:
            continue
        now = diagnose_view(RunView(reader.manifest, records[: i + 1]))
        for f in now:
            if (f.signature_id, f.severity) not in seen:
                seen.add((f.signature_id, f.severity))
                first_seen.append(
                    {"step": r.step, "signature": f.signature_id, "severity": f.severity}
                )
        if halt_step is None and policy.should_halt(now) is not None:
            halt_step = r.step
    return {"findings": findings, "live_first_seen": first_seen, "default_halt_step": halt_step}


def run_lld(path: Path, python: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    out = subprocess.run(
        [python, "-m", "lld_monitor.cli", "analyze", "--json", str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-500:]}
    d = json.loads(out.stdout)
    return {
        "alerts": [
            {
                "step": a["step"],
                "kind": a["kind"],
                "severity": a["severity"],
                "message": a["message"],
            }
            for a in d["alerts"]
        ],
        "phases": d["phases"],
        "collapse_step": d["collapse_step"],
        "signals_missing": d["signals"].get("missing", []),
    }


def _short(text: str, n: int = 110) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def print_summary(name: str, res: dict) -> None:
    print(f"=== {name}  ({res['rows']} logged steps, {res['first_step']}..{res['last_step']})")
    lld = res["lld_monitor"]
    if "error" in lld:
        print("  lld_monitor: ERROR", _short(lld["error"]))
    else:
        phases = ", ".join(f"{p['phase']} {p['start_step']}-{p['end_step']}" for p in lld["phases"])
        print(f"  lld_monitor: phases {phases}; collapse step {lld['collapse_step']}")
        for a in lld["alerts"]:
            print(f"    step {a['step']} [{a['severity']}] {a['kind']}: {_short(a['message'])}")
    print(f"  rlwatch: {len(res['rlwatch']['alerts'])} alerts")
    for a in res["rlwatch"]["alerts"]:
        print(f"    step {a['step']} [{a['severity']}] {a['detector']}: {_short(a['message'])}")
    doc = res["rldoctor"]
    print(f"  rldoctor (post hoc): {len(doc['findings'])} findings >= WARNING")
    for f in doc["findings"]:
        print(f"    [{f['severity']}] {f['detector']}: {_short(f['summary'])}")
    for f in doc["live_first_seen"]:
        print(f"    live: first at step {f['step']} [{f['severity']}] {f['detector']}")
    probe = res["rlprobe"]
    n, halt = len(probe["findings"]), probe["default_halt_step"]
    print(f"  rlprobe (post hoc): {n} findings; default halt step {halt}")
    for f in probe["findings"]:
        print(
            f"    [{f['severity']}] {f['signature']} onset {f['onset']} conf {f['confidence']}: "
            f"{_short(f['explanation'])}"
        )
    for f in probe["live_first_seen"]:
        print(f"    live: first at step {f['step']} [{f['severity']}] {f['signature']}")


def live_toy(preset: str, seed: int, steps: int, out: Path, peers_site: str) -> dict:
    """Train a toy run (LLDS off) with LLDMonitor and the three peers' TRL callbacks attached.

    Needs the project's environment (torch, trl); the peers come from `peers_site`, appended
    after this environment's own packages so that nothing of ours is shadowed.
    """
    sys.path.append(peers_site)
    from rl_doctor.integrations.trl import RLDoctorCallback
    from rlprobe.doctor.live import HaltPolicy
    from rlprobe.integrations.trl import RlprobeCallback
    from rlwatch.config import RLWatchConfig
    from rlwatch.core import RLWatch

    from lld_monitor.llds import LLDSConfig
    from lld_monitor.monitor import LLDMonitor
    from lld_monitor.toy.train import preset_configs, train_toy

    cfg = preset_configs(steps, seed)[preset]
    tmp = Path(tempfile.mkdtemp(prefix="peers_live_"))
    found: dict = {"rldoctor": [], "rlprobe": []}
    monitor = LLDMonitor(
        out / "run",
        llds=LLDSConfig(enabled=False),
        auto_llds=False,
        probe_fraction=1.0,
        token_samples_per_step=0,  # as the sample runs
    )
    config = RLWatchConfig()
    config.framework, config.run_id, config.storage.log_dir = "trl", "live", str(tmp / "rlwatch")
    watch = RLWatch(config)
    halt = HaltPolicy()

    def attach(trainer) -> None:
        monitor.attach(trainer)
        watch.start()
        watch.attach_to_trainer(trainer)
        doctor = RLDoctorCallback()
        doctor.monitor.on_finding = lambda f: found["rldoctor"].append(
            {
                "step": trainer.state.global_step,
                "detector": f.detector,
                "severity": f.severity.name,
                "summary": f.summary,
            }
        )
        trainer.add_callback(doctor)

        def on_probe(f) -> None:
            found["rlprobe"].append(
                {
                    "step": trainer.state.global_step,
                    "signature": f.signature_id,
                    "severity": f.severity,
                    "explanation": f.explanation,
                    "would_halt": halt.should_halt([f]) is not None,
                }
            )

        trainer.add_callback(RlprobeCallback(tmp / "rlprobe", trainer=trainer, on_finding=on_probe))

    error = None
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            train_toy(cfg, attach=attach, progress=False)
    except BaseException as exc:
        error = exc
        raise
    finally:
        monitor.close(error)
    found["rlwatch"] = [
        {"step": a["step"], "detector": a["detector"], "severity": a["severity"]}
        for a in watch.store.get_alerts("live")
    ]
    watch.stop()
    found["lld_monitor"] = run_lld(out / "run", sys.executable)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="*", type=Path, help="run folders or trainer_state.json files")
    ap.add_argument("--live-toy", metavar="PRESET", help="train this toy preset live instead")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", type=Path, default=Path("/tmp/peers-live"))
    ap.add_argument("--peers-site", help="the scratch venv's site-packages (for --live-toy)")
    default_lld = REPO / ".venv" / "bin" / "python"
    ap.add_argument(
        "--lld-python", default=str(default_lld) if default_lld.exists() else sys.executable
    )
    ap.add_argument("--json", type=Path, help="also write all results to this JSON file")
    args = ap.parse_args()
    if args.live_toy:
        if not args.peers_site:
            ap.error(
                "--live-toy needs --peers-site (e.g. /tmp/peers-venv/lib/python3.11/site-packages)"
            )
        res = live_toy(args.live_toy, args.seed, args.steps, args.out, args.peers_site)
        print(json.dumps(res, indent=1))
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
        return
    if not args.inputs:
        ap.error("give run folders or trainer_state.json files, or --live-toy PRESET")
    print("transformers:", _ensure_transformers())
    results = {}
    for path in args.inputs:
        logs = load_trl_logs(path)
        if not logs:
            print(f"=== {path}: no training rows")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            res = {
                "rows": len(logs),
                "first_step": logs[0]["step"],
                "last_step": logs[-1]["step"],
                "lld_monitor": run_lld(path, args.lld_python),
                "rlwatch": run_rlwatch(logs, Path(tmp)),
                "rldoctor": run_rldoctor(logs),
                "rlprobe": run_rlprobe(logs, Path(tmp)),
            }
        results[str(path)] = res
        print_summary(str(path), res)
    if args.json:
        args.json.write_text(
            json.dumps(results, indent=1, default=lambda o: None if o is None else str(o))
        )


if __name__ == "__main__":
    main()
