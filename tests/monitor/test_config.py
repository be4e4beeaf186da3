"""monitor_config.py: the constructor's checks and the run's meta."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import pytest

from lld_monitor import LLDSConfig
from lld_monitor import columns as C
from lld_monitor.analysis import PhaseDetector
from lld_monitor.monitor.actions import ActionPolicy
from lld_monitor.monitor.config import (
    check_llds,
    check_probe_fraction,
    check_run_dir,
    config_meta,
    make_detector,
    run_meta,
)
from lld_monitor.monitor.correctness import CorrectnessRule
from lld_monitor.monitor.token_sampling import TokenSampler


def test_probe_fraction_in_the_unit_interval() -> None:
    assert check_probe_fraction(0) == 0.0
    assert check_probe_fraction(1) == 1.0
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"probe_fraction must be in \[0, 1\]"):
            check_probe_fraction(bad)


def test_llds_config_or_none() -> None:
    assert check_llds(None) == LLDSConfig(enabled=False)
    cfg = LLDSConfig(lam=0.1)
    assert check_llds(cfg) is cfg
    with pytest.raises(ValueError, match=r"llds must be an lld_monitor\.LLDSConfig or None"):
        check_llds({"lam": 0.1})


def test_run_dir_holding_a_run_needs_resume(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    check_run_dir(tmp_path / "new", resume=False)  # nothing there
    (tmp_path / "steps.jsonl").write_text("")
    with pytest.raises(FileExistsError, match=r"already holds a run.*resume=True"):
        check_run_dir(tmp_path, resume=False)
    check_run_dir(tmp_path, resume=True)
    monkeypatch.setenv("RANK", "1")  # a launched rank > 0 leaves the folder to rank 0
    check_run_dir(tmp_path, resume=False)


def test_make_detector() -> None:
    assert isinstance(make_detector(True), PhaseDetector)
    assert make_detector(None) is None and make_detector(False) is None

    class Custom:
        def update(self, row: dict) -> list:
            return []

    custom = Custom()
    assert make_detector(custom) is custom
    with pytest.raises(ValueError, match=r"detector must be True, None, or an object with update"):
        make_detector("phase")


def test_config_meta_records_every_setting() -> None:
    tokens = TokenSampler(2, 3, True, lambda where: nullcontext())
    meta = config_meta(
        probe_fraction=0.5,
        correctness=CorrectnessRule(None, 0.8, "accuracy"),
        actions=ActionPolicy(True, ("decay",), False, True),
        tokens=tokens,
        llds_with_dropout=False,
        detector=None,
        llds=LLDSConfig(lam=0.1, enabled=False),
    )
    tokens.close()
    assert meta["probe_fraction"] == 0.5
    assert meta["correct_threshold"] == 0.8 and meta["correct_fn"] is None
    assert meta["correctness"]["rule"] == "reward_fn/accuracy >= 0.8"
    assert meta["auto_llds"] is True and meta["auto_llds_on"] == ["decay"]
    assert meta["stop_on_collapse"] is False and meta["checkpoint_on_collapse"] is True
    assert meta["token_samples_per_step"] == 2 and meta["response_samples_per_step"] == 3
    assert meta["detector"] is None and meta["detector_config"] is None
    from lld_monitor.analysis import PhaseDetector

    det = PhaseDetector(**{"level_shift.p_false_run": 0.01})
    meta = config_meta(
        probe_fraction=0.5,
        correctness=CorrectnessRule(None, 0.8, "accuracy"),
        actions=ActionPolicy(True, ("decay",), False, True),
        tokens=TokenSampler(0, 0, True, lambda where: nullcontext()),
        llds_with_dropout=False,
        detector=det,
        llds=LLDSConfig(lam=0.1, enabled=False),
    )
    assert meta["detector"] == "PhaseDetector"
    assert meta["detector_config"] == det.config.to_dict()
    assert meta["detector_config"]["level_shift"]["p_false_run"] == 0.01
    assert meta["llds"] == {
        "enabled": False,
        "lam": 0.1,
        "gate": "action",
        "normalize": "paper",
        "answer_weighting": None,
    }


def test_run_meta_user_meta_wins_and_absent_columns_listed() -> None:
    meta = run_meta("trl", True, {"a": 1}, {"trl_version": "x", "note": "adapter"}, {"note": "me"})
    assert meta == {
        "trainer": "trl",
        "lld_columns": True,
        "config": {"a": 1},
        "trl_version": "x",
        "note": "me",
    }
    meta = run_meta("transformers", False, {}, {}, {})
    assert meta["lld_columns"] is False
    assert meta["lld_columns_absent"] == list(C.LLD_COLUMNS)


# --- MonitorConfig: the frozen form of the constructor's keywords ------------------------------


def test_the_settings_are_declared_once_in_monitor_config() -> None:
    """LLDMonitor(run_dir, config=None, **overrides): the settings are MonitorConfig's fields,
    declared there alone (the constructor no longer repeats them)."""
    import dataclasses
    import inspect

    from lld_monitor import LLDMonitor, MonitorConfig

    params = inspect.signature(LLDMonitor.__init__).parameters
    assert list(params) == ["self", "run_dir", "config", "overrides"]
    assert params["overrides"].kind is inspect.Parameter.VAR_KEYWORD
    assert MonitorConfig().probe_fraction == 0.25
    with pytest.raises(dataclasses.FrozenInstanceError):
        MonitorConfig().auto_llds = True  # type: ignore[misc]


def test_config_and_keyword_forms_build_the_same_monitor(tmp_path: Path) -> None:
    import json

    from lld_monitor import LLDMonitor, LLDSConfig, MonitorConfig

    settings = dict(llds=LLDSConfig(lam=0.1, enabled=False), auto_llds=True, probe_fraction=0.5)
    metas = []
    for name, monitor in (
        ("kw", LLDMonitor(tmp_path / "kw", detector=None, **settings)),
        ("cfg", LLDMonitor(tmp_path / "cfg", MonitorConfig(detector=None, **settings))),
    ):
        assert monitor.config == MonitorConfig(detector=None, **settings)
        monitor.end_step(step=0)
        monitor.close()
        metas.append(json.loads((tmp_path / name / "meta.json").read_text())["config"])
    assert metas[0] == metas[1] and metas[0]["probe_fraction"] == 0.5
    both = LLDMonitor(tmp_path / "both", MonitorConfig(probe_fraction=0.5), auto_llds=True)
    assert both.config == MonitorConfig(probe_fraction=0.5, auto_llds=True)  # overrides win
    with pytest.raises(ValueError, match="MonitorConfig"):
        LLDMonitor(tmp_path / "bad", {"auto_llds": True})  # type: ignore[arg-type]
