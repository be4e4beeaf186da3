"""SIGTERM ends the run log before the process goes (a scheduler's stop: Slurm, Kubernetes).

For the length of a trainer's ``train()`` (``integrations/transformers.py``) or of a plain loop's
monitor (``with LLDMonitor(...)``, ``start()`` ... ``close()``): the monitor's handler raises
:class:`TerminatedBySignal` in the main thread, so the stack unwinds (locks released, ``finally``
blocks run) and the run log records the ending like any other exception; the process then exits
with status 143 (128 + 15), as it would have by the signal's default action. A handler that was
already set (the user's, the trainer's) is called instead and keeps its say; an ignored SIGTERM
stays ignored. No torch, no trainer.
"""

from __future__ import annotations

from typing import Any


class TerminatedBySignal(SystemExit):
    """Training ended by SIGTERM (a scheduler's stop: Slurm, Kubernetes): raised in the main
    thread by the monitor's handler when no other handler was set, so that the run log records
    the ending like any other exception; the process then exits with status 143 (128 + 15), as
    it would have by the signal's default action."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        import signal

        return f"terminated by {signal.Signals(self.signum).name} (signal {self.signum})"


NO_HANDLER = object()


def install_sigterm(on_signal: Any = None) -> Any:
    """For the length of ``train()``: SIGTERM ends the run log before the process goes. A
    handler that was already set (the user's, the trainer's) is called instead and keeps its
    say (nothing is swallowed: if it returns, training goes on); an ignored SIGTERM stays
    ignored; the default action becomes :class:`TerminatedBySignal` (``on_signal(signum)`` is
    called first). Only in the main thread (elsewhere Python allows no handler); returns what
    to restore."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return NO_HANDLER
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        if callable(previous):
            previous(signum, frame)
            return
        if previous == signal.SIG_IGN:
            return
        if on_signal is not None:
            on_signal(signum)
        raise TerminatedBySignal(signum)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):
        return NO_HANDLER
    return previous


def restore_sigterm(previous: Any) -> None:
    import signal

    if previous is NO_HANDLER:
        return
    try:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    except (ValueError, OSError):
        pass


class LoopEnding:
    """A plain loop's ending (``with LLDMonitor(...)``, or ``start()`` ... ``close()``): while
    held, SIGTERM ends the run log as the Trainer path does (``install_sigterm``), and a monitor
    never closed is closed when the interpreter exits, naming the signal or the uncaught
    exception that ended the process. ``close(error)`` is the monitor's close. Main thread
    only; held once; ``release()`` at close."""

    def __init__(self, close: Any) -> None:
        self._close = close
        self._previous: Any = None
        self.held = False
        self.signum: int | None = None  # the signal that ended the run

    def hold(self) -> None:
        if self.held:
            return
        import atexit

        self._previous = install_sigterm(self._on_signal)
        self.held = True
        atexit.register(self._at_exit)

    def _on_signal(self, signum: int) -> None:
        self.signum = signum

    def _at_exit(self) -> None:
        import sys

        error: BaseException | None = getattr(sys, "last_value", None)
        if self.signum is not None:
            error = TerminatedBySignal(self.signum)
        self._close(error)

    def release(self) -> None:
        if not self.held:
            return
        import atexit

        restore_sigterm(self._previous)
        atexit.unregister(self._at_exit)
        self.held = False
