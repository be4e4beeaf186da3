"""The webhook sink against endpoints that fail: one that never answers, one that 500s, one that
refuses. Every server is local (127.0.0.1, a free port), threaded, serves a bounded loop and stops
by itself. Each test names the promise it checks in its docstring.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from lld_monitor.events import Alert
from lld_monitor.sinks import WebhookSink

#: No server here lives longer than this, whatever the test does.
_SERVER_LIFETIME_S = 60.0


class _Hanging:
    """Accepts connections, reads what comes, never answers; counts connections."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.n_connections = 0
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        deadline = time.monotonic() + _SERVER_LIFETIME_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(0.05)
            self._conns.append(conn)
            self.n_connections += 1
        for conn in self._conns:
            conn.close()
        self.sock.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class _Status(BaseHTTPRequestHandler):
    """Answers ``/500`` with 500, ``/404`` with 404, ``/flaky`` with 500 twice then 200."""

    posts: list[str]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.posts.append(self.path)
        status = {"/500": 500, "/404": 404}.get(self.path, 200)
        if self.path == "/flaky":
            status = 500 if self.posts.count("/flaky") <= 2 else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def hanging() -> Iterator[_Hanging]:
    server = _Hanging()
    yield server
    server.stop()


@pytest.fixture
def status_server() -> Iterator[tuple[str, list[str]]]:
    posts: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("S", (_Status,), {"posts": posts}))
    server.daemon_threads = True
    server.timeout = 0.05
    stop = threading.Event()

    def serve() -> None:
        deadline = time.monotonic() + _SERVER_LIFETIME_S
        while not stop.is_set() and time.monotonic() < deadline:
            server.handle_request()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", posts
    stop.set()
    thread.join(timeout=5)
    server.server_close()


def _refused_url() -> str:
    """A 127.0.0.1 port nothing listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def _alert(step: int) -> Alert:
    return Alert(step, "decay", "warning", f"delta_correct down at step {step}", {})


@pytest.mark.parametrize("endpoint", ["hangs", "500", "refuses"])
def test_close_waits_about_one_timeout_whatever_is_queued_and_says_what_it_dropped(
    endpoint: str,
    hanging: _Hanging,
    status_server: tuple[str, list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Promise (issue 20): with 30 alerts queued for an endpoint that never answers, 500s or
    refuses, ``close()`` returns within about one ``timeout`` (not one per queued alert: the
    old sink took 31 timeouts), and every alert is accounted for: sent, failed (logged) or
    dropped (``n_dropped``, with a warning that says how many)."""
    url = {
        "hangs": hanging.url,
        "500": f"{status_server[0]}/500",
        "refuses": _refused_url(),
    }[endpoint]
    timeout = 0.5
    sink = WebhookSink(url, timeout=timeout, min_interval_s=0, dedupe=False)
    with caplog.at_level(logging.WARNING, logger="lld_monitor"):
        for step in range(30):
            sink.alert(_alert(step))
        time.sleep(0.1)  # the worker is busy with the first POST
        t0 = time.monotonic()
        sink.close()
        took = time.monotonic() - t0
    assert took < timeout + 0.6, f"close() took {took:.2f} s"
    assert sink.n_posts + sink.n_failed + sink.n_dropped == 30
    if endpoint == "hangs":
        assert sink.n_dropped >= 29
        (warning,) = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
        assert f"{sink.n_dropped} alert(s) not delivered" in warning
        assert "/hook" not in warning  # the secret path stays hidden
    else:
        assert sink.n_failed >= 1 and sink.n_posts == 0


def test_5xx_timeouts_and_refusals_are_retried_with_backoff_a_bounded_number_of_times(
    hanging: _Hanging, status_server: tuple[str, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """Promise: a POST that gets a 5xx, times out or is refused is retried ``retries`` times
    with a growing backoff, then counted as failed and logged once; a flaky endpoint (500, 500,
    200) gets the alert through; a 4xx (a wrong URL or secret) is not retried."""
    base, posts = status_server
    with caplog.at_level(logging.WARNING, logger="lld_monitor"):
        sink = WebhookSink(f"{base}/500", background=False, retries=2, backoff_s=0.1)
        t0 = time.monotonic()
        sink.alert(_alert(1))
        assert time.monotonic() - t0 >= 0.1 + 0.2  # backoff 0.1 s, then 0.2 s
        assert posts.count("/500") == 3
        assert (sink.n_posts, sink.n_failed, sink.n_retries) == (0, 1, 2)

        flaky = WebhookSink(f"{base}/flaky", background=False, retries=2, backoff_s=0.01)
        flaky.alert(_alert(2))
        assert posts.count("/flaky") == 3
        assert (flaky.n_posts, flaky.n_failed, flaky.n_retries) == (1, 0, 2)

        wrong = WebhookSink(f"{base}/404", background=False, retries=2, backoff_s=0.01)
        wrong.alert(_alert(3))
        assert posts.count("/404") == 1 and (wrong.n_failed, wrong.n_retries) == (1, 0)

        slow = WebhookSink(hanging.url, timeout=0.2, background=False, retries=1, backoff_s=0)
        slow.alert(_alert(4))
        time.sleep(0.1)  # the server's accept loop polls every 0.05 s
        assert hanging.n_connections == 2 and (slow.n_failed, slow.n_retries) == (1, 1)

        refused = WebhookSink(_refused_url(), background=False, retries=2, backoff_s=0.01)
        refused.alert(_alert(5))
        assert (refused.n_failed, refused.n_retries) == (1, 2)
    failed = [r.getMessage() for r in caplog.records]
    assert len(failed) == 4  # one line per failed alert, not one per attempt
    assert "after 3 attempts" in failed[0] and "500" in failed[0]
    assert "404" in failed[1] and "attempts" not in failed[1]


def test_queue_is_bounded_and_the_oldest_alerts_are_dropped_first(
    hanging: _Hanging, caplog: pytest.LogCaptureFixture
) -> None:
    """Promise: while the endpoint hangs, at most ``max_queue`` messages wait in memory; the
    oldest are dropped first, counted in ``n_dropped`` and warned about once."""
    sink = WebhookSink(hanging.url, timeout=0.3, min_interval_s=0, dedupe=False, max_queue=5)
    with caplog.at_level(logging.WARNING, logger="lld_monitor"):
        for step in range(50):
            sink.alert(_alert(step))
            assert len(sink._queue) <= 5
        waiting = [text for text, _ in sink._queue]
        sink.close()
    kept = [int(m.group(1)) for t in waiting if (m := re.search(r"at step (\d+):", t))]
    assert kept == [45, 46, 47, 48, 49]  # the newest are kept
    assert sink.n_dropped >= 44 and sink.n_posts + sink.n_failed + sink.n_dropped == 50
    behind = [r for r in caplog.records if "is behind" in r.getMessage()]
    assert len(behind) == 1 and "max_queue" in behind[0].getMessage()
