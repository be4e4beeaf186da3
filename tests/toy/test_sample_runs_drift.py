"""The stored sample runs match today's code: a short re-run compared step for step.

CPU training of the toy is deterministic for one set of package versions and one CPU, so the
first rows of a re-run equal the stored run's exactly (wall time aside) and so do its alerts and
LLDS switches over those rows. The pinned versions are ``constraints.txt`` (what ``make venv``
installs); the stored runs' versions and CPU instruction set are in ``sample_runs/manifest.json``.
Two CPUs of one instruction-set level can still give other floats (other kernels), and a re-run
then diverges from its first rollout: such a CPU's re-run, recorded with code known to match the
stored runs, is a reference of its own (``tests/fixtures/drift_platforms/<cpu>/``, written by
``scripts/record_drift_reference.py``). The re-run must equal the stored run or one of those.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lld_monitor.toy.compare import steps_drift

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_runs"
PLATFORMS = ROOT / "tests" / "fixtures" / "drift_platforms"
ROWS = 40  # two rollout batches' worth of the s1 preset's first one and a bit: LLDS on at 14


def _pinned() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#") and "==" in line:
            name, version = line.split("==", 1)
            pins[name.lower().replace("_", "-")] = version.strip()
    return pins


def test_the_constraints_pin_what_the_runs_depend_on_and_are_installed():
    import importlib.metadata as md

    pins = _pinned()
    for pkg in ("transformers", "trl", "accelerate", "tokenizers", "numpy", "datasets"):
        assert pkg in pins, f"constraints.txt does not pin {pkg}"
        assert md.version(pkg) == pins[pkg], (
            f"{pkg} {md.version(pkg)} is installed, constraints.txt pins {pins[pkg]}: install "
            "with `make venv` (pip install -c constraints.txt), or after a deliberate upgrade run "
            "`make constraints` and regenerate sample_runs/"
        )
    manifest = json.loads((SAMPLE / "manifest.json").read_text())
    for key in ("versions", "auto_versions"):
        made_with = manifest[key]
        for pkg in ("transformers", "trl", "accelerate"):
            assert made_with[pkg] == pins[pkg], (
                f"sample runs ({key}) made with {pkg} {made_with[pkg]}"
            )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["off", "auto"])
def test_a_short_rerun_matches_the_stored_demo_run_step_for_step(tmp_path, mode):
    from lld_monitor.cli.demo import DEMO_PRESET, DEMO_SEED
    from lld_monitor.toy.train import monitored_run, preset_configs

    manifest = json.loads((SAMPLE / "manifest.json").read_text())
    made_on = manifest["auto_versions"].get("cpu_capability")
    here = torch.backends.cpu.get_cpu_capability()
    if made_on and made_on != here:
        pytest.skip(f"stored runs made on a {made_on} CPU, this one is {here}: floats differ")
    stored = SAMPLE / "auto" / f"{DEMO_PRESET}-seed{DEMO_SEED}-{mode}"
    # one update more than compared: the monitor probes the batch in hand when training ends,
    # so the last row of a short run holds a measurement the long run makes elsewhere
    cfg = preset_configs(ROWS + 1, DEMO_SEED)[DEMO_PRESET]
    threads = torch.get_num_threads()
    try:
        monitored_run(cfg, tmp_path / mode, llds=mode, progress=False, token_samples_per_step=0)
    finally:
        torch.set_num_threads(threads)
    drift = steps_drift(stored, tmp_path / mode, rows=ROWS)
    if drift.same:
        return
    # another CPU's floats: its own recorded re-run, where there is one
    platforms = sorted(p for p in PLATFORMS.iterdir() if (p / mode).is_dir())
    matched = [p.name for p in platforms if steps_drift(p / mode, tmp_path / mode, ROWS).same]
    assert matched, (
        f"{stored.relative_to(ROOT)} no longer matches a re-run of today's code: "
        f"{drift.describe()}; nor does any CPU's recorded re-run "
        f"({[p.name for p in platforms]}, in {PLATFORMS.relative_to(ROOT)}). Regenerate "
        "sample_runs/ (sample_runs/README.md) if the change is meant; on a CPU with other "
        "floats, record its re-run with code that matches the stored runs "
        "(scripts/record_drift_reference.py)."
    )


def test_each_recorded_cpu_reference_holds_both_modes_and_differs_from_the_stored_runs():
    # each CPU's reference holds the compared rows of both modes, says how it was made, and
    # differs from the stored run (else it would not be needed). (On the avx512-no-bf16-amx
    # CPU the off and auto re-runs are equal over these rows: no alert before row 40 there.)
    refs = sorted(p for p in PLATFORMS.iterdir() if p.is_dir())
    assert refs
    for ref in refs:
        info = json.loads((ref / "platform.json").read_text())
        assert info["made_with"] and info["torch_cpu_capability"]
        for mode in ("off", "auto"):
            stored = SAMPLE / "auto" / f"s1-small-32upd-lr3e-3-seed0-{mode}"
            assert not steps_drift(stored, ref / mode, rows=ROWS).same, (ref.name, mode)
            assert steps_drift(ref / mode, ref / mode, rows=ROWS).same
