"""The event dispatcher: rows, events and alerts to the run log and the sinks (rank 0).

The model is transformers' ``CallbackHandler``: one object calls every sink's hooks
(:class:`~lld_monitor.sinks.Sink`: ``log_row``, ``log_event``, ``alert``, ``close``) under the
monitor's failure policy, so a broken sink is reported once and skipped. A sink that defines
its own ``log_step(row)`` (the former hook) gets rows through it; a duck-typed sink gets the hooks
it has. Events that arrive before the run log opens are queued and written when it does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lld_monitor import columns as C
from lld_monitor.events import Alert
from lld_monitor.sinks import Sink


class EventDispatcher:
    """Routes the monitor's output; ``guard(where)`` is the failure policy's context manager."""

    def __init__(
        self,
        sinks: Sequence[Any],
        guard: Callable[[str], Any],
        skip_event: Callable[[Mapping[str, Any]], bool] = lambda event: False,
    ) -> None:
        self.sinks = list(sinks)
        self.writer: Any | None = None
        self._guard = guard
        self._skip_event = skip_event
        self._pending: list[dict[str, Any]] = []

    def _call(self, method: str, *args: Any) -> None:
        for sink in self.sinks:
            fn = getattr(sink, method, None)
            if fn is not None:
                with self._guard(f"sink {type(sink).__name__}.{method}"):
                    fn(*args)

    def open(self, writer: Any, first: Mapping[str, Any] | None = None) -> None:
        """Start writing to ``writer``: the ``first`` event, then those queued until now."""
        self.writer = writer
        if first is not None:
            self.event(dict(first))
        pending, self._pending = self._pending, []
        for event in pending:
            self.event(event)

    def event(self, event: dict[str, Any]) -> None:
        """Write an event and pass it to the sinks; queued until the run log opens."""
        if self.writer is None:
            self._pending.append(event)
            return
        if self._skip_event(event):
            return
        self.writer.log_event(event)
        self._call("log_event", event)

    def row(self, row: Mapping[str, Any]) -> None:
        """Write a step row and pass it to every sink's ``log_row(step, row)``."""
        self.writer.log_step(row)
        step = int(row[C.STEP])
        for sink in self.sinks:
            legacy = getattr(type(sink), "log_step", None)
            if legacy is not None and legacy is not Sink.log_step:  # overrides log_step itself
                with self._guard(f"sink {type(sink).__name__}.log_step"):
                    sink.log_step(row)
                continue
            fn = getattr(sink, "log_row", None)
            if fn is not None:
                with self._guard(f"sink {type(sink).__name__}.log_row"):
                    fn(step, row)

    def alert(self, alert: Alert) -> None:
        """Pass an alert to the sinks (its event goes through :meth:`event`)."""
        self._call("alert", alert)

    def close(self) -> None:
        """Close the sinks (the run log is the monitor's to close, after its token writer)."""
        self._call("close")
