"""Benchmark long logs: ``lld-monitor analyze`` of a W&B history CSV of 100k and 1M rows, this
checkout side by side with a baseline revision, in one run on the same files.

    python benchmarks/bench_scale.py                         # 100k and 1M rows vs 262f979
    python benchmarks/bench_scale.py --rows 100000 --repeats 3
    python benchmarks/bench_scale.py --baseline HEAD~3       # any revision of this repository
    python benchmarks/bench_scale.py --baseline none         # this checkout alone

Each file is a SIMULATED collapsing run (``make_run``) written as a W&B history export: 8 columns
(``_step``, ``train/reward``, ``train/reward_std``, ``train/loss``, ``train/grad_norm``,
``train/entropy``, ``train/kl``, ``train/completion_length``), about 67 bytes a row. The
baseline is the revision's tree (``git archive``) imported instead of this checkout, in the same
virtual environment. Each command runs as a child process, imports included (what a user
waits for); the arms alternate within each round and the best round is kept. Wall time, and
peak resident memory from the child's own rusage (``os.wait4``): as a multiple of the file, and
above the interpreter's baseline (the same command on a one-row file: Python, numpy, pandas).

Targets (issue 34): 100k rows <= 2 s, 1M rows <= 15 s with peak memory <= 3x the file (judged
on files of ``MEMORY_TARGET_ROWS`` rows or more: a 100k-row file is 6 MB, a sixteenth of what
the interpreter with pandas needs on its own; its figure is printed, not judged). Peak memory is
the largest resident set of the command or of a process it forked (the replay's second process,
``analysis/parallel.py``: it shares the pages it inherits). The output of both arms must be the
same analysis (the alerts are compared). Exit 1 on a missed target.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = "262f979"  # main before issue 34's work
TARGET_S = {100_000: 2.0, 1_000_000: 15.0}
MEMORY_TARGET = 3.0  # peak memory <= this x the file ...
MEMORY_TARGET_ROWS = 1_000_000  # ... for files of this many rows or more


def write_wandb_csv(path: Path, n: int, seed: int = 0) -> int:
    """A W&B history CSV of ``n`` rows (a simulated collapsing run); its size in bytes."""
    import pandas as pd

    from lld_monitor import columns as C
    from lld_monitor.testing import make_run

    df = make_run("collapse", n_steps=n, seed=seed).steps
    pd.DataFrame(
        {
            "_step": df[C.STEP].astype(int),
            "train/reward": df[C.REWARD_MEAN].round(6),
            "train/reward_std": df[C.REWARD_STD].round(6),
            "train/loss": df[C.LOSS].round(6),
            "train/grad_norm": df[C.GRAD_NORM].round(6),
            "train/entropy": df[C.ENTROPY].round(6),
            "train/kl": df[C.KL].round(6),
            "train/completion_length": df[C.COMPLETION_LENGTH].round(3),
        }
    ).to_csv(path, index=False)
    return path.stat().st_size


def extract(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (``git archive``) under ``into``; its root."""
    blob = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "lld_monitor"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_analyze(code_root: Path, path: Path) -> tuple[float, int, dict]:
    """``python -m lld_monitor.cli analyze --json PATH`` importing the package from
    ``code_root``: (wall seconds, peak RSS bytes, the JSON)."""
    env = dict(os.environ, PYTHONPATH=str(code_root), HF_HUB_OFFLINE="1")
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "lld_monitor.cli", "analyze", "--json", str(path)],
            cwd=code_root,
            env=env,
            stdout=out,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.returncode != 0:
            raise SystemExit(
                f"analyze failed in {code_root} (exit {proc.returncode}): {err[-800:]}"
            )
        out.seek(0)
        result = json.loads(out.read())
    return wall, usage.ru_maxrss * 1024, result  # (ru_maxrss is in KiB on Linux)


