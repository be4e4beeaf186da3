"""Record this machine's re-run of the stored demo runs, for a CPU whose floats differ.

    python scripts/record_drift_reference.py NAME      # -> tests/fixtures/drift_platforms/NAME/

CPU training of the toy is deterministic for one machine and one set of package versions, but
two CPUs of one instruction-set level (``torch.backends.cpu.get_cpu_capability()``) can still
give other floats (other kernels: a CPU with or without AVX512-BF16 / AMX), and a run diverges
from its first sampled rollout. ``tests/toy/test_sample_runs_drift.py`` compares a short re-run
with ``sample_runs/`` and, failing that, with each reference recorded here: a platform's
reference must be recorded with code whose training is known to match ``sample_runs/`` (the
commit that made them, or one whose re-run matched them on their machine), and says so in its
``platform.json``. The re-run is the test's own: the demo preset's first 41 updates, LLDS off
and automatic.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "drift_platforms"
ROWS = 41  # the drift test compares 40 rows of a 41-update re-run
KEEP = ("meta.json", "steps.jsonl", "events.jsonl", "closed.json")


def _cpu() -> dict[str, object]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"cpu_model": platform.processor()}
    flags = text.split("flags", 1)[1].split("\n", 1)[0].split() if "flags" in text else []
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if "model name" in ln), ""
    )
    absent = ("avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")
    return {
        "cpu_model": model,
        "avx512_flags": sorted(f for f in flags if f.startswith("avx512")),
        "absent": [f for f in absent if f not in flags],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", help="a short name of the CPU kind, e.g. avx512-no-bf16-amx")
    args = p.parse_args(argv)
    import torch

    from lld_monitor.cli.demo import DEMO_PRESET, DEMO_SEED
    from lld_monitor.toy.train import monitored_run, preset_configs

    dest = OUT / args.name
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("off", "auto"):
            cfg = preset_configs(ROWS, DEMO_SEED)[DEMO_PRESET]
            monitored_run(
                cfg, Path(tmp) / mode, llds=mode, progress=False, token_samples_per_step=0
            )
            (dest / mode).mkdir(parents=True, exist_ok=True)
            for name in KEEP:
                shutil.copy2(Path(tmp) / mode / name, dest / mode / name)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    info = {
        "what": f"the first {ROWS} updates of the demo preset ({DEMO_PRESET}, seed {DEMO_SEED}), "
        "LLDS off and auto, as tests/toy/test_sample_runs_drift.py re-runs them",
        "made_with": f"lld_monitor {commit or '?'} (scripts/record_drift_reference.py)",
        **_cpu(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }
    (dest / "platform.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"recorded {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
