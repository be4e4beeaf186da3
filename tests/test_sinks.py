"""Sinks against the real things: logging, a run folder, an offline W&B run, a local HTTP server."""

from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.advice import actions, headline
from lld_monitor.events import Alert, make_event
from lld_monitor.runlog import RunWriter, load_run
from lld_monitor.sinks import (
    WEBHOOK_ENV,
    BaseSink,
    ConsoleSink,
    RunLogSink,
    Sink,
    WandbSink,
    WebhookSink,
)

DECAY = Alert(40, "decay", "warning", "delta_correct -0.8 over 20 steps", {"slope": -0.04})
COLLAPSE = Alert(90, "collapse", "critical", "grad_norm 12x its median", {"ratio": 12.0})
INFO = Alert(50, "phase", "info", "phase decay -> healthy", {})


def said(a: Alert) -> str:
    """What a sink says of an alert: its headline (checked by hand in tests/analysis/
    test_advice.py) and the first thing to do."""
    return f"{headline(a)} (do now: {actions(a)[0]})"


def test_every_sink_is_a_sink() -> None:
    for sink in (ConsoleSink(), RunLogSink(writer=None), WandbSink(), BaseSink()):  # type: ignore[arg-type]
        assert isinstance(sink, Sink)
    assert BaseSink is Sink  # the former name, kept for one release


