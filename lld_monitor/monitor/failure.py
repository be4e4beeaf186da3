"""The monitor's failure policy: a failing hook never crashes training, except where it must.

- :meth:`FailurePolicy.guard` runs a local hook: in strict mode the exception propagates, else it
  is reported once (log + ``error`` event) and training carries on.
- :meth:`FailurePolicy.collective` runs a section whose every rank must reach the same
  collectives (the step's gather, the probe forward of a sharded model). An exception there is
  never swallowed: the other ranks are waiting inside a collective this rank will not reach, so
  swallowing it would hang them (NCCL) or abort them with a size mismatch (gloo). It propagates
  as :class:`CollectiveError`, which no enclosing ``guard`` swallows either: the run stops with
  one clear error instead of hanging.
"""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from lld_monitor.monitor import distributed

logger = logging.getLogger("lld_monitor")


class CollectiveError(RuntimeError):
    """A monitor section that every rank must complete failed on this rank; never swallowed."""


class FailurePolicy:
    """Report-once error handling; ``on_error(where, err)`` records the ``error`` event."""

    def __init__(self, strict: bool, on_error: Callable[[str, BaseException], None]) -> None:
        self.strict = bool(strict)
        self._on_error = on_error
        self._seen: set[str] = set()

    @contextmanager
    def guard(self, where: str) -> Iterator[None]:
        """Run a local hook: re-raise in strict mode or for a CollectiveError, else report."""
        try:
            yield
        except CollectiveError:
            raise
        except Exception as err:
            if self.strict:
                raise
            self.report(where, err)

    @contextmanager
    def collective(self, where: str) -> Iterator[None]:
        """Run a section every rank must complete: with several ranks an error is never swallowed.

        With one rank nothing waits on us, so the section is a plain :meth:`guard`.
        """
        if distributed.world_size() == 1:
            with self.guard(where):
                yield
            return
        try:
            yield
        except CollectiveError:
            raise
        except Exception as err:
            raise CollectiveError(
                f"lld_monitor: {where} failed on rank {distributed.rank()} of "
                f"{distributed.world_size()} inside a section every rank must complete "
                f"({type(err).__name__}: {err}). The other ranks wait in a collective this rank "
                "cannot reach, so the run stops here instead of hanging. Pass probe_fraction=0 "
                "to run without the post-update probe."
            ) from err

    def guarded(
        self, where: str, default: Any = None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`guard` returning ``default`` on a swallowed error."""

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def inner(*args: Any, **kwargs: Any) -> Any:
                with self.guard(where):
                    return fn(*args, **kwargs)
                return default

            return inner

        return wrap

    def report(self, where: str, err: BaseException) -> None:
        """Log the first failure of each (hook, exception type) and record an ``error`` event."""
        key = f"{where}:{type(err).__name__}"
        if key in self._seen:
            return
        self._seen.add(key)
        logger.error(
            "lld_monitor: %s failed on rank %d (%s: %s); training continues, the monitor skips "
            "this hook when it fails (pass strict=True to raise)\n%s",
            where,
            distributed.rank(),
            type(err).__name__,
            err,
            "".join(traceback.format_exception(err)),
        )
        try:
            self._on_error(where, err)
        except Exception as log_err:
            logger.error("lld_monitor: could not record the error event either: %s", log_err)
