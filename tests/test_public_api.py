"""The public paths users write keep working: the flat API, the monitor, verl's Hydra paths."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

import lld_monitor


def test_every_flat_name_resolves() -> None:
    for name in lld_monitor.__all__:
        assert getattr(lld_monitor, name) is not None, name
    with pytest.raises(AttributeError):
        lld_monitor.no_such_name  # noqa: B018


def test_monitor_path() -> None:
    from lld_monitor.monitor import AUTO_LLDS_KINDS, LLDMonitor

    assert LLDMonitor is lld_monitor.LLDMonitor
    assert LLDMonitor.__module__ == "lld_monitor.monitor.core"
    assert "collapse" in AUTO_LLDS_KINDS


def test_moved_modules_keep_their_public_names() -> None:
    from lld_monitor.cli import main
    from lld_monitor.datasets import make_run
    from lld_monitor.importers import FORMATS, ImportFormatError, detect_format, load_table
    from lld_monitor.report import build_figure, write_report
    from lld_monitor.sinks import BaseSink, Sink
    from lld_monitor.testing import make_run as old_make_run

    assert make_run is old_make_run and BaseSink is Sink
    assert callable(main) and callable(build_figure) and callable(write_report)
    assert (
        callable(detect_format)
        and callable(load_table)
        and issubclass(ImportFormatError, ValueError)
    )
    assert list(FORMATS)[:3] == ["lld_run", "tensorboard", "parquet"]


@pytest.mark.parametrize(
    ("module", "attr"),
    [
        ("lld_monitor.integrations.verl", "LLDSPolicyLossConfig"),
        ("lld_monitor.integrations.verl_trainer", None),
    ],
)
def test_verl_hydra_paths(module: str, attr: str | None) -> None:
    """The two paths users write into verl's configs: importable with verl, found without it."""
    assert importlib.util.find_spec(module) is not None
    if importlib.util.find_spec("verl") is None:  # the main environment: a clear ImportError
        with pytest.raises(ImportError):
            importlib.import_module(module)
        return
    mod = importlib.import_module(module)
    if attr is not None:
        assert getattr(mod, attr) is not None