def _alerts(result: dict) -> list:
    return [(a["step"], a["kind"], a["severity"]) for a in result.get("alerts", [])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--repeats", type=int, default=2, help="rounds (best kept)")
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="a git revision, or 'none'")
    p.add_argument("--write", nargs=2, metavar=("PATH", "ROWS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write:  # (the child that writes one file)
        sys.path.insert(0, str(REPO))
        write_wandb_csv(Path(args.write[0]), int(args.write[1]))
        return 0

    ok = True
    with tempfile.TemporaryDirectory(prefix="lld-bench-scale-") as tmp:
        tmp_path = Path(tmp)
        arms = [("now", REPO)]
        if args.baseline.lower() != "none":
            base = extract(args.baseline, tmp_path / "baseline")
            arms.append((f"baseline {args.baseline}", base))
        tiny = tmp_path / "one_row.csv"
        tiny.write_text("_step,train/reward\n1,0.5\n")
        floor = {name: run_analyze(root, tiny)[1] for name, root in arms}
        print(
            "interpreter baseline (analyze of a one-row file): "
            + ", ".join(f"{name} {rss / 2**20:.0f} MB" for name, rss in floor.items())
        )
        for n in args.rows:
            path = tmp_path / f"wandb_{n}.csv"
            t0 = time.perf_counter()
            # written by a child process: this one stays small, and a child's peak RSS (its
            # rusage) never counts pages of the parent it was forked from
            subprocess.run(
                [sys.executable, __file__, "--write", str(path), str(n)], check=True, cwd=REPO
            )
            size = path.stat().st_size
            print(
                f"\n{n:,} rows: {path.name} {size / 2**20:.1f} MB "
                f"(written in {time.perf_counter() - t0:.1f} s)"
            )
            best: dict[str, tuple[float, int]] = {}
            answers: dict[str, list] = {}
            for r in range(args.repeats):
                for name, root in arms if r % 2 == 0 else arms[::-1]:
                    wall, rss, result = run_analyze(root, path)
                    answers[name] = _alerts(result)
                    w0, m0 = best.get(name, (float("inf"), 0))
                    best[name] = (min(w0, wall), max(m0, rss))
                    print(f"  round {r + 1} {name}: {wall:.2f} s, peak {rss / 2**20:.0f} MB")
            target = TARGET_S.get(n)
            for name, (wall, rss) in best.items():
                over = (rss - floor[name]) / size
                print(
                    f"  {name:>18}: {wall:6.2f} s  peak {rss / 2**20:5.0f} MB = "
                    f"{rss / size:4.1f}x the file ({over:3.1f}x above the interpreter), "
                    f"{len(answers[name])} alerts"
                )
            now_wall, now_rss = best["now"]
            if len(arms) > 1:
                b_wall, b_rss = best[arms[1][0]]
                ratio_t, ratio_m = now_wall / b_wall, now_rss / b_rss
                print(f"  ratio now/baseline: time {ratio_t:.2f}, memory {ratio_m:.2f}")
                same = answers["now"] == answers[arms[1][0]]
                print(f"  same alerts as the baseline: {'yes' if same else 'NO'}")
                ok &= same
            if target is not None:
                t_ok = now_wall <= target
                print(f"  time target <= {target:g} s: {'PASS' if t_ok else 'FAIL'}")
                ok &= t_ok
            judged = n >= MEMORY_TARGET_ROWS
            m_ok = now_rss <= MEMORY_TARGET * size or not judged
            verdict = ("PASS" if m_ok else "FAIL") if judged else "not judged below 1M rows"
            print(
                f"  memory target peak <= {MEMORY_TARGET:g}x the file: {verdict}"
                f" ({now_rss / size:.1f}x; above the interpreter "
                f"{(now_rss - floor['now']) / size:.1f}x; the interpreter alone "
                f"{floor['now'] / size:.1f}x)"
            )
            ok &= m_ok
    print("\nresult:", "PASS (all targets met)" if ok else "FAIL (some target missed)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
