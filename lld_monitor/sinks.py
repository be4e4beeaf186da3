"""Where step rows and alerts go besides the run log: console, run event log, W&B, a webhook.

Every sink subclasses :class:`Sink`, whose hooks (``log_row(step, row)``, ``log_event(event)``,
``alert(alert)``, ``close()``) do nothing until overridden; the monitor's dispatcher calls them.
No torch here; wandb is imported only when a ``WandbSink`` first needs it.
"""

from __future__ import annotations

import collections
import http.client
import json
import logging
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from lld_monitor import columns as C
from lld_monitor.analysis.advice import ALERT_KINDS, actions, headline
from lld_monitor.events import Alert

if TYPE_CHECKING:
    from lld_monitor.runlog import RunWriter

logger = logging.getLogger("lld_monitor")

#: Environment variable holding the webhook URL when none is passed.
WEBHOOK_ENV = "LLD_MONITOR_WEBHOOK_URL"

_SEVERITY_RANK = {name: i for i, name in enumerate(C.SEVERITIES)}  # info < warning < critical
_LOG_LEVEL = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.CRITICAL}
_WANDB_LEVEL = {"info": "INFO", "warning": "WARN", "critical": "ERROR"}
# Event types that sinks report through log_event (alerts come through alert(), lifecycle is
# bookkeeping that only the run log needs).
_REPORTED_EVENT_TYPES = ("phase", "intervention", "error")
# The columns ConsoleSink prints in its one-line step summary.
_SUMMARY_COLUMNS = (
    C.REWARD_MEAN,
    C.ACCURACY,
    C.LOGP_CORRECT,
    C.DELTA_CORRECT,
    C.FRAC_CORRECT_DISPLACED,
    C.GRAD_NORM,
    C.ENTROPY,
    C.LLDS_ENABLED,
)


def _check_severity(name: str, value: str) -> str:
    if value not in C.SEVERITIES:
        raise ValueError(f"{name} must be one of {C.SEVERITIES}, got {value!r}")
    return value


def _event_alert(event: Mapping[str, Any]) -> Alert | None:
    """A phase/intervention/error event as an Alert for the sinks; None for alerts and lifecycle."""
    if event.get(C.EVENT_TYPE) not in _REPORTED_EVENT_TYPES:
        return None
    step = event.get(C.EVENT_STEP)
    return Alert(
        step=-1 if step is None else int(step),
        kind=str(event.get(C.EVENT_KIND, "")),
        severity=str(event.get(C.EVENT_SEVERITY, "info")),
        message=str(event.get(C.EVENT_MESSAGE, "")),
        evidence=dict(event.get(C.EVENT_EVIDENCE) or {}),
    )


