"""LLDMonitor: the trainer-agnostic facade turning observed tensors into one run-log row per step.

Adapters (integrations/trl.py, integrations/transformers.py) and hand-written loops call the same
plain methods: ``observe_rollout``, ``observe_update``, ``observe_post_update``, ``llds_term``,
``end_step``, ``close``. Sums stay on the trainer's device until ``end_step``, which reduces them
across ranks (one gather, exact), moves one small vector to the host, writes the row on rank 0
and runs the detector, the sinks and the actions. The work is done by the parts listed in
docs/architecture.md; this class validates, wires them together and owns the lifecycle.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lld_monitor import columns as C
from lld_monitor.events import Alert, make_event, warn_user
from lld_monitor.monitor import config as monitor_config
from lld_monitor.monitor import distributed, llds_checks, rollout, step_metrics
from lld_monitor.monitor import resume as resume_state
from lld_monitor.monitor.actions import CHECKPOINT, STOP, ActionPolicy, Responder
from lld_monitor.monitor.config import MonitorConfig
from lld_monitor.monitor.correctness import CorrectnessRule, ThresholdWatch
from lld_monitor.monitor.dispatch import EventDispatcher
from lld_monitor.monitor.failure import FailurePolicy
from lld_monitor.monitor.llds_checks import OnceNotes
from lld_monitor.monitor.llds_switch import LLDSSwitch
from lld_monitor.monitor.row_checks import RowChecks
from lld_monitor.monitor.sigterm import LoopEnding
from lld_monitor.monitor.step_metrics import FIELD_INDEX, FIELD_NAMES, StepMetrics, row_from_sums
from lld_monitor.monitor.token_sampling import ProbeRecord, TokenSampler, TokenSource

logger = logging.getLogger("lld_monitor")


class RunFolderError(OSError):
    """The run folder cannot be created or written: raised at ``attach``/``start``, before any
    training, with what to do (the run log is the monitor's output; training without it would
    lose every row silently)."""


class LLDMonitor:
    """Diagnose the LLD death spiral during training and switch the LLDS regularizer on or off.

    ``monitor = LLDMonitor("runs/exp1"); monitor.attach(trainer); trainer.train()``, or call the
    plain ``observe_*`` / ``end_step`` methods from a hand-written loop.
    """

    def __init__(
        self, run_dir: str | Path, config: MonitorConfig | None = None, **overrides: Any
    ) -> None:
        """``config`` (a ``MonitorConfig``; default: the defaults) with ``overrides`` (any of
        its fields by name: ``LLDMonitor(run_dir, auto_llds=True)``); an unknown keyword raises
        and names the valid ones. The settings are checked by ``MonitorConfig`` itself."""
        if config is not None and not isinstance(config, MonitorConfig):
            raise ValueError(f"config must be an lld_monitor.MonitorConfig, got {config!r}")
        #: The settings this monitor was built with (frozen; the running state lives elsewhere).
        self.config = config = (config or MonitorConfig()).with_overrides(**overrides)
        self.run_dir = Path(run_dir)
        monitor_config.check_run_dir(self.run_dir, config.resume)  # here: at a step it is lost
        self._build_parts(config)
        self._init_state()

    def _build_parts(self, config: MonitorConfig) -> None:
        """The parts the settings make (each reads its own settings from ``config``)."""
        from lld_monitor.monitor.llds_watchdog import LLDSWatchdog

        self.correctness = CorrectnessRule(
            config.correct_fn, config.correct_threshold, config.correct_reward
        )
        self.dispatch = EventDispatcher(config.sinks, self.guard, self._replayed_event)
        self.actions = ActionPolicy(
            config.auto_llds,
            config.auto_llds_on,
            config.stop_on_collapse,
            config.checkpoint_on_collapse,
        )
        self.tokens = TokenSampler(
            config.token_samples_per_step,
            config.response_samples_per_step,
            bool(config.strict),
            self.guard,
        )
        #: The LLDS watchdog (llds_watchdog.py), or None when off (the default).
        self.watchdog = LLDSWatchdog() if config.llds_watchdog else None
        self.meta: dict[str, Any] = dict(config.meta or {})
        self.llds = LLDSSwitch(monitor_config.check_llds(config.llds), self._on_llds_change)
        self.failures = FailurePolicy(bool(config.strict), self._on_error)
        self.threshold_watch = ThresholdWatch(self.correctness)
        self.notes = OnceNotes(self._event, self.guard)  # llds checks and notes, once per run
        self.row_checks = RowChecks(
            self.notes, self.threshold_watch, self._event, self.dispatch.alert, self.guard
        )
        self.responder = Responder(
            monitor_config.make_detector(config.detector),
            self.actions,
            self.llds,
            llds_given=config.llds is not None,
            emit=self._event,
            alert_sink=self.dispatch.alert,
            request=self._request,
            guard=self.guard,
        )

    probe_fraction = property(lambda self: self.config.probe_fraction)  # (read from config)
    strict = property(lambda self: bool(self.config.strict))
    llds_with_dropout = property(lambda self: bool(self.config.llds_with_dropout))
    resume = property(lambda self: bool(self.config.resume))

    def _init_state(self) -> None:
        """The running state of a fresh monitor."""
        #: Last step already in a resumed folder: rows, token samples and events of steps up to
        #: it are not written again (a run resumed from an earlier checkpoint replays them).
        self.resumed_last_step: int | None = None
        self.rank = 0
        self.writer: Any | None = None
        self.adapter: Any | None = None
        self.step = 0  # the step the next end_step() writes (unless given)
        self.last_row: dict[str, Any] = {}
        self.last_probe: ProbeRecord | None = None
        self.should_stop = False  # set by stop_on_collapse; adapters copy it into control
        self.should_save = False  # set by checkpoint_on_collapse; reset by the adapter
        self.closed = False
        self._ending = LoopEnding(self._close_at_exit)  # a plain loop's SIGTERM and exit
        self._acc = StepMetrics()
        self._last_rollout: rollout.Rollout | None = None
        self.reward_fn_names: list[str] = []  # the same on every rank: fixes the vector length
        self._lock = threading.RLock()
        self.reuse_warning: str | None = None  # set by an adapter when LLDS can never act
        self.last_local_sums: torch.Tensor | None = None  # strict mode: see sum_layout()

    # -- setup --------------------------------------------------------------------------------

    def attach(self, trainer: Any) -> LLDMonitor:
        """Hook into ``trainer`` (TRL GRPOTrainer: full; transformers Trainer: standard metrics)."""
        from lld_monitor.integrations import adapter_for

        self.adapter = adapter_for(self, trainer)
        self.adapter.install()
        return self

    def start(self, *, trainer: str = "custom", lld_columns: bool = True, **meta: Any) -> None:
        """Open the run log (rank 0) with the run's meta; called by attach or the first end_step.
        A plain loop (``trainer="custom"``) also gets the SIGTERM handler (``_catch_sigterm``)."""
        if trainer == "custom" and self.adapter is None and self.writer is None:
            self._catch_sigterm()
        with self._lock:
            if self.writer is not None or self.closed:
                return
            self.rank = distributed.rank()
            if self.rank != 0:
                return
            from lld_monitor.runlog import RunWriter

            config = self._config_meta()
            full_meta = monitor_config.run_meta(trainer, lld_columns, config, meta, self.meta)
            if self.resume:
                self.resumed_last_step = resume_state.last_logged_step(self.run_dir)
            try:
                self.writer = RunWriter(self.run_dir, meta=full_meta, resume=self.resume)
            except FileExistsError:
                raise  # (its message already says what to do: resume=True or another folder)
            except OSError as exc:
                # fail fast, before training, with what to do (not a bare OSError mid-attach)
                raise RunFolderError(
                    exc.errno,
                    f"lld_monitor cannot write its run folder {self.run_dir}: "
                    f"{exc.strerror or exc}; pass a run_dir in a folder you can write to "
                    "(LLDMonitor('runs/exp1', ...)); nothing was trained yet",
                ) from exc
            self.dispatch.open(
                self.writer,
                make_event("lifecycle", self.step, "attach", f"monitor attached to {trainer}"),
            )

    @property
    def rows_written(self) -> int:
        """Step rows this monitor wrote whole to the run log (held or lost rows not counted)."""
        return 0 if self.writer is None else int(self.writer.n_steps)

    def _config_meta(self) -> dict[str, Any]:
        return monitor_config.config_meta(
            probe_fraction=self.probe_fraction,
            correctness=self.correctness,
            actions=self.actions,
            tokens=self.tokens,
            llds_with_dropout=self.llds_with_dropout,
            detector=self.detector,
            llds=self.llds.config,
            watchdog=self.watchdog,
        )

    # -- failure policy (failure.py) ---------------------------------------------------------------

    def guard(self, where: str) -> Any:
        """Context manager for a local hook: strict re-raises, else report once and carry on."""
        return self.failures.guard(where)

    def collective(self, where: str) -> Any:
        """Context manager for a section every rank must complete (never swallowed on >1 rank)."""
        return self.failures.collective(where)

    def guarded(
        self, where: str, default: Any = None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`guard` returning ``default`` on a swallowed error."""
        return self.failures.guarded(where, default)

    def agree(self, where: str, ok: bool, device: torch.device | None = None) -> bool:
        """True when every rank is ``ok`` (one small all_reduce; every rank must call it).

        Rank 0 records which ranks were not, so a section skipped everywhere is on the record.
        """
        with self.collective(f"{where} (agreement)"):
            failed = distributed.failed_ranks(ok, device)
        if failed and distributed.world_size() > 1:
            self._record_rank_failure(where, failed, "skipped on every rank")
        return not failed

    def _record_rank_failure(self, where: str, failed: list[int], what: str) -> None:
        msg = f"{where} failed on rank(s) {failed}: {what} (that rank's log has the traceback)"
        with self.guard("error event"):
            self._emit("error", self.step, where, msg, "warning", {"ranks": failed})

    def _on_error(self, where: str, err: BaseException) -> None:
        msg = f"{where} failed: {type(err).__name__}: {err}"
        self._emit("error", self.step, where, msg, "warning", {"exception": type(err).__name__})

    # -- events (dispatch.py) ----------------------------------------------------------------------

    def _event(self, event: dict[str, Any]) -> None:
        """Write an event (rank 0) and pass it to the sinks; queued until the run log opens."""
        if self.rank != 0:
            return
        self.dispatch.event(event)

    def _emit(self, *args: Any) -> None:
        """Record ``make_event(*args)``: type, step, kind, message, severity, evidence."""
        self._event(make_event(*args))

    # -- the port adapters use (integrations/: no private name of the monitor) ----------------

    def lifecycle_event(
        self,
        step: int | None,
        kind: str,
        message: str,
        severity: str = "info",
        evidence: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a ``lifecycle`` event (rank 0 writes it): what an adapter saw of the run."""
        self._emit("lifecycle", step, kind, message, severity, dict(evidence or {}))

    def add_reward_fn(self, name: str) -> None:
        """Name a reward function (its column ``reward_fn/<name>``); the same names in the same
        order on every rank (they fix the reduced vector's length); a name given twice counts
        once."""
        if name not in self.reward_fn_names:
            self.reward_fn_names.append(name)

    sinks = property(lambda self: self.dispatch.sinks)

    def _on_llds_change(self, enabled: bool, lam: float, reason: str) -> None:
        msg = LLDSSwitch.change_message(enabled, lam, reason)
        if enabled and self.reuse_warning:
            warn_user(self.reuse_warning)
            msg += f"; {self.reuse_warning}"
        kind = "llds_enable" if enabled else "llds_disable"
        evidence = {"enabled": int(enabled), "lam": lam, "reason": reason}
        with self.guard("llds switch event"):
            self._emit("intervention", self.step, kind, msg, "info", evidence)

    # -- correctness (correctness.py) --------------------------------------------------------------

    @property
    def correct_fn(self) -> Callable[..., Any] | None:
        return self.correctness.correct_fn

    @correct_fn.setter
    def correct_fn(self, fn: Callable[..., Any] | None) -> None:
        rule = self.correctness
        self.correctness = CorrectnessRule(fn, rule.threshold, rule.reward)
        self.threshold_watch.rule = self.correctness

    correct_threshold = property(lambda self: self.correctness.threshold)

    def correct_mask(
        self,
        rewards: torch.Tensor | None,
        advantages: torch.Tensor | None,
        batch: int,
        device: torch.device,
        rewards_per_func: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """[B] bool by the monitor's correctness rule (lld_monitor/monitor/correctness.py)."""
        return self.correctness(rewards, advantages, batch, device, rewards_per_func)

    # -- plain API: observe (rollout.py, step_metrics.py) ------------------------------------------

    def observe_rollout(
        self,
        logp_old: torch.Tensor,
        mask: torch.Tensor,
        *,
        rewards: torch.Tensor | None = None,
        advantages: torch.Tensor | None = None,
        token_ids: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        num_searches: torch.Tensor | None = None,
        kl: torch.Tensor | None = None,
        completion_mask: torch.Tensor | None = None,
        rewards_per_func: Mapping[str, torch.Tensor] | None = None,
        truncated: torch.Tensor | None = None,
    ) -> None:
        """Record a batch under the sampling policy; ``logp_old``, ``mask``, ``entropy`` are [B, L].

        ``mask`` is 1 on generated tokens only (tool feedback and padding 0). Confidence, reward,
        entropy and length columns of the current step come from here; the batch is kept for
        :meth:`observe_post_update`. ``completion_mask`` [B, L] (1 on every completion position,
        tool feedback included; 0 on padding) lets the token samples show tool feedback.
        ``rewards`` [B] is the total reward (NaN = unscored); ``rewards_per_func`` maps each
        reward function's name to its raw rewards [B] (columns ``reward_fn/<name>``, and the
        correctness rule's ``correct_reward`` / ``correct_fn``). ``truncated`` [B] bool marks
        responses cut at the length cap (column ``frac_truncated``, the ``truncation`` alert).
        """
        with self.guard("observe_rollout"):
            self._last_rollout = rollout.observe_rollout(
                self._acc,
                self.correctness,
                logp_old,
                mask,
                rewards=rewards,
                advantages=advantages,
                token_ids=token_ids,
                entropy=entropy,
                num_searches=num_searches,
                kl=kl,
                completion_mask=completion_mask,
                rewards_per_func=rewards_per_func,
                truncated=truncated,
            )

    def observe_reward_fn(self, name: str, rewards: torch.Tensor) -> None:
        """Add the raw rewards [B] of one reward function (column ``reward_fn/<name>``)."""
        with self.guard("observe_reward_fn"):
            self._acc.add_reward_fn(name, rewards)

    def observe_groups(self, n_zero_std: torch.Tensor | float, n_groups: int) -> None:
        """Add prompt groups whose rewards were all equal (column ``frac_zero_std_groups``)."""
        with self.guard("observe_groups"):
            self._acc.add("zero_std_groups", n_zero_std)
            self._acc.add("n_groups", float(n_groups))

    def observe_update(
        self,
        grad_norm: torch.Tensor | float | None = None,
        loss: torch.Tensor | float | None = None,
        llds_out: Any | None = None,
    ) -> None:
        """Record one optimizer update: pre-clip ``grad_norm``, ``loss``, an ``LLDSOutput``."""
        with self.guard("observe_update"):
            self._acc.add_update(grad_norm, loss)
            if llds_out is not None:
                self._acc.add_llds(llds_out)

    def observe_post_update(
        self,
        logp_new: torch.Tensor,
        *,
        rows: torch.Tensor | None = None,
        tokenizer: Any | None = None,
    ) -> None:
        """Measure displacement of the last observed rollout under the updated policy.

        ``logp_new`` [B', L] are the same completions' log-probs after the batch's last update, for
        all rows of the rollout or for the subset ``rows`` [B'] (a probe sample). ``tokenizer``
        decodes the token samples' text.
        """
        with self.guard("observe_post_update"):
            if self._last_rollout is None:
                raise ValueError(
                    "observe_post_update() needs an observe_rollout() of the same batch first"
                )
            ro = self._last_rollout.pick(rows)
            self.measure_displacement(
                ro.logp_old,
                logp_new,
                ro.mask,
                ro.correct,
                token_ids=ro.token_ids,
                rewards=ro.rewards,
                advantages=ro.advantages,
                rows=rows,
                tokenizer=tokenizer,
                completion_mask=ro.completion_mask,
            )

    def observe_in_batch(self, logp_new: torch.Tensor) -> None:
        """Measure the last observed rollout's responses again while their batch is reused.

        ``logp_new`` [B, L] are their log-probs under the current policy, after at least one
        optimizer update that included them (a rollout batch trained on for several updates:
        TRL's ``num_iterations`` > 1). Adds the correct responses and those whose summed change
        since generation is < 0 to the ``inbatch_*`` columns: the paper's indicator before the
        batch's last update. Measure each response once per batch (the TRL adapter does: the
        first time the loss sees it again), so that the counts are of distinct responses.
        """
        with self.guard("observe_in_batch"):
            ro = self._last_rollout
            if ro is None:
                raise ValueError("observe_in_batch() needs an observe_rollout() of the batch first")
            self._acc.add_in_batch(ro.logp_old, logp_new, ro.mask, ro.correct, ro.rewards)

    def measure_displacement(
        self,
        logp_old: torch.Tensor,
        logp_new: torch.Tensor,
        mask: torch.Tensor,
        correct: torch.Tensor,
        *,
        token_ids: torch.Tensor | None = None,
        rewards: torch.Tensor | None = None,
        advantages: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        tokenizer: Any | None = None,
        completion_mask: torch.Tensor | None = None,
        stepped: bool | None = None,
    ) -> ProbeRecord:
        """Fold one post-update measurement ([B, L] tensors, ``correct`` [B]) into this step.

        ``mask`` marks generated tokens, ``completion_mask`` every completion position (for the
        whole-response samples). A probe in which the optimizer did not step (``stepped=False``,
        or no log-prob moved) is left out of the displacement columns (rollout.py).
        """
        record = rollout.measure_displacement(
            self._acc,
            self.step,
            logp_old,
            logp_new,
            mask,
            correct,
            token_ids=token_ids,
            rows=rows,
            rewards=rewards,
            completion_mask=completion_mask,
            stepped=stepped,
        )
        self.last_probe = record
        self.tokens.add(record, rewards, advantages, tokenizer, keep=self.rank == 0)
        return record

    def token_sample_rows(self, sources: Sequence[TokenSource] | None = None) -> list[dict]:
        """The step's token samples (lld_monitor/monitor/token_sampling.py, ``sample_rows``)."""
        return self.tokens.rows(sources)

    # -- plain API: LLDS (llds_switch.py) ----------------------------------------------------------

    def llds_term(
        self,
        logp_new: torch.Tensor,
        logp_old: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        **kw: Any,
    ) -> tuple[torch.Tensor, Any | None]:
        """``(lam * L_LLDS, LLDSOutput)``: [B, L] log-probs, [B] advantages; ``(0, None)`` if off.

        Add the first element to the loss (divide by the number of accumulated micro-batches
        yourself); its statistics go to the step's llds_* columns. Keywords (``answer_mask``,
        ``mean_valid_searches``, ``action_ids``): :meth:`LLDSSwitch.term`.
        """
        try:
            term, out = self.llds.term(logp_new, logp_old, advantages, mask, **kw)
            if out is not None:
                self._acc.add_llds(out)
            return term, out
        except Exception as err:
            if self.strict:
                raise
            self.failures.report("llds_term", err)
            return logp_new.new_zeros(()), None

    @staticmethod
    def sum_layout() -> tuple[tuple[str, ...], int]:
        """Layout of the reduced vector: standard fields, K confidence sums, K probe sums."""
        from lld_monitor.metrics import SUM_FIELDS

        return FIELD_NAMES, len(SUM_FIELDS)

    # -- plain API: the row (row_checks.py, llds_checks.py) -----------------------------------

    def end_step(self, step: int | None = None, **extra_columns: Any) -> dict[str, Any]:
        """Close the current step: reduce across ranks, write one row (rank 0), detect, act.

        Returns the row (the same on every rank). ``extra_columns`` are added to it as given.
        Every rank reaches the reduction exactly once per call: a rank whose own part failed
        sends zeros with an error flag, and rank 0 records the failure.
        """
        step = self.step if step is None else int(step)
        row: dict[str, Any] = {}
        host = self._reduce_step(step)
        if host is not None:
            with self.guard("end_step"):
                row = self._write_row(step, host, extra_columns)
        self._acc = StepMetrics()
        self.tokens.reset()
        self.step = (row.get(C.STEP, step) if row else step) + 1
        return row

    def _reduce_step(self, step: int) -> list[float] | None:
        """This rank's packed sums, gathered from every rank and reduced (host floats)."""
        acc, names = self._acc, self.reward_fn_names
        names += sorted(set(acc.reward_fn) - set(names))  # first seen this step
        vec: torch.Tensor | None = None
        device = distributed.collective_device(acc.device)
        with self.guard("end_step"):
            if self.writer is None and self.rank == 0 and self.adapter is None:
                self.start()
            vec = acc.pack(device, names)
            if self.strict:  # tests: this rank's sums before the cross-rank reduction
                self.last_local_sums = vec.detach().clone()
        if vec is None:
            vec = StepMetrics.failed(device, len(names))
        if distributed.rank() == 0:  # the switch state only rank 0 decides
            vec[FIELD_INDEX["llds_on"]] = float(self.llds.enabled)
            vec[FIELD_INDEX["llds_lam"]] = self.llds.lam
        with self.collective("end_step reduction"):
            host, failed = step_metrics.gather_and_reduce(vec)
        if distributed.world_size() == 1:
            return None if failed else host  # the failure is reported already
        if failed:
            what = "those ranks sent zeros; the row holds the other ranks' sums"
            self._record_rank_failure("end_step", failed, what)
        on, lam = host[FIELD_INDEX["llds_on"]], host[FIELD_INDEX["llds_lam"]]
        if not math.isnan(on) and self.llds._sync(bool(on > 0.5), lam):
            logger.info("lld_monitor: LLDS state adopted from rank 0")
        return host

    def _write_row(self, step: int, host: list[float], extra: Mapping[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {C.STEP: step, C.TIME: time.time()}
        row.update(row_from_sums(host, self.reward_fn_names))
        row.update(extra)
        self.row_checks.before_write(row, host, step, self.reward_fn_names, self.rank)
        self.last_row = row
        fresh = not resume_state.replaying(self.resumed_last_step, step)  # (not a resumed one's)
        if self.rank == 0 and self.writer is not None and fresh:
            self.dispatch.row(row)
            self.tokens.write(self.writer, step)
        who = llds_checks.llds_subject(self.llds.enabled, self.auto_llds)
        self.row_checks.after_write(row, step, who)
        self._detect(row, step)
        return row

    def check_llds_can_act(
        self, *, reuse_problem: str | None = None, num_generations: int | None = None
    ) -> list[str]:
        """Warn (once each) when LLDS is on or may be switched on but cannot act or rarely does.

        Adapters call this at attach: ``reuse_problem`` (why each batch gets a single update, see
        ``integrations.trl.llds_reuse_problem``), ``num_generations`` (responses per prompt).
        Returns the messages said now (llds_checks.py).
        """
        who = llds_checks.llds_subject(self.llds.enabled, self.auto_llds, self.auto_llds_on)
        problems = llds_checks.can_act_problems(who, reuse_problem, num_generations)
        return [m for key, m, ev in problems if self.notes.say(key, self.step, m, "warning", ev)]

    # -- detector and actions (actions.py) ---------------------------------------------------------

    def _detect(self, row: Mapping[str, Any], step: int) -> None:
        """Feed the detector (every rank, same rows -> same alerts) and act on its alerts; then
        the LLDS watchdog (rank 0 decides the switch; the other ranks adopt it)."""
        self.responder.update(row, step)
        if self.watchdog is None or self.rank != 0:
            return
        with self.guard("llds watchdog"):
            decision = self.watchdog.update(row, self.llds.enabled, self.llds.lam)
            if decision is None:
                return
            if decision.action == "off":
                self.llds.disable(reason=decision.reason)
            else:
                self.llds.enable(decision.lam, reason=decision.reason)

    def decide(self, alert: Alert) -> list[tuple[str, str]]:
        """The actions this monitor's settings take on ``alert``: ``[(action, reason), ...]``."""
        return self.actions.decide(alert, self.llds.enabled)

    auto_llds = property(lambda self: self.actions.auto_llds)
    auto_llds_on = property(lambda self: self.actions.auto_llds_on)
    stop_on_collapse = property(lambda self: self.actions.stop_on_collapse)
    checkpoint_on_collapse = property(lambda self: self.actions.checkpoint_on_collapse)
    token_samples_per_step = property(lambda self: self.tokens.token_samples)
    response_samples_per_step = property(lambda self: self.tokens.response_samples)

    def _request(self, action: str) -> None:
        """A trainer request of an action: the adapters copy the flags into ``control``."""
        self.should_stop |= action == STOP
        self.should_save |= action == CHECKPOINT

    def take_save_request(self) -> bool:
        """Whether a checkpoint was requested since the last call (the adapter then saves once)."""
        requested, self.should_save = self.should_save, False
        return requested

    def set_llds_reuse_problem(self, problem: str | None) -> None:
        """An adapter's finding on why LLDS can never act in the trainer's setup (None: it can);
        said when LLDS is switched on."""
        self.reuse_warning = problem

    detector = property(lambda self: self.responder.detector)
    last_alerts = property(lambda self: self.responder.last_alerts)

    # -- resume (resume.py) ------------------------------------------------------------------------

    def _replayed_event(self, event: Mapping[str, Any]) -> bool:
        """An alert/phase/intervention event of a step the resumed folder already holds."""
        return resume_state.replayed_event(self.resumed_last_step, event)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs (plain JSON): step, LLDS switch, detector, phase, warnings.

        The adapters save it with every Trainer checkpoint (``trainer_state.json``).
        """
        return resume_state.monitor_state(
            step=self.step,
            llds_enabled=self.llds.enabled,
            llds_lam=self.llds.lam,
            phase=self.responder.phase,
            detector=self.detector,
            reward_fn_names=self.reward_fn_names,
            correctness=self.threshold_watch.state_dict(),
            watchdog=None if self.watchdog is None else self.watchdog.state_dict(),
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` (the LLDS switch state is an ``intervention`` event)."""
        s = resume_state.parse_state(state)
        self.step = s.step
        if s.detector is not None and hasattr(self.detector, "load_state_dict"):
            self.detector.load_state_dict(s.detector)
        self.responder.phase = s.phase
        for name in s.reward_fn_names:
            self.add_reward_fn(name)
        self.threshold_watch.load_state_dict(s.correctness)
        if self.watchdog is not None and s.watchdog is not None:  # (a run without one: afresh)
            self.watchdog.load_state_dict(s.watchdog)
        asked_on, asked_lam = self.llds.enabled, self.llds.lam  # what this script configured
        self.llds._sync(s.llds_enabled, s.llds_lam)
        message, evidence = s.restore_note(asked_on, asked_lam)
        if self.rank == 0:  # said on the console, not only in events.jsonl
            if "asked_llds_enabled" in evidence:
                warn_user(f"lld_monitor: {message}")
            else:
                logger.warning("lld_monitor: %s", message)
        with self.guard("resume event"):
            self._emit("lifecycle", self.step, "restore", message, "info", evidence)

    # -- end ----------------------------------------------------------------------------------

    def close(self, error: BaseException | None = None) -> None:
        """Flush and close the run log and the sinks; idempotent."""
        if self.closed:
            return
        self.closed = True
        self._ending.release()
        if self.adapter is not None:
            with self.guard("adapter.uninstall"):
                self.adapter.uninstall()
        self.dispatch.close()
        if self.writer is not None:
            self.tokens.close()  # pending token files first
            with self.guard("run log close"):
                self.writer.close(error=error)

    def __enter__(self) -> LLDMonitor:
        self._catch_sigterm()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(error=exc)

    # -- a plain loop's ending (sigterm.py) ----------------------------------------------------

    def _catch_sigterm(self) -> None:
        """A plain loop: SIGTERM ends the run log (closed.json, then exit status 143; a handler
        of the user's keeps its say) and a monitor never closed closes at interpreter exit."""
        if not self.closed:
            self._ending.hold()

    def _close_at_exit(self, error: BaseException | None) -> None:
        if not self.closed:
            with self.guard("close at exit"):
                self.close(error=error)