class _Recorder(Sink):
    """A user-written sink: overrides the documented hooks and records every call in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def log_row(self, step: int, row: Any) -> None:
        self.calls.append(("row", (step, row[C.STEP], row.get("custom"))))

    def log_event(self, event: Any) -> None:
        self.calls.append(("event", (event[C.EVENT_TYPE], event[C.EVENT_KIND])))

    def alert(self, alert: Alert) -> None:
        self.calls.append(("alert", (alert.step, alert.kind)))

    def close(self) -> None:
        self.calls.append(("close", None))


class _Scripted:
    def __init__(self, script: dict[int, list[Alert]]) -> None:
        self.script, self.phase = script, "healthy"

    def update(self, row: dict[str, Any]) -> list[Alert]:
        return self.script.get(int(row[C.STEP]), [])


def test_a_user_sink_gets_every_row_event_and_alert(tmp_path: Path) -> None:
    from lld_monitor.monitor import LLDMonitor

    decay = Alert(1, "decay", "warning", "correct likelihood falling", {"slope": -0.1})
    rec = _Recorder()
    monitor = LLDMonitor(
        tmp_path / "run",
        sinks=[rec],
        detector=_Scripted({1: [decay]}),
        auto_llds=True,
        strict=True,
    )
    for step in range(3):
        monitor.end_step(step=step, custom=float(step))
    monitor.close()
    run = load_run(tmp_path / "run")
    assert [c for c in rec.calls if c[0] == "row"] == [
        ("row", (s, s, float(s))) for s in run.steps[C.STEP]
    ]
    assert len(run.steps) == 3
    # every event the run log holds, in the same order, and nothing else, but the run log's own
    # start/end markers (RunWriter writes them; a sink has close() for the end)
    logged = list(zip(run.events[C.EVENT_TYPE], run.events[C.EVENT_KIND], strict=True))
    assert logged[0] == ("lifecycle", "start") and logged[-1] == ("lifecycle", "end")
    logged = logged[1:-1]
    assert [c[1] for c in rec.calls if c[0] == "event"] == logged
    assert ("alert", "decay") in logged and ("intervention", "llds_enable") in logged
    assert [c for c in rec.calls if c[0] == "alert"] == [("alert", (1, "decay"))]
    assert rec.calls[-1] == ("close", None)
    # rows, events and the alert arrive in the order they happened
    assert [c[0] for c in rec.calls] == [
        "event",
        "row",
        "row",
        "event",
        "alert",
        "event",
        "row",
        "close",
    ]


def test_duck_typed_sinks_get_rows_through_the_hook_they_have(tmp_path: Path) -> None:
    from lld_monitor.monitor import LLDMonitor

    class Legacy:  # duck-typed, no Sink base: the dispatcher calls the hooks it has
        def __init__(self) -> None:
            self.steps: list[int] = []

        def log_step(self, row: Any) -> None:
            self.steps.append(int(row[C.STEP]))

    class RowsOnly:  # duck-typed with the documented hook only (got zero rows before issue 19)
        def __init__(self) -> None:
            self.steps: list[int] = []

        def log_row(self, step: int, row: Any) -> None:
            self.steps.append(step)

    legacy, rows_only = Legacy(), RowsOnly()
    monitor = LLDMonitor(tmp_path / "run", sinks=[legacy, rows_only], detector=None, strict=True)
    monitor.end_step(step=0)
    monitor.end_step(step=1)
    monitor.close()
    assert legacy.steps == [0, 1] and rows_only.steps == [0, 1]


# --- console ------------------------------------------------------------------------------------


def test_console_sink_logs_alerts_events_and_summaries(caplog: pytest.LogCaptureFixture) -> None:
    sink = ConsoleSink(every=10)
    with caplog.at_level(logging.INFO, logger="lld_monitor"):
        sink.alert(DECAY)
        sink.alert(COLLAPSE)
        sink.log_step({C.STEP: 10, C.REWARD_MEAN: np.float32(0.5), C.GRAD_NORM: float("nan")})
        sink.log_row(11, {C.REWARD_MEAN: 0.6})  # not a multiple of 10: no summary
        sink.log_event(make_event("intervention", 41, "llds_enable", "LLDS on", "warning"))
        sink.log_event(DECAY.to_event())  # alerts come through alert(), not twice
        sink.log_event(make_event("lifecycle", None, "start", "run started"))  # bookkeeping
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert records == [
        (
            "lld_monitor",
            logging.WARNING,
            f"lld_monitor WARNING alert: decay: {said(DECAY)}",
        ),
        (
            "lld_monitor",
            logging.CRITICAL,
            f"lld_monitor CRITICAL alert: collapse: {said(COLLAPSE)}",
        ),
        ("lld_monitor", logging.INFO, "lld_monitor step 10: reward_mean=0.5"),  # NaN left out
        (
            "lld_monitor",
            logging.WARNING,
            "lld_monitor intervention at step 41: llds_enable: LLDS on",
        ),
    ]


# --- run log ------------------------------------------------------------------------------------


def test_run_log_sink_writes_alerts_as_events(tmp_path: Path) -> None:
    with RunWriter(tmp_path / "r") as writer:
        sink = RunLogSink(writer)
        sink.log_row(1, {C.LOSS: 1.0})  # rows are the writer owner's business by default
        sink.alert(DECAY)
        sink.log_event(make_event("intervention", 41, "llds_enable", "LLDS on", "warning"))
        sink.log_event(DECAY.to_event())  # ignored: alerts come through alert()
        RunLogSink(writer, log_rows=True).log_row(2, {C.LOSS: 0.5})
        sink.close()
        assert not writer.closed  # the sink does not own the writer
    run = load_run(tmp_path / "r")
    assert run.steps[C.STEP].tolist() == [2]
    ev = run.events
    assert ev[C.EVENT_KIND].tolist() == ["start", "decay", "llds_enable", "end"]
    decay = ev.iloc[1]
    assert decay[C.EVENT_TYPE] == "alert" and decay[C.EVENT_STEP] == 40
    assert decay[C.EVENT_EVIDENCE] == {"slope": -0.04}
    assert decay[C.EVENT_MESSAGE] == DECAY.message


# --- W&B (offline run, read back from its .wandb file) ------------------------------------------


def _wandb_records(run_dir: Path) -> list[Any]:
    """Records of an offline run's ``.wandb`` file, decoded with wandb's own protobuf schema.

    The file is a LevelDB-style log: a 7-byte header (":W&B", magic, version), then 32 KiB
    blocks of chunks, each with a 7-byte header (crc32 u32, length u16, type u8: 1 full,
    2 first, 3 middle, 4 last); a block tail shorter than a header is zero padding.
    """
    (path,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + 60
    while True:  # wandb-core may still be flushing the file after run.finish() returns
        records = _parse_wandb_log(path.read_bytes())
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: no exit record after 60 s")
        time.sleep(0.1)


def _parse_wandb_log(data: bytes) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    assert data[:4] == b":W&B"
    block, pos, parts, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding up to the end of the block
            pos += left
            continue
        if pos + 7 + length > len(data):
            break  # a chunk still being written
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        parts = payload if kind in (1, 2) else parts + payload
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def _history(records: list[Any]) -> list[dict[str, Any]]:
    """History rows: W&B's step as ``_step``, then the logged keys (W&B's own ``_*`` dropped)."""
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row: dict[str, Any] = {"_step": r.history.step.num}
            for item in r.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    row[key] = json.loads(item.value_json)
            rows.append(row)
    return rows


def _alerts(records: list[Any]) -> list[tuple[str, str, str, int]]:
    return [
        (r.alert.title, r.alert.text, r.alert.level, r.alert.wait_duration)
        for r in records
        if r.WhichOneof("record_type") == "alert"
    ]


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    yield wandb
    if wandb.run is not None:
        wandb.run.finish()


def test_wandb_sink_step_mode_logs_rows_and_raises_alerts(wandb_offline: Any) -> None:
    run = wandb_offline.init(project="lld-test", mode="offline")
    sink = WandbSink(run, prefix="lld/", step_mode="step")
    sink.log_step({C.STEP: 3, C.TIME: 1e9, C.REWARD_MEAN: np.float32(0.5), "note": "text"})
    sink.log_row(4, {C.DELTA_CORRECT: -1.25, C.LLDS_ENABLED: True})
    sink.alert(DECAY)
    sink.alert(INFO)  # below min_severity="warning": not raised
    sink.log_event(make_event("intervention", 41, "llds_enable", "LLDS on (lambda=0.2)", "warning"))
    sink.log_event(make_event("phase", 41, "decay", "phase healthy -> decay"))  # not an alert
    run_dir = Path(run.dir).parent
    run.finish()
    records = _wandb_records(run_dir)
    assert _history(records) == [
        {"_step": 3, "lld/reward_mean": 0.5},  # step/time/strings are not metrics
        {"_step": 4, "lld/delta_correct": -1.25, "lld/llds_enabled": 1},
    ]
    assert _alerts(records) == [
        ("lld_monitor alert: decay", f"{said(DECAY)}\nevidence: {DECAY.message}", "WARN", 60000),
        (
            "lld_monitor intervention: llds_enable",
            "step 41: LLDS on (lambda=0.2)",
            "WARN",
            60000,
        ),
    ]


def test_wandb_sink_metric_mode_uses_the_active_run(wandb_offline: Any) -> None:
    run = wandb_offline.init(project="lld-test", mode="offline")
    sink = WandbSink(prefix="m/", alert_wait_s=5)  # no run given: wandb.run
    run.log({"train/loss": 1.0})  # the trainer's own logging advances W&B's step counter
    run.log({"train/loss": 0.9})
    sink.log_row(1, {C.KL: 0.01})  # our step 1 is behind W&B's step 2: fine in this mode
    sink.log_row(2, {C.KL: 0.02})
    sink.alert(COLLAPSE)
    run_dir = Path(run.dir).parent
    run.finish()
    records = _wandb_records(run_dir)
    ours = [h for h in _history(records) if "m/kl" in h]
    assert [(h["m/step"], h["m/kl"]) for h in ours] == [(1, 0.01), (2, 0.02)]
    metrics = {
        r.metric.glob_name or r.metric.name: r.metric.step_metric
        for r in records
        if r.WhichOneof("record_type") == "metric"
    }
    assert metrics.get("m/*") == "m/step"
    assert _alerts(records) == [
        (
            "lld_monitor alert: collapse",
            f"{said(COLLAPSE)}\nevidence: {COLLAPSE.message}",
            "ERROR",
            5000,
        )
    ]


def test_wandb_sink_without_a_run_warns_once(
    wandb_offline: Any, caplog: pytest.LogCaptureFixture
) -> None:
    assert wandb_offline.run is None
    sink = WandbSink()
    with caplog.at_level(logging.WARNING, logger="lld_monitor"):
        sink.log_row(1, {C.KL: 0.1})
        sink.alert(COLLAPSE)
    assert [r.getMessage() for r in caplog.records] == [
        "lld_monitor: WandbSink has no W&B run (call wandb.init()); skipping"
    ]


# --- webhook (a real HTTP server on 127.0.0.1) --------------------------------------------------


class _Hook(BaseHTTPRequestHandler):
    received: list[tuple[str, str, dict[str, Any]]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append((self.path, self.headers["Content-Type"], body))
        if self.path == "/slow":
            time.sleep(1.5)
        status = 500 if self.path == "/fail" else 200
        try:
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        except (BrokenPipeError, ConnectionResetError):
            return  # the client gave up at its timeout: what the timeout test wants

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep the test output clean


@pytest.fixture
def hook_server() -> Iterator[tuple[str, list[tuple[str, str, dict[str, Any]]]]]:
    received: list[tuple[str, str, dict[str, Any]]] = []
    handler = type("Hook", (_Hook,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_webhook_posts_slack_json(hook_server: tuple[str, list]) -> None:
    base, received = hook_server
    sink = WebhookSink(f"{base}/services/T0/B0/secret", run_name="exp1")
    sink.alert(DECAY)
    sink.alert(INFO)  # below min_severity="warning"
    assert sink.wait(timeout=10)  # POSTs run on a background thread
    assert received == [
        (
            "/services/T0/B0/secret",
            "application/json",
            {"text": f"*lld_monitor* `exp1` WARNING decay: {said(DECAY)}"},
        )
    ]
    assert (sink.n_posts, sink.n_failed) == (1, 0)


def test_webhook_dedupes_and_rate_limits(hook_server: tuple[str, list]) -> None:
    base, received = hook_server
    clock = _Clock()
    sink = WebhookSink(base, min_interval_s=60, clock=clock, background=False)
    sink.alert(DECAY)  # t=1000: sent
    clock.now += 10
    sink.alert(DECAY)  # same (kind, severity) 10 s later: duplicate, dropped
    stagnation = Alert(45, "stagnation", "warning", "logp_correct flat, reward up", {})
    sink.alert(stagnation)  # new kind, but the last POST was 10 s ago: held
    sink.log_row(46, {})  # t=1010: still held
    assert len(received) == 1
    clock.now += 51  # t=1061: 61 s since the last POST
    sink.log_row(47, {})  # the held alert goes out, with the repeat count
    assert [r[2]["text"] for r in received] == [
        f"*lld_monitor* WARNING decay: {said(DECAY)}",
        "*lld_monitor* WARNING stagnation: LLD Phase I (stagnation) at step 45: logp_correct flat, "
        f"reward up (do now: {actions(DECAY)[0]})\n"
        "(repeats suppressed since the last message: decay warning x1)",
    ]
    clock.now += 1
    sink.alert(COLLAPSE)  # critical: sent at once despite the rate limit
    assert received[-1][2]["text"].startswith(
        "*lld_monitor* CRITICAL collapse: Collapse (Phase III) at step 90"
    )
    clock.now += 1
    sink.alert(DECAY)  # 62 s after the first decay: no longer a duplicate, but rate-limited
    assert len(received) == 3
    sink.close()  # close sends what is held
    assert (
        len(received) == 4
        and "decay: LLD Phase II (steady decay) at step 40" in received[-1][2]["text"]
    )
    assert (sink.n_posts, sink.n_suppressed, sink.n_failed) == (4, 1, 0)


def test_webhook_without_dedupe_still_rate_limits(hook_server: tuple[str, list]) -> None:
    base, received = hook_server
    clock = _Clock()
    sink = WebhookSink(base, min_interval_s=60, dedupe=False, clock=clock, background=False)
    sink.alert(DECAY)
    sink.alert(DECAY)
    sink.alert(DECAY)
    sink.close()
    assert [
        r[2]["text"].count("decay: LLD Phase II (steady decay) at step 40") for r in received
    ] == [1, 2]


def test_webhook_failures_and_timeouts_are_logged_not_raised(
    hook_server: tuple[str, list], caplog: pytest.LogCaptureFixture
) -> None:
    base, received = hook_server
    with caplog.at_level(logging.WARNING, logger="lld_monitor"):
        WebhookSink(f"{base}/fail", background=False, retries=0).alert(DECAY)  # HTTP 500
        slow = WebhookSink(f"{base}/slow", timeout=0.3, retries=0)
        t0 = time.monotonic()
        slow.alert(COLLAPSE)  # the server answers after 1.5 s
        queued = time.monotonic() - t0
        slow.close()
        closed = time.monotonic() - t0
        refused = WebhookSink("http://127.0.0.1:9/hook", timeout=1, background=False, retries=0)
        refused.alert(DECAY)  # nothing listens on port 9
    assert queued < 0.25  # on the background thread: the training step is not held up
    assert closed < 1.2  # the POST gave up at its 0.3 s timeout, not after the 1.5 s answer
    assert slow.n_failed == 1 and slow.n_posts == 0 and refused.n_failed == 1
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3 and all("webhook POST to http://127.0.0.1:" in m for m in messages)
    assert "500" in messages[0] and "timed out" in messages[1]
    assert not any("/fail" in m or "/slow" in m for m in messages)  # the secret path is hidden
    assert [r[0] for r in received] == ["/fail", "/slow"]


def test_webhook_url_from_env_and_bad_urls(
    hook_server: tuple[str, list], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, received = hook_server
    monkeypatch.delenv(WEBHOOK_ENV, raising=False)
    assert WebhookSink.from_env() is None
    with pytest.raises(ValueError, match=WEBHOOK_ENV):
        WebhookSink()
    with pytest.raises(ValueError, match="http:// or https://"):
        WebhookSink("file:///etc/passwd")
    monkeypatch.setenv(WEBHOOK_ENV, f"{base}/from-env")
    sink = WebhookSink.from_env()
    assert sink is not None
    sink.log_event(make_event("intervention", 41, "stop", "stop_on_collapse", "warning"))
    sink.close()  # waits for the queued POST
    assert received[0][0] == "/from-env"
    assert received[0][2]["text"] == "*lld_monitor* WARNING stop at step 41: stop_on_collapse"


def test_sinks_and_runlog_import_neither_torch_nor_wandb() -> None:
    code = (
        "import sys, lld_monitor.sinks, lld_monitor.runlog; "
        "print(sorted(m for m in ('torch', 'wandb', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_console_sink_prints_info_events_when_logging_is_not_set_up() -> None:
    import io

    name = "lld_monitor_console_test_unconfigured"
    logging.getLogger(name).propagate = False  # no handler here or above: logging not set up
    out = io.StringIO()
    sink = ConsoleSink(logger_name=name, stream=out)
    sink.log_event(make_event("phase", 12, "decay", "phase healthy -> decay", "info"))
    sink.log_event(make_event("intervention", 13, "llds_enable", "LLDS on by auto_llds", "info"))
    assert out.getvalue().splitlines() == [
        "lld_monitor phase at step 12: decay: phase healthy -> decay",
        "lld_monitor intervention at step 13: llds_enable: LLDS on by auto_llds",
    ]


def test_console_lines_are_not_glued_onto_a_progress_bar() -> None:
    """A Trainer's tqdm bar on the same stream: the monitor's line starts a line of its own
    (the bar is cleared first and redrawn after), instead of following the bar's text."""
    import io

    from tqdm import tqdm

    name = "lld_monitor_console_test_bar"
    logging.getLogger(name).propagate = False
    out = io.StringIO()
    bar = tqdm(total=10, file=out, desc="train", mininterval=0, ascii=True)
    bar.update(3)
    sink = ConsoleSink(logger_name=name, stream=out)
    sink.log_event(make_event("phase", 3, "decay", "phase healthy -> decay", "info"))
    bar.update(1)
    bar.close()
    import re

    # (cursor moves that tqdm adds for bars at other positions are not text)
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out.getvalue())
    at = text.index("lld_monitor phase at step 3")
    assert text[at - 1] in "\r\n", repr(text[max(0, at - 40) : at + 10])  # a fresh line
    assert "\n" in text[at:] and text[at:].index("\n") < text[at:].index("4/10")  # bar below