def _number(value: Any) -> float | int | None:
    """``value`` as a Python number (numpy/torch scalars unwrapped), None if not a number."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return _number(item())
        except (ValueError, RuntimeError):  # not a one-element array
            return None
    return None


def _do_now(alert: Alert) -> str:
    """' (do now: the first suggested action)' for an alert that has one, else ''."""
    todo = actions(alert) if alert.kind in ALERT_KINDS else ()
    return f" (do now: {todo[0]})" if todo else ""


def _said(alert: Alert) -> str:
    """An alert's headline (which names its step) and what to do; an event of another kind:
    'step N: ' and its own message."""
    if alert.kind not in ALERT_KINDS:
        return f"step {alert.step}: {alert.message}"
    return headline(alert) + _do_now(alert)


class Sink:
    """Base class of every sink: no-op hooks that the monitor's dispatcher calls, on rank 0.

    As transformers' ``TrainerCallback``: subclass and override the hooks you need. The
    dispatcher calls ``log_row(step, row)`` once per step row, ``log_event(event)`` once per
    event the monitor records (alerts, phase changes, interventions, errors, lifecycle; not the
    run log's own start/end markers), ``alert(alert)`` once per alert, and ``close()`` at the
    end. A sink that raises is reported and skipped (the monitor's failure policy); it never
    stops the run.
    """

    def log_row(self, step: int, row: Mapping[str, Any]) -> None:
        """One step's row (canonical columns; ``row[C.STEP] == step``)."""

    def alert(self, alert: Alert) -> None:
        """One alert from the detector (its ``alert`` event comes through ``log_event`` too)."""

    def log_event(self, event: Mapping[str, Any]) -> None:
        """Every event; by default phase/intervention/error events go to ``report_event``."""
        as_alert = _event_alert(event)
        if as_alert is not None:
            self.report_event(as_alert, str(event.get(C.EVENT_TYPE)))

    def report_event(self, event: Alert, event_type: str) -> None:
        """Hook for a phase change, intervention or error event, already shaped as an Alert."""

    def log_step(self, row: Mapping[str, Any]) -> None:
        """``log_row`` with the step taken from the row (for hand-written loops)."""
        if C.STEP not in row:
            raise ValueError(f"log_step needs a {C.STEP!r} key in the row")
        self.log_row(int(row[C.STEP]), row)

    def close(self) -> None:
        """Flush whatever is pending."""


#: The former name of :class:`Sink` (kept for one release).
BaseSink = Sink


class ConsoleSink(Sink):
    """Alerts and events to the ``lld_monitor`` logger; optionally a step summary every N steps.

    When logging is not set up (no handler on the logger or its ancestors), the lines go to
    ``stream`` (default stderr) instead, info events included: Python's fallback handler would
    show warnings only, so interventions and phase changes would vanish. They are written with
    ``tqdm.write``, so a progress bar on the same stream (the Trainer's) gives way to the line
    and is redrawn below it, instead of the line being glued onto the bar.
    """

    def __init__(
        self, *, every: int = 0, logger_name: str = "lld_monitor", stream: Any = None
    ) -> None:
        if every < 0:
            raise ValueError(f"every must be >= 0 (0 = no step summaries), got {every}")
        self.every = every
        self.logger = logging.getLogger(logger_name)
        self.stream = stream

    def _log(self, level: int, msg: str, *args: Any) -> None:
        if self.logger.hasHandlers():
            self.logger.log(level, msg, *args)
            return
        stream = self.stream or sys.stderr
        try:  # through tqdm: a progress bar on the stream (the Trainer's) is cleared and redrawn
            from tqdm import tqdm

            tqdm.write(msg % args, file=stream)
            stream.flush()
        except ImportError:
            print(msg % args, file=stream, flush=True)

    def log_row(self, step: int, row: Mapping[str, Any]) -> None:
        if not self.every or step % self.every:
            return
        parts = []
        for col in _SUMMARY_COLUMNS:
            value = _number(row.get(col))
            if value is not None and math.isfinite(value):
                parts.append(f"{col}={value:.4g}")
        self._log(
            logging.INFO, "lld_monitor step %d: %s", step, " ".join(parts) or "(no LLD columns)"
        )

    def alert(self, alert: Alert) -> None:
        self._log(
            _LOG_LEVEL[alert.severity],
            "lld_monitor %s alert: %s: %s",
            alert.severity.upper(),
            alert.kind,
            _said(alert),
        )

    def report_event(self, event: Alert, event_type: str) -> None:
        self._log(
            _LOG_LEVEL[event.severity],
            "lld_monitor %s at step %d: %s: %s",
            event_type,
            event.step,
            event.kind,
            event.message,
        )


class RunLogSink(Sink):
    """Alerts (and reported events) into a run's ``events.jsonl``; rows too if ``log_rows``.

    For hand-written loops that run a ``PhaseDetector`` themselves. ``LLDMonitor`` writes its own
    run log: do not give it a ``RunLogSink`` on the same writer, or every alert is written twice.
    """

    def __init__(self, writer: RunWriter, *, log_rows: bool = False) -> None:
        self.writer = writer
        self.log_rows = log_rows

    def log_row(self, step: int, row: Mapping[str, Any]) -> None:
        if self.log_rows:
            self.writer.log_step({**row, C.STEP: step})

    def alert(self, alert: Alert) -> None:
        self.writer.log_event(alert.to_event())

    def log_event(self, event: Mapping[str, Any]) -> None:
        if event.get(C.EVENT_TYPE) in _REPORTED_EVENT_TYPES:
            self.writer.log_event(event)

    def close(self) -> None:
        """Leaves the writer open: its owner closes it."""


class WandbSink(Sink):
    """Step columns to a W&B run under ``prefix``; alerts as ``run.alert`` (W&B emails/Slack).

    ``step_mode="metric"`` (default) logs ``{prefix}step`` as the x-axis of the ``{prefix}*``
    charts (``define_metric``), safe beside a trainer that logs to the same run with its own
    step counter; ``step_mode="step"`` passes ``run.log(..., step=step)`` (for runs nothing else
    logs to: W&B drops rows whose step is behind its own counter).
    """

    def __init__(
        self,
        run: Any = None,
        prefix: str = "lld/",
        *,
        step_mode: str = "metric",
        min_severity: str = "warning",
        alert_wait_s: float = 60.0,
    ) -> None:
        if step_mode not in ("metric", "step"):
            raise ValueError(f"step_mode must be 'metric' or 'step', got {step_mode!r}")
        self._run = run
        self.prefix = prefix
        self.step_mode = step_mode
        self.min_severity = _check_severity("min_severity", min_severity)
        self.alert_wait_s = alert_wait_s
        self._defined_for: Any = None
        self._warned_no_run = False
        #: Row columns not logged here because the trainer already sends them to W&B (TRL with
        #: report_to="wandb" logs the monitor's mirrored columns as train/lld/<column>): set
        #: when the monitor attaches, so that no column is charted twice.
        self.skip_columns: set[str] = set()

    @property
    def run(self) -> Any:
        """The W&B run in use: the one given, else the active ``wandb.run`` (None if none)."""
        if self._run is not None:
            return self._run
        import wandb

        if wandb.run is None and not self._warned_no_run:
            self._warned_no_run = True
            logger.warning("lld_monitor: WandbSink has no W&B run (call wandb.init()); skipping")
        return wandb.run

    def log_row(self, step: int, row: Mapping[str, Any]) -> None:
        run = self.run
        if run is None:
            return
        data: dict[str, float | int] = {}
        skip = self.skip_columns
        for key, value in row.items():
            if key in (C.STEP, C.TIME) or key in skip:
                continue
            number = _number(value)
            if number is not None:
                data[f"{self.prefix}{key}"] = number
        if self.step_mode == "step":
            run.log(data, step=step)
            return
        if self._defined_for is not run:
            run.define_metric(f"{self.prefix}{C.STEP}")
            run.define_metric(f"{self.prefix}*", step_metric=f"{self.prefix}{C.STEP}")
            self._defined_for = run
        data[f"{self.prefix}{C.STEP}"] = step
        run.log(data)

    def alert(self, alert: Alert) -> None:
        self._send(alert, "alert")

    def report_event(self, event: Alert, event_type: str) -> None:
        if event_type in ("intervention", "error"):
            self._send(event, event_type)

    def _send(self, alert: Alert, what: str) -> None:
        if _SEVERITY_RANK[alert.severity] < _SEVERITY_RANK[self.min_severity]:
            return
        run = self.run
        if run is None:
            return
        # W&B throttles alerts by title for wait_duration: the title names the kind, not the step.
        run.alert(
            title=f"lld_monitor {what}: {alert.kind}"[:63],
            text=_said(alert)
            + (f"\nevidence: {alert.message}" if alert.kind in ALERT_KINDS else ""),
            level=_WANDB_LEVEL[alert.severity],
            wait_duration=self.alert_wait_s,
        )


#: Seconds ``WebhookSink.close()`` waits beyond its ``timeout`` (the worker's last log line).
_CLOSE_SLACK_S = 0.25


class WebhookSink(Sink):
    """Alerts as Slack-compatible JSON ``{"text": ...}`` POSTs; deduplicated, rate-limited, safe.

    An alert whose (kind, severity) was sent less than ``min_interval_s`` ago is dropped (counted
    and mentioned in the next message). At most one POST per ``min_interval_s``: alerts arriving
    sooner wait and go out together at the next call after the interval (a critical one goes at
    once). POSTs run on a background thread (``background=True``), so a slow or unreachable
    endpoint never stalls training; failures are logged, never raised. A POST that times out,
    cannot connect or gets a 5xx/429 answer is retried up to ``retries`` times, after
    ``backoff_s``, then twice that, ...; at most ``max_queue`` messages wait (the oldest is
    dropped beyond it). ``close()`` waits at most ``timeout`` seconds in all, whatever is queued,
    and logs how many alerts it could not deliver (``n_dropped``).
    """

    def __init__(
        self,
        url: str | None = None,
        timeout: float = 5.0,
        min_interval_s: float = 60.0,
        dedupe: bool = True,
        *,
        min_severity: str = "warning",
        run_name: str | None = None,
        background: bool = True,
        clock: Callable[[], float] = time.monotonic,
        retries: int = 2,
        backoff_s: float = 0.5,
        max_queue: int = 100,
    ) -> None:
        url = url or os.environ.get(WEBHOOK_ENV)
        if not url:
            raise ValueError(f"WebhookSink needs a URL: pass url=... or set {WEBHOOK_ENV}")
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme not in ("http", "https"):
            raise ValueError(f"webhook URL must start with http:// or https://, got {url!r}")
        if timeout <= 0 or min_interval_s < 0:
            raise ValueError("timeout must be > 0 and min_interval_s >= 0 (seconds)")
        if retries < 0 or backoff_s < 0 or max_queue < 1:
            raise ValueError(
                f"retries and backoff_s must be >= 0 and max_queue >= 1, got retries={retries}, "
                f"backoff_s={backoff_s}, max_queue={max_queue}"
            )
        self.url = url
        self.timeout = timeout
        self.min_interval_s = min_interval_s
        self.dedupe = dedupe
        self.min_severity = _check_severity("min_severity", min_severity)
        self.run_name = run_name
        self.background = background
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.max_queue = int(max_queue)
        self._clock = clock
        # Messages waiting for the worker, each with the number of alerts it carries.
        self._queue: collections.deque[tuple[str, int]] = collections.deque()
        self._cond = threading.Condition()
        self._in_flight = 0  # alerts in the message the worker is sending
        self._closing = threading.Event()
        self._abandoned = False  # close() gave up on the worker: it counts nothing more
        self._worker: threading.Thread | None = None
        self._pending: list[Alert] = []
        self._last_post = -math.inf
        self._last_sent: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}
        self._warned_full = False
        self.n_posts = 0  # successful POSTs
        self.n_failed = 0  # POSTs that failed after their retries (logged)
        self.n_retries = 0  # retried attempts
        self.n_suppressed = 0  # alerts dropped as duplicates
        self.n_dropped = 0  # alerts never sent: queue full, or still queued when close() gave up

    @classmethod
    def from_env(cls, **kwargs: Any) -> WebhookSink | None:
        """A sink for ``$LLD_MONITOR_WEBHOOK_URL``, or None when it is not set."""
        url = os.environ.get(WEBHOOK_ENV)
        return cls(url, **kwargs) if url else None

    def log_row(self, step: int, row: Mapping[str, Any]) -> None:
        self._flush(force=False)  # sends alerts held back by the rate limit once it allows

    def alert(self, alert: Alert) -> None:
        if _SEVERITY_RANK[alert.severity] < _SEVERITY_RANK[self.min_severity]:
            return
        key = (alert.kind, alert.severity)
        now = self._clock()
        recent = now - self._last_sent.get(key, -math.inf) < self.min_interval_s
        if self.dedupe and (recent or any((a.kind, a.severity) == key for a in self._pending)):
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            self.n_suppressed += 1
            return
        self._pending.append(alert)
        self._flush(force=alert.severity == "critical")

    def report_event(self, event: Alert, event_type: str) -> None:
        if event_type in ("intervention", "error"):
            self.alert(event)

    def close(self) -> None:
        """Send what the rate limit still holds; wait at most ``timeout`` s for queued POSTs.

        Alerts not delivered by then are counted in ``n_dropped`` and logged; a POST still in
        flight is abandoned to its daemon thread (no retry after close).
        """
        self._flush(force=True)
        worker = self._worker
        if worker is None or not worker.is_alive() or self._abandoned:
            return
        t0 = time.monotonic()
        with self._cond:
            self._closing.set()
            self._cond.notify_all()
        # A POST in flight gives up at its socket timeout: one timeout (and a little) is enough.
        worker.join(timeout=self.timeout + _CLOSE_SLACK_S)
        with self._cond:
            if not worker.is_alive():
                return
            self._abandoned = True
            dropped = self._in_flight + sum(n for _, n in self._queue)
            self._queue.clear()
            self.n_dropped += dropped
        logger.warning(
            "lld_monitor: webhook %s did not finish within %.1f s at close: %d alert(s) not "
            "delivered (%d dropped in all); check the endpoint, or pass a smaller timeout",
            self._safe_url(),
            time.monotonic() - t0,
            dropped,
            self.n_dropped,
        )

    def wait(self, timeout: float = 30.0) -> bool:
        """Block until the queued POSTs are done (True) or ``timeout`` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def message(self, alerts: list[Alert]) -> str:
        """The Slack text for a batch of alerts (plus a note of suppressed repeats)."""
        head = "*lld_monitor*" + (f" `{self.run_name}`" if self.run_name else "")
        lines = [
            f"{head} {a.severity.upper()} {a.kind}"
            + (f": {_said(a)}" if a.kind in ALERT_KINDS else f" at step {a.step}: {a.message}")
            for a in alerts
        ]
        if self._suppressed:
            repeats = ", ".join(f"{k} {s} x{n}" for (k, s), n in sorted(self._suppressed.items()))
            lines.append(f"(repeats suppressed since the last message: {repeats})")
        return "\n".join(lines)

    def _flush(self, *, force: bool) -> None:
        if not self._pending:
            return
        now = self._clock()
        if not force and now - self._last_post < self.min_interval_s:
            return
        batch, self._pending = self._pending, []
        text = self.message(batch)
        self._suppressed.clear()
        self._last_post = now
        for a in batch:
            self._last_sent[(a.kind, a.severity)] = now
        if not self.background:
            self._send_message(text)
            return
        self._enqueue(text, len(batch))

    def _enqueue(self, text: str, n_alerts: int) -> None:
        """Queue a message for the worker (started on first use); the oldest goes when full."""
        with self._cond:
            if self._closing.is_set():
                self.n_dropped += n_alerts
                return
            dropped = 0
            while len(self._queue) >= self.max_queue:
                dropped += self._queue.popleft()[1]
            self.n_dropped += dropped
            self._queue.append((text, n_alerts))
            self._cond.notify_all()
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="lld-webhook", daemon=True)
                self._worker.start()
        if dropped and not self._warned_full:
            self._warned_full = True
            logger.warning(
                "lld_monitor: webhook %s is behind: %d messages wait, the oldest alerts are "
                "dropped (%d so far; pass max_queue=... to keep more)",
                self._safe_url(),
                self.max_queue,
                self.n_dropped,
            )

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing.is_set():
                    self._cond.wait()
                if not self._queue:
                    return
                text, self._in_flight = self._queue.popleft()
            try:
                self._send_message(text)
            finally:
                with self._cond:
                    self._in_flight = 0
                    self._cond.notify_all()

    def _send_message(self, text: str) -> None:
        """POST ``text``, retrying timeouts, connection errors and 5xx/429 with backoff."""
        attempt = 0
        while True:
            error, retry = self._post(text)
            with self._cond:
                if self._abandoned:
                    return  # close() counted this message as dropped already
                if error is None:
                    self.n_posts += 1
                    return
                give_up = not retry or attempt >= self.retries or self._closing.is_set()
                if give_up:
                    self.n_failed += 1
                else:
                    self.n_retries += 1
            if give_up:
                tries = f" after {attempt + 1} attempts" if attempt else ""
                logger.warning(
                    "lld_monitor: webhook POST to %s failed%s: %s", self._safe_url(), tries, error
                )
                return
            if self._closing.wait(self.backoff_s * 2**attempt):
                logger.warning(
                    "lld_monitor: webhook POST to %s failed (%s); not retried, the sink is closing",
                    self._safe_url(),
                    error,
                )
                with self._cond:
                    if not self._abandoned:
                        self.n_failed += 1
                return
            attempt += 1

    def _post(self, text: str) -> tuple[BaseException | None, bool]:
        """One POST: (None, _) on success, else (the error, whether a retry may help)."""
        body = json.dumps({"text": text}).encode("utf-8")
        request = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:  # an answer: retry only the server's trouble
            return exc, exc.code >= 500 or exc.code == 429
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            return exc, True  # timeouts, refused or reset connections
        except ValueError as exc:
            return exc, False
        return None, False

    def _safe_url(self) -> str:
        """The URL without its path (webhook paths are secrets)."""
        parts = urllib.parse.urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}/..."
