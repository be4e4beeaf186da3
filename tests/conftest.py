"""Shared test setup: offline, CPU, deterministic."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest

#: Real GRPO logs published by others (shared beside the repository, never copied into it).
REAL_RUNS = Path(__file__).resolve().parents[1].parent / "shared" / "real_runs"
_NOT_LOGS = ("README.md", "verdicts.tsv")  # the folder's description and its human verdicts
_ABSENT = f"real logs absent: no {REAL_RUNS} (the shared folder beside the repository)"


def real_run_files() -> list[Path]:
    """Every log file in the shared real-runs folder (empty when the folder is absent)."""
    if not REAL_RUNS.is_dir():
        return []
    return sorted(p for p in REAL_RUNS.iterdir() if p.is_file() and p.name not in _NOT_LOGS)


@pytest.fixture
def real_runs() -> Path:
    """The shared real-runs folder; the test is skipped, saying so, when it is absent."""
    if not REAL_RUNS.is_dir():
        pytest.skip(_ABSENT)
    return REAL_RUNS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``real_run_file`` runs once per shared real log (skipped without them)."""
    if "real_run_file" not in metafunc.fixturenames:
        return
    files = real_run_files()
    if files:
        metafunc.parametrize("real_run_file", files, ids=[p.name[:50] for p in files])
    else:
        metafunc.parametrize("real_run_file", [pytest.param(None, marks=pytest.mark.skip(_ABSENT))])
