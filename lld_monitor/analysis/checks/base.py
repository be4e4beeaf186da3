"""The contract of a check: one small incremental object per kind of alert (river's drift style).

A check reads the row's features from ``Signals`` (computed once per row, before any check) and
keeps its own running state:

- ``kind`` (class attribute): the check's name, and the default ``key`` (the name of its state
  in the detector's state, unique within one detector). For most checks it is also the one
  alert kind they raise, but not for all: ``kinds`` says which.
- ``kinds`` (class attribute): the alert kinds its ``update`` may return or leave in
  ``pending``; defaults to ``(kind,)``. A check that only feeds the phase machine its ``rank``
  (the trend levels, the sharp drop) declares ``()``: the stagnation, decay and collapse alerts
  are the machine's. The contract tests hold every check to it.
- ``__init__(config)`` stores the ``DetectorConfig``; ``reset()`` rebuilds the fresh state.
- ``update(s) -> list[Alert]``: called once per accepted row, in the detector's order (which is
  the order of the alerts within a row). It returns a LIST, usually the shared empty
  ``NO_ALERTS`` (never mutate a returned list); each alert carries its reason in numbers.
- ``rank``: a check that feeds the phase machine sets it on every row to the phase rank it
  supports now (1 stagnation, 2 decay: confirmed by the check itself; 3 collapse: the machine
  asks ``collapse_persist_steps`` of it); 0 otherwise (the class default). ``recover_after``: the
  steps a phase it raised outlasts its support (the machine takes at least ``recover_steps``).
- ``state_dict()`` is plain JSON (no NaN: ``analysis.trend.json_float``), ``load_state_dict(d)``
  restores it; ``load_state_dict(state_dict())`` then ``update`` behaves as the original would.
- ``immediate`` (class attribute): the phase machine escalates on the row of the check's own
  alert, which it leaves in ``pending`` (an ``Alert`` or None, set on every row) instead of
  returning it; its persistence is its own. Every check has ``pending`` (None unless
  ``immediate``).
- ``row_only`` (class attribute): the check reads nothing of ``s`` but ``step``, the row's raw
  values (the ``signals.INPUT_COLUMNS`` attributes) and ``warm``; not another check, not the
  phase, not the features. The replay may then run it in a second process, on plain row
  records with exactly those fields (``analysis/parallel.py``): it must give there what it
  gives in the detector.
- ``begin_replay(columns)`` / ``end_replay()``: a whole table is about to be fed to this fresh
  check, every row reaching it (steps strictly increasing), ``columns`` mapping each input
  column to its [n] float array; the check may precompute from it (a bound that lets rows skip
  work) and must give the same alerts as without it; ``end_replay`` drops what it kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, cast

from lld_monitor.analysis.config import DetectorConfig
from lld_monitor.events import Alert

if TYPE_CHECKING:
    from lld_monitor.analysis.signals import Signals

#: The empty result of ``Check.update``, shared: never mutate it.
NO_ALERTS: list[Alert] = []


class Check:
    """Base of every check; subclasses override ``reset``, ``update`` and the state methods."""

    __slots__ = ("config",)
    kind: ClassVar[str] = ""
    kinds: ClassVar[tuple[str, ...]] = ()
    immediate: ClassVar[bool] = False
    row_only: ClassVar[bool] = False
    rank: int = 0
    recover_after: float = 0.0
    pending: Alert | None = None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "kinds" not in cls.__dict__ and cls.kind:
            cls.kinds = (cls.kind,)

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.reset()

    @property
    def key(self) -> str:
        """The name of this check's state in the detector's state."""
        return self.kind

    def reset(self) -> None:
        """Forget every row seen; keep the config."""

    def update(self, s: Signals) -> list[Alert]:
        """Read the row's features; the alerts this row raises (usually ``NO_ALERTS``)."""
        raise NotImplementedError

    def begin_replay(self, columns: Mapping[str, Any]) -> None:
        """A whole table follows, from this fresh state (see the module docstring)."""

    def horizon(self, columns: Mapping[str, Any]) -> None:
        """The whole table this run is (known in a replay: ``columns``, as ``begin_replay``
        gets them), from this fresh state: a check may judge the run on its length (the
        level-shift test holds a run of at most ``stats.GLR_SHORT_ROWS`` rewards to a short
        run's threshold). Unlike ``begin_replay``, this may change answers; a live run has no
        horizon."""

    def end_replay(self) -> None:
        """Drop what ``begin_replay`` kept."""

    def state_dict(self) -> dict[str, Any]:
        """The running state as plain JSON."""
        return {}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``."""
        self.reset()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r})"


class StreakCheck(Check):
    """An exact condition held on rows in a row (``holds``: True, False, or None when the row
    says nothing, which neither counts nor breaks the streak); fires once when the streak
    reaches the ``DetectorConfig`` field named by ``rows_setting``, re-arms on a row where it
    is False. Counted from the first row (no warm-up) and ``row_only``: ``holds`` reads the
    row's raw values."""

    __slots__ = ("fired", "rows", "since")
    row_only = True
    #: The name of the ``DetectorConfig`` field: rows in a row that fire the alert.
    rows_setting: ClassVar[str] = ""

    def reset(self) -> None:
        self.rows = 0
        self.since = 0
        self.fired = False

    @property
    def rows_needed(self) -> int:
        return cast(int, getattr(self.config, self.rows_setting))

    def holds(self, s: Signals) -> bool | None:
        raise NotImplementedError

    def alert(self, s: Signals) -> Alert:
        raise NotImplementedError

    def update(self, s: Signals) -> list[Alert]:
        h = self.holds(s)
        if h is None:
            return NO_ALERTS
        if not h:
            self.rows = 0
            self.fired = False
            return NO_ALERTS
        if self.rows == 0:
            self.since = int(s.step)
        self.rows += 1
        if self.rows >= self.rows_needed and not self.fired:
            self.fired = True
            return [self.alert(s)]
        return NO_ALERTS

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "since": self.since, "fired": self.fired}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.reset()
        self.rows, self.since, self.fired = int(d["rows"]), int(d["since"]), bool(d["fired"])
