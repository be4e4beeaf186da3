"""The monitor built from its config (issue 52, item 1): every keyword works as before and
gives the same monitor as ``config=MonitorConfig(...)`` (same settings, same meta.json config);
an unknown keyword names the valid ones; the config checks itself."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from lld_monitor import LLDMonitor, LLDSConfig, MonitorConfig
from lld_monitor.sinks import ConsoleSink


def _correct(rewards, advantages, per_func=None):
    return rewards > 0


SINK = ConsoleSink()
VALUES = {
    "llds": LLDSConfig(lam=0.3),
    "probe_fraction": 0.5,
    "correct_fn": _correct,
    "correct_threshold": 0.5,
    "correct_reward": "acc",
    "sinks": (SINK,),
    "detector": None,
    "auto_llds": True,
    "auto_llds_on": ("decay",),
    "stop_on_collapse": True,
    "checkpoint_on_collapse": True,
    "token_samples_per_step": 2,
    "response_samples_per_step": 1,
    "strict": True,
    "meta": {"note": "x"},
    "llds_with_dropout": True,
    "resume": True,
    "llds_watchdog": True,
}


def test_every_setting_has_a_sample_value():
    assert set(VALUES) == {f.name for f in fields(MonitorConfig)}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_a_keyword_and_config_give_the_same_monitor(tmp_path, name):
    value = VALUES[name]
    by_kw = LLDMonitor(tmp_path / "kw", **{name: value})
    by_cfg = LLDMonitor(tmp_path / "cfg", config=MonitorConfig(**{name: value}))
    assert by_kw.config == by_cfg.config == MonitorConfig(**{name: value})
    assert getattr(by_kw.config, name) == value or name == "probe_fraction"
    for m in (by_kw, by_cfg):
        m.start()
        m.close()
    saved = [json.loads((tmp_path / d / "meta.json").read_text())["config"] for d in ("kw", "cfg")]
    assert saved[0] == saved[1]
    if name != "meta":
        assert saved[0] != _default_saved(tmp_path) or name in ("sinks", "strict", "resume")


def _default_saved(tmp_path):
    m = LLDMonitor(tmp_path / "default")
    m.start()
    m.close()
    return json.loads((tmp_path / "default" / "meta.json").read_text())["config"]


def test_overrides_win_over_config_and_unknown_keywords_name_the_valid_ones(tmp_path):
    m = LLDMonitor(tmp_path / "a", config=MonitorConfig(auto_llds=True), probe_fraction=0.1)
    assert m.config.auto_llds and m.config.probe_fraction == 0.1
    with pytest.raises(TypeError, match=r"unknown LLDMonitor setting\(s\) \['probe_fractoin'\]"):
        LLDMonitor(tmp_path / "b", probe_fractoin=0.1)
    with pytest.raises(TypeError, match="probe_fraction"):
        MonitorConfig().with_overrides(nope=1)
    with pytest.raises(ValueError, match=r"config must be an lld_monitor\.MonitorConfig"):
        LLDMonitor(tmp_path / "c", config={"auto_llds": True})


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"probe_fraction": 1.5}, "probe_fraction must be in"),
        ({"token_samples_per_step": -1}, "token_samples_per_step must be >= 0"),
        ({"response_samples_per_step": 1.5}, "response_samples_per_step must be >= 0"),
        ({"llds": {"lam": 0.2}}, r"llds must be an lld_monitor\.LLDSConfig"),
    ],
)
def test_the_config_checks_itself(kw, match):
    with pytest.raises(ValueError, match=match):
        MonitorConfig(**kw)
