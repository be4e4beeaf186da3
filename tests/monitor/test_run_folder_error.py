"""An unwritable run folder fails fast, before training, with what to do."""

from __future__ import annotations

import pytest

from lld_monitor import LLDMonitor
from lld_monitor.monitor.core import RunFolderError


def test_a_run_folder_that_cannot_be_created_fails_at_start_with_what_to_do(tmp_path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monitor = LLDMonitor(blocker / "run", detector=None)
    with pytest.raises(RunFolderError) as info:
        monitor.start()
    msg = str(info.value)
    assert str(blocker / "run") in msg and "pass a run_dir" in msg and "nothing was trained" in msg
    assert isinstance(info.value, OSError)  # callers catching OSError still catch it
    assert isinstance(info.value.__cause__, OSError)


def test_an_existing_run_folder_keeps_its_own_hint(tmp_path) -> None:
    LLDMonitor(tmp_path / "run", detector=None).start()
    with pytest.raises(FileExistsError, match="resume"):
        LLDMonitor(tmp_path / "run", detector=None).start()
