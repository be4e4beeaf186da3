"""The run log on real files: round trip, torn and garbled lines, live reading, resume, errors."""

from __future__ import annotations

import json
import math
import re
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lld_monitor import columns as C
from lld_monitor.events import Alert, make_event
from lld_monitor.runlog import (
    _FAST_PATH_MIN_BYTES,
    CLOSED_FILE,
    EVENTS_FILE,
    META_FILE,
    SCHEMA_VERSION,
    STEPS_FILE,
    TOKENS_DIR,
    RunFormatError,
    RunReader,
    RunWriter,
    _fast_steps,
    find_runs,
    is_run_dir,
    load_run,
)

REPO = Path(__file__).resolve().parents[1]


def _row(step: int, **extra: float) -> dict[str, float]:
    return {C.STEP: step, C.REWARD_MEAN: step / 10, C.DELTA_CORRECT: -step / 100, **extra}


def _write_run(path: Path, n: int, *, close: bool = True) -> RunWriter:
    w = RunWriter(path, {"trainer": "test"})
    for i in range(n):
        w.log_step(_row(i))
    if close:
        w.close()
    return w


# --- round trip ---------------------------------------------------------------------------------


def test_round_trip_values_types_and_column_order(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    with RunWriter(tmp_path / "run", {"config": {"lr": 1e-6}, "trainer": "trl"}) as w:
        # written out of order on purpose; the loader sorts by step
        w.log_step({"custom": "a", C.STEP: 2, C.REWARD_MEAN: np.float32(0.5), C.TIME: 123.0})
        w.log_step({C.STEP: np.int64(1), C.REWARD_MEAN: torch.tensor(0.25), C.GRAD_NORM: 3})
        w.log_step({C.STEP: 3.0, C.LLDS_ENABLED: True})
    run = load_run(tmp_path / "run")
    steps = run.steps
    assert steps[C.STEP].tolist() == [1, 2, 3]
    assert steps[C.STEP].dtype == np.int64
    # canonical columns first in columns.STEP_COLUMNS order, the rest after in first-seen order
    assert list(steps.columns) == [
        C.STEP,
        C.TIME,
        C.REWARD_MEAN,
        C.GRAD_NORM,
        C.LLDS_ENABLED,
        "custom",
    ]
    assert steps[C.REWARD_MEAN].tolist()[:2] == [0.25, 0.5]  # float32 0.5 is exact
    assert math.isnan(steps[C.REWARD_MEAN].iloc[2])
    assert steps[C.TIME].iloc[1] == 123.0  # a given time is kept
    assert steps[C.TIME].iloc[0] > 1e9  # an absent time is added
    assert run.meta["schema_version"] == SCHEMA_VERSION
    assert run.meta["config"] == {"lr": 1e-6}
    assert run.meta["trainer"] == "trl"
    assert "pandas" in run.meta["versions"]
    assert run.finished


def test_caller_cannot_override_schema_version(tmp_path: Path) -> None:
    RunWriter(tmp_path / "r", {"schema_version": 99}).close()
    assert json.loads((tmp_path / "r" / META_FILE).read_text())["schema_version"] == SCHEMA_VERSION


def test_non_finite_values_are_null_on_disk_and_nan_in_frame(tmp_path: Path) -> None:
    with RunWriter(tmp_path / "r") as w:
        w.log_step({C.STEP: 0, C.LOSS: float("nan"), C.GRAD_NORM: float("inf"), C.KL: 0.5})
        w.log_step({C.STEP: 1, C.LOSS: 1.5, C.GRAD_NORM: -np.inf, C.KL: np.float64("nan")})
    lines = (tmp_path / "r" / STEPS_FILE).read_text().splitlines()
    first, second = json.loads(lines[0]), json.loads(lines[1])
    assert first[C.LOSS] is None and first[C.GRAD_NORM] is None and first[C.KL] == 0.5
    assert second[C.GRAD_NORM] is None and second[C.KL] is None
    assert "NaN" not in "".join(lines) and "Infinity" not in "".join(lines)  # plain JSON only
    steps = load_run(tmp_path / "r").steps
    assert steps[C.GRAD_NORM].dtype == np.float64  # an all-null column is still numeric
    assert steps[C.GRAD_NORM].isna().all()
    assert math.isnan(steps[C.LOSS].iloc[0]) and steps[C.LOSS].iloc[1] == 1.5


def test_bad_step_rows_are_rejected_with_a_clear_error(tmp_path: Path) -> None:
    with RunWriter(tmp_path / "r") as w:
        with pytest.raises(ValueError, match="needs a 'step' key"):
            w.log_step({C.LOSS: 1.0})
        with pytest.raises(ValueError, match="must be an integer"):
            w.log_step({C.STEP: 1.5})
        with pytest.raises(TypeError, match="cannot store a object"):
            w.log_step({C.STEP: 1, "bad": object()})
    assert load_run(tmp_path / "r").steps.empty


def test_events_round_trip_and_validation(tmp_path: Path) -> None:
    alert = Alert(7, "decay", "warning", "delta_correct fell 3 steps running", {"slope": -0.2})
    with RunWriter(tmp_path / "r") as w:
        w.log_event(alert.to_event())
        w.log_event(make_event("intervention", 8, "llds_on", "LLDS switched on", "info"))
        with pytest.raises(ValueError, match="must be one of"):
            w.log_event({C.EVENT_TYPE: "nonsense", C.EVENT_KIND: "x"})
    events = load_run(tmp_path / "r").events
    # start lifecycle, the alert, the intervention, the end lifecycle
    assert events[C.EVENT_KIND].tolist() == ["start", "decay", "llds_on", "end"]
    assert events[C.EVENT_STEP].tolist()[1:3] == [7, 8]
    # lifecycle events carry no step here: start precedes any step, end has no step logged
    assert events[C.EVENT_STEP].isna().tolist() == [True, False, False, True]
    assert events[C.EVENT_EVIDENCE].iloc[1] == {"slope": -0.2}
    assert events[C.EVENT_SEVERITY].iloc[1] == "warning"


# --- torn and garbled lines ---------------------------------------------------------------------


def test_torn_last_line_is_skipped_and_earlier_rows_kept(tmp_path: Path) -> None:
    _write_run(tmp_path / "r", 5, close=False)._steps.close()  # crash: never closed
    line = json.dumps(_row(5))
    with open(tmp_path / "r" / STEPS_FILE, "a") as f:
        f.write(line[: len(line) // 2])  # half a line, as a crash mid-write leaves it
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn last line is expected: no warning
        run = load_run(tmp_path / "r")
    assert run.steps[C.STEP].tolist() == [0, 1, 2, 3, 4]
    assert not run.finished
    assert run.skipped_lines[STEPS_FILE] == 0


def test_garbled_middle_line_is_skipped_with_a_warning_count(tmp_path: Path) -> None:
    path = tmp_path / "r"
    _write_run(path, 3)
    lines = (path / STEPS_FILE).read_text().splitlines(keepends=True)
    lines.insert(1, '{"step": 9, "loss": \n')  # garbled
    lines.insert(3, "[1, 2]\n")  # valid JSON but not a row
    (path / STEPS_FILE).write_text("".join(lines))
    with pytest.warns(RuntimeWarning, match=r"skipped 2 garbled line\(s\)"):
        run = load_run(path)
    assert run.steps[C.STEP].tolist() == [0, 1, 2]
    assert run.skipped_lines[STEPS_FILE] == 2


def test_reader_does_not_consume_a_partial_line_until_complete(tmp_path: Path) -> None:
    path = tmp_path / "r"
    w = _write_run(path, 2, close=False)
    reader = RunReader(path)
    assert reader.read_steps()[C.STEP].tolist() == [0, 1]
    line = json.dumps(_row(2)) + "\n"
    with open(path / STEPS_FILE, "a") as f:
        f.write(line[:10])
        f.flush()
        assert reader.read_steps().empty  # partial: left for the next read
        f.write(line[10:])
    assert reader.read_steps()[C.STEP].tolist() == [2]
    assert reader.read_steps().empty  # nothing new
    w.close()


def test_reader_racing_a_writer_reads_every_row_exactly_once_in_order(tmp_path: Path) -> None:
    path = tmp_path / "r"
    n = 3000
    w = RunWriter(path, fsync_every_s=0.01)
    reader = RunReader(path)
    payload = {c: 0.123456789 for c in C.STANDARD_COLUMNS + C.LLD_COLUMNS}  # long lines

    def produce() -> None:
        for i in range(n):
            w.log_step({C.STEP: i, **payload})
            if i % 500 == 0:
                w.log_event(make_event("phase", i, "healthy", "still healthy"))
        w.close()

    thread = threading.Thread(target=produce)
    thread.start()
    seen: list[int] = []
    n_events = 0
    reads = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = reader.finished  # read before the rows: finished => every row is on disk
        seen.extend(reader.read_steps()[C.STEP].tolist())
        n_events += len(reader.read_events())
        reads += 1
        if done:
            break
    thread.join()
    assert seen == list(range(n))
    assert n_events == 2 + n // 500  # start, 6 phase events, end
    assert reader.skipped_lines == {STEPS_FILE: 0, EVENTS_FILE: 0}
    assert reads > 1  # it really read while the writer wrote


def test_concurrent_log_step_from_threads_never_interleaves(tmp_path: Path) -> None:
    w = RunWriter(tmp_path / "r")
    threads = [
        threading.Thread(target=lambda k=k: [w.log_step(_row(k * 1000 + i)) for i in range(300)])
        for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        steps = load_run(tmp_path / "r").steps[C.STEP].tolist()
    assert steps == sorted(k * 1000 + i for k in range(4) for i in range(300))


# --- lifecycle and resume -----------------------------------------------------------------------


def test_finished_only_after_close_and_error_exit_is_recorded(tmp_path: Path) -> None:
    w = _write_run(tmp_path / "a", 2, close=False)
    assert not load_run(tmp_path / "a").finished
    w.close()
    w.close()  # idempotent
    assert load_run(tmp_path / "a").finished
    with pytest.raises(ValueError, match="is closed"):
        w.log_step(_row(3))

    with pytest.raises(KeyError), RunWriter(tmp_path / "b") as w2:
        w2.log_step(_row(0))
        raise KeyError("boom")
    closed = json.loads((tmp_path / "b" / CLOSED_FILE).read_text())
    assert closed["closed"] is True and closed["outcome"] == "error" and closed["last_step"] == 0
    end = load_run(tmp_path / "b").events.iloc[-1]
    assert end[C.EVENT_KIND] == "end" and end[C.EVENT_SEVERITY] == "critical"
    assert "KeyError" in end[C.EVENT_MESSAGE]


def test_resume_appends_and_refuses_without_resume(tmp_path: Path) -> None:
    path = tmp_path / "r"
    _write_run(path, 3)
    with pytest.raises(FileExistsError, match="resume=True"):
        RunWriter(path)
    w = RunWriter(path, resume=True)
    assert not load_run(path).finished  # running again
    w.log_step(_row(2, **{C.LOSS: 9.0}))  # a restart from a checkpoint repeats step 2
    w.log_step(_row(3))
    w.close()
    run = load_run(path)
    assert run.steps[C.STEP].tolist() == [0, 1, 2, 3]
    assert run.steps.loc[run.steps[C.STEP] == 2, C.LOSS].item() == 9.0  # the last row wins
    assert run.events[C.EVENT_KIND].tolist() == ["start", "end", "resume", "end"]
    assert run.finished


def test_resume_after_a_crash_drops_the_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "r"
    _write_run(path, 2, close=False)._steps.close()
    with open(path / STEPS_FILE, "a") as f:
        f.write('{"step": 2, "reward_me')  # the crash
    with RunWriter(path, resume=True) as w:
        w.log_step(_row(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no garbled line left behind
        run = load_run(path)
    assert run.steps[C.STEP].tolist() == [0, 1, 2]
    resume = run.events[run.events[C.EVENT_KIND] == "resume"][C.EVENT_MESSAGE].item()
    assert "dropped a torn last line of 22 bytes" in resume  # len('{"step": 2, "reward_me')


# --- bad input ----------------------------------------------------------------------------------


def test_schema_from_the_future_names_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "r"
    _write_run(path, 1)
    meta = json.loads((path / META_FILE).read_text())
    meta["schema_version"] = SCHEMA_VERSION + 41
    (path / META_FILE).write_text(json.dumps(meta))
    message = f"schema version {SCHEMA_VERSION + 41}.*up to version {SCHEMA_VERSION}"
    with pytest.raises(RunFormatError, match=message):
        load_run(path)
    with pytest.raises(RunFormatError, match=message):
        RunReader(path)
    with pytest.raises(RunFormatError, match=message):
        RunWriter(path, resume=True)


def test_missing_folder_file_and_non_run_errors(tmp_path: Path) -> None:
    with pytest.raises(RunFormatError, match="no such run folder"):
        load_run(tmp_path / "nope")
    (tmp_path / "log.csv").write_text("step,loss\n1,2\n")
    with pytest.raises(RunFormatError, match=r"is a file, not a run folder.*load_table"):
        load_run(tmp_path / "log.csv")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / STEPS_FILE).write_text("")
    with pytest.raises(RunFormatError, match=r"expected meta\.json and steps\.jsonl, missing meta"):
        load_run(tmp_path / "half")
    _write_run(tmp_path / "parent" / "child", 1)
    with pytest.raises(RunFormatError, match=r"contains 1 run\(s\)"):
        load_run(tmp_path / "parent")
    assert isinstance(RunFormatError("x"), ValueError)


def test_unreadable_meta_is_a_run_format_error(tmp_path: Path) -> None:
    _write_run(tmp_path / "r", 1)
    (tmp_path / "r" / META_FILE).write_text('{"schema_version": 1,')
    with pytest.raises(RunFormatError, match="unreadable run metadata"):
        load_run(tmp_path / "r")


def test_find_runs_and_is_run_dir(tmp_path: Path) -> None:
    for name in ["b", "a/x", "a/y/z", ".hidden/q"]:
        _write_run(tmp_path / name, 1)
    (tmp_path / "empty").mkdir()
    assert find_runs(tmp_path) == [tmp_path / "a/x", tmp_path / "a/y/z", tmp_path / "b"]
    assert find_runs(tmp_path / "b") == [tmp_path / "b"]
    assert is_run_dir(tmp_path / "b") and not is_run_dir(tmp_path / "empty")
    with pytest.raises(RunFormatError, match="no such folder"):
        find_runs(tmp_path / "missing")


# --- tokens -------------------------------------------------------------------------------------


def _tokens(n: int) -> list[dict[str, object]]:
    return [
        {C.TOK_RESPONSE: 0, C.TOK_POSITION: i, C.TOK_TEXT: f"t{i}", C.TOK_DELTA: -0.01 * i}
        for i in range(n)
    ]


def test_tokens_round_trip_by_step(tmp_path: Path) -> None:
    with RunWriter(tmp_path / "r") as w:
        assert w.log_tokens(_tokens(3), step=4)
        assert w.log_tokens(pd.DataFrame(_tokens(2)), step=9)
        assert not w.log_tokens([], step=10)  # nothing to store
    run = load_run(tmp_path / "r")
    assert run.token_steps() == [4, 9]
    nine = run.tokens(step=9)
    assert nine[C.TOK_STEP].tolist() == [9, 9]
    assert nine[C.TOK_TEXT].tolist() == ["t0", "t1"]
    assert list(nine.columns)[:2] == [C.TOK_STEP, C.TOK_RESPONSE]  # columns.TOKEN_COLUMNS order
    assert len(run.tokens()) == 5
    assert run.tokens(step=5).empty


def test_token_byte_budget_drops_samples_once_and_keeps_steps(tmp_path: Path) -> None:
    path = tmp_path / "r"
    with RunWriter(path, token_budget_bytes=10**9) as probe:
        probe.log_tokens(_tokens(50), step=0)
        one_file = probe.token_bytes  # the size of one such Parquet file
    budget = int(one_file * 1.5)  # room for one file, not two
    with RunWriter(tmp_path / "b", token_budget_bytes=budget) as w:
        for step in range(4):
            w.log_step(_row(step))
            stored = w.log_tokens(_tokens(50), step=step)
            assert stored == (step == 0)
    run = load_run(tmp_path / "b")
    assert run.steps[C.STEP].tolist() == [0, 1, 2, 3]  # step rows never dropped
    assert run.token_steps() == [0]
    budget_events = run.events[run.events[C.EVENT_KIND] == "token_budget_reached"]
    assert len(budget_events) == 1  # recorded once
    assert budget_events[C.EVENT_STEP].item() == 1
    assert budget_events[C.EVENT_EVIDENCE].item()["token_budget_bytes"] == budget
    assert sum(f.stat().st_size for f in (tmp_path / "b" / TOKENS_DIR).iterdir()) <= budget


# --- the documentation --------------------------------------------------------------------------


def test_run_format_doc_names_every_column_and_file() -> None:
    doc = (REPO / "docs" / "run-format.md").read_text()
    names = set(re.findall(r"`([a-z_]+)`", doc))
    missing = [c for c in C.STEP_COLUMNS + C.TOKEN_COLUMNS if c not in names]
    assert not missing, f"docs/run-format.md does not document {missing}"
    for name in (META_FILE, STEPS_FILE, EVENTS_FILE, CLOSED_FILE, TOKENS_DIR):
        assert name in doc
    assert f"schema_version` = {SCHEMA_VERSION}" in doc


def test_fast_and_careful_parsers_give_the_same_frame(tmp_path: Path) -> None:
    # Clean files take pyarrow's JSON reader; one garbled line sends the same rows through the
    # line-by-line parser. Both must give the same frame: nulls, late columns, ints, strings, bools.
    path = tmp_path / "r"
    rng = np.random.default_rng(0)
    with RunWriter(path) as w:
        for i in range(1500):
            row = {C.STEP: i, C.LOSS: float(rng.normal()), C.N_CORRECT: i % 5, C.TIME: 1.0 + i}
            row[C.KL] = float("nan") if i % 3 == 0 else float(rng.random() * 1e-9)
            if i >= 750:
                row[C.LLDS_LAMBDA] = 0.2  # a column that appears mid-run
                row["note"] = f"n{i}"
            row[C.LLDS_ENABLED] = i >= 750
            w.log_step(row)
    fast = load_run(path).steps
    # really the fast path: big enough, and pyarrow accepts it
    assert (path / STEPS_FILE).stat().st_size > _FAST_PATH_MIN_BYTES
    assert _fast_steps((path / STEPS_FILE).read_bytes()) is not None
    lines = (path / STEPS_FILE).read_text().splitlines(keepends=True)
    (path / STEPS_FILE).write_text("".join([*lines[:100], "garbled\n", *lines[100:]]))
    with pytest.warns(RuntimeWarning, match="skipped 1 garbled"):
        careful = load_run(path).steps
    pd.testing.assert_frame_equal(fast, careful)
    assert fast[C.KL].isna().sum() == 500 and fast[C.LLDS_LAMBDA].isna().sum() == 750
    assert fast[C.N_CORRECT].dtype == np.int64
    assert fast[C.LOSS].iloc[7] == json.loads(lines[7])[C.LOSS]  # floats round-trip exactly


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12))
def test_incremental_reads_at_any_byte_boundary_equal_the_batch_load(cuts: list[int]) -> None:
    # river-style: the incremental reader, fed the file in arbitrary byte pieces (rows torn
    # anywhere, even inside a UTF-8 character), returns exactly what load_run gives at the end.
    with tempfile.TemporaryDirectory() as tmp:
        src, live = Path(tmp) / "src", Path(tmp) / "live"
        with RunWriter(src) as w:
            for i in range(40):
                w.log_step({C.STEP: i, C.LOSS: i / 7, C.KL: math.nan if i % 4 else 0.5, "é": "ü"})
        data = (src / STEPS_FILE).read_bytes()
        live.mkdir()
        (live / META_FILE).write_bytes((src / META_FILE).read_bytes())
        (live / STEPS_FILE).write_bytes(b"")
        reader = RunReader(live)
        pieces = []
        for cut in [*sorted(c % len(data) for c in cuts), len(data)]:
            with open(live / STEPS_FILE, "ab") as f:
                f.write(data[(live / STEPS_FILE).stat().st_size : cut])
            pieces.append(reader.read_steps())
        incremental = pd.concat([p for p in pieces if len(p)], ignore_index=True)
        batch = load_run(src).steps
        pd.testing.assert_frame_equal(incremental[batch.columns], batch)


def test_a_complete_last_line_without_newline_is_kept_and_resume_ends_it(tmp_path: Path) -> None:
    path = tmp_path / "r"
    _write_run(path, 2, close=False)._steps.close()
    with open(path / STEPS_FILE, "a") as f:
        f.write(json.dumps(_row(2)))  # a whole row, only its newline missing (a foreign writer)
    assert load_run(path).steps[C.STEP].tolist() == [0, 1, 2]
    assert RunReader(path).read_steps()[C.STEP].tolist() == [0, 1]  # live: not yet complete
    with RunWriter(path, resume=True) as w:  # resume keeps the row and starts a fresh line
        w.log_step(_row(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_run(path).steps[C.STEP].tolist() == [0, 1, 2, 3]


def test_reader_rereads_a_replaced_file_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "r"
    _write_run(path, 3)
    reader = RunReader(path)
    assert len(reader.read_steps()) == 3
    data = (path / STEPS_FILE).read_bytes()
    (path / STEPS_FILE).unlink()
    (path / STEPS_FILE).write_bytes(data[: data.index(b"\n") + 1])  # a new, shorter file
    with pytest.warns(RuntimeWarning, match="was replaced"):
        assert reader.read_steps()[C.STEP].tolist() == [0]


def test_reader_gives_tokens_and_times_without_loading_steps(tmp_path):
    # two token batches (steps 3 and 5) and one step row: the reader sees exactly those
    from lld_monitor import columns as C
    from lld_monitor.runlog import RunReader, RunWriter

    with RunWriter(tmp_path / "r") as w:
        w.log_step({C.STEP: 3})
        w.log_tokens([{C.TOK_RESPONSE: 0, C.TOK_POSITION: 1, C.TOK_DELTA: -0.5}], step=3)
        w.log_tokens([{C.TOK_RESPONSE: 1, C.TOK_POSITION: 2, C.TOK_DELTA: 0.25}], step=5)
    reader = RunReader(tmp_path / "r")
    assert reader.token_steps() == [3, 5]
    assert reader.tokens(5)[C.TOK_DELTA].tolist() == [0.25]
    assert len(reader.tokens()) == 2
    assert reader.last_modified == (tmp_path / "r" / "steps.jsonl").stat().st_mtime


def test_nonfinite_values_are_stored_as_null_and_named(tmp_path):
    from lld_monitor import columns as C
    from lld_monitor.analysis import analyze_run
    from lld_monitor.runlog import RunWriter, load_run

    w = RunWriter(tmp_path / "run", meta={"trainer": "test"})
    for s in range(1, 31):
        w.log_step({C.STEP: s, C.LOSS: float("nan") if s == 25 else 0.5, C.REWARD_MEAN: 0.2})
    w.close()
    steps = load_run(tmp_path / "run").steps
    assert steps[C.NONFINITE].fillna("").tolist() == [""] * 24 + ["loss"] + [""] * 5
    assert math.isnan(steps[C.LOSS][24])
    # the replay sees the trainer's NaN as non-finite, as the live detector did
    assert [(a.step, a.kind) for a in analyze_run(tmp_path / "run").alerts] == [(25, "nonfinite")]


def test_nonfinite_marks_survive_the_importer_and_only_name_failure_columns(tmp_path):
    from lld_monitor import columns as C
    from lld_monitor.analysis import analyze_run
    from lld_monitor.importers import load_table
    from lld_monitor.runlog import RunWriter

    w = RunWriter(tmp_path / "run", meta={"trainer": "test"})
    for s in range(1, 31):
        w.log_step(
            {
                C.STEP: s,
                C.LOSS: float("nan") if s == 25 else 0.5,
                C.LOGP_INCORRECT: float("nan"),  # "not measured": not a failure, not named
                C.REWARD_MEAN: 0.2,
            }
        )
    w.close()
    df = load_table(tmp_path / "run")  # the CLI's path: the importer keeps the run's marks
    assert df[C.NONFINITE].tolist() == [""] * 24 + ["loss"] + [""] * 5
    assert C.NONFINITE not in (df.attrs.get("unmapped_columns") or [])
    assert [(a.step, a.kind) for a in analyze_run(df).alerts] == [(25, "nonfinite")]


# --- the run follower ---------------------------------------------------------------------------


def test_run_follower_reads_each_row_once_and_keeps_one_row_a_step(tmp_path: Path) -> None:
    from lld_monitor.runlog import RunFollower

    path = tmp_path / "r"
    w = _write_run(path, 3, close=False)  # (each row is written as it is logged)
    f = RunFollower(path)
    assert f.n_rows == 0 and f.last_step == -math.inf and not f.finished
    assert f.poll() == 3 and f.steps[C.STEP].tolist() == [0, 1, 2]
    first_view = f.steps
    assert f.poll() == 0  # nothing new: nothing read again
    w.log_step(_row(3))
    w.log_event(make_event("alert", 3, kind="decay", severity="warning", message="m"))
    assert f.poll() == 1 and f.steps[C.STEP].tolist() == [0, 1, 2, 3]
    assert first_view[C.STEP].tolist() == [0, 1, 2]  # an earlier view stays valid
    assert "alert" in f.events[C.EVENT_TYPE].tolist()
    w.close()
    # a resumed run writes step 2 again, without a reward: the step merges (one_row_per_step)
    w = RunWriter(path, resume=True)
    w.log_step({C.STEP: 2, C.DELTA_CORRECT: -9.0})
    w.close()
    assert f.poll() == 1
    steps = f.steps
    assert steps[C.STEP].tolist() == [0, 1, 2, 3]
    row2 = steps[steps[C.STEP] == 2].iloc[0]
    assert row2[C.DELTA_CORRECT] == -9.0 and row2[C.REWARD_MEAN] == pytest.approx(0.2)
    assert f.finished and f.skipped_lines == 0
    pd.testing.assert_frame_equal(
        steps[[C.STEP, C.REWARD_MEAN, C.DELTA_CORRECT]],
        load_run(path).steps[[C.STEP, C.REWARD_MEAN, C.DELTA_CORRECT]],
        check_dtype=False,
    )
