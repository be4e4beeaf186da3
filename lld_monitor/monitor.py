"""LLDMonitor: the trainer-agnostic core that turns observed tensors into one run-log row per step.

Adapters (integrations/trl.py, integrations/transformers.py) and hand-written loops call the same
plain methods: ``observe_rollout``, ``observe_update``, ``observe_post_update``, ``llds_term``,
``end_step``, ``close``. Sums stay on the trainer's device until ``end_step``, which reduces them
across ranks (``all_reduce(SUM)``, exact), moves one small vector to the host, writes the row on
rank 0 and runs the detector, the sinks and the actions.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lld_monitor import columns as C
from lld_monitor import distributed
from lld_monitor.actions import (  # noqa: F401  (re-exported: the former home)
    AUTO_LLDS_ACCEPTED,
    AUTO_LLDS_KINDS,
    AUTO_LLDS_LAMBDA,
    COLLAPSE_KINDS,
    ActionPolicy,
)
from lld_monitor.correctness import CorrectnessRule, ThresholdWatch
from lld_monitor.dispatch import EventDispatcher
from lld_monitor.events import Alert, make_event
from lld_monitor.failure import FailurePolicy
from lld_monitor.llds_switch import LLDSSwitch
from lld_monitor.step_metrics import FIELD_NAMES, StepMetrics, row_from_sums
from lld_monitor.token_sampling import (  # noqa: F401  (re-exported: the former home)
    SAMPLE_RESPONSE,
    SAMPLE_TOP_TOKEN,
    ProbeRecord,
    TokenSampler,
    TokenSource,
)

logger = logging.getLogger("lld_monitor")

#: ``frac_zero_std_groups`` of a rollout batch at or above which the monitor warns (once) that
#: LLDS's gate rarely fires (most groups give every response advantage 0).
ZERO_STD_WARN = 0.75


def _check_completion_mask(completion_mask: torch.Tensor | None, ref: torch.Tensor) -> None:
    """ValueError unless ``completion_mask`` is None or [B, L] like ``ref``."""
    if completion_mask is not None and completion_mask.shape != ref.shape:
        raise ValueError(
            f"completion_mask must be [B, L] = {list(ref.shape)} like the log-probs and mask, got "
            f"{tuple(completion_mask.shape)} (1 on every completion position, 0 on padding)"
        )


class LLDMonitor:
    """Diagnose the LLD death spiral during training and switch the LLDS regularizer on or off.

    ``monitor = LLDMonitor("runs/exp1"); monitor.attach(trainer); trainer.train()``, or call the
    plain ``observe_*`` / ``end_step`` methods from a hand-written loop.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        llds: Any | None = None,
        probe_fraction: float = 0.25,
        correct_fn: Callable[[torch.Tensor | None, torch.Tensor | None], torch.Tensor]
        | None = None,
        correct_threshold: float = 1.0,
        correct_reward: str | None = None,
        sinks: Sequence[Any] = (),
        detector: Any = True,
        auto_llds: bool = False,
        auto_llds_on: Sequence[str] = AUTO_LLDS_KINDS,
        stop_on_collapse: bool = False,
        checkpoint_on_collapse: bool = False,
        token_samples_per_step: int = 4,
        response_samples_per_step: int = 4,
        strict: bool = False,
        meta: Mapping[str, Any] | None = None,
        llds_with_dropout: bool = False,
        resume: bool = False,
    ) -> None:
        if not 0.0 <= float(probe_fraction) <= 1.0:
            raise ValueError(
                f"probe_fraction must be in [0, 1] (0 turns the post-update probe off), "
                f"got {probe_fraction!r}"
            )
        from lld_monitor.llds import LLDSConfig

        if llds is not None and not isinstance(llds, LLDSConfig):
            raise ValueError("llds must be an lld_monitor.LLDSConfig or None")
        self.run_dir = Path(run_dir)
        launched_rank = os.environ.get("RANK", "0")  # set by torchrun/accelerate before init
        if (
            distributed.rank() == 0
            and launched_rank == "0"
            and ((self.run_dir / "steps.jsonl").exists() or (self.run_dir / "meta.json").exists())
        ):
            # fail here, not at the first step (where the error would be reported and swallowed)
            if not resume:
                raise FileExistsError(
                    f"{self.run_dir} already holds a run; give the monitor a new folder (or "
                    "delete that one), or pass resume=True to continue it (training resumed "
                    "from a checkpoint)"
                )
        self.probe_fraction = float(probe_fraction)
        self.correctness = CorrectnessRule(correct_fn, correct_threshold, correct_reward)
        self.dispatch = EventDispatcher(sinks, self.guard, self._replayed_event)
        self.actions = ActionPolicy(
            auto_llds, auto_llds_on, stop_on_collapse, checkpoint_on_collapse
        )
        self.strict = bool(strict)
        self.tokens = TokenSampler(
            token_samples_per_step, response_samples_per_step, self.strict, self.guard
        )
        self.llds_with_dropout = bool(llds_with_dropout)
        self.resume = bool(resume)
        #: Last step already in a resumed folder: rows, token samples and events of steps up to
        #: it are not written again (a run resumed from an earlier checkpoint replays them).
        self.resumed_last_step: int | None = None
        self.meta: dict[str, Any] = dict(meta or {})
        self._llds_given = llds is not None
        config = llds if llds is not None else LLDSConfig(enabled=False)
        self.llds = LLDSSwitch(config, self._on_llds_change)
        self.detector = self._make_detector(detector)

        self.rank = 0
        self.writer: Any | None = None
        self.adapter: Any | None = None
        self.step = 0  # the step the next end_step() writes (unless given)
        self.rows_written = 0
        self.last_row: dict[str, Any] = {}
        self.last_alerts: list[Alert] = []
        self.last_probe: ProbeRecord | None = None
        self.should_stop = False  # set by stop_on_collapse; adapters copy it into control
        self.should_save = False  # set by checkpoint_on_collapse; reset by the adapter
        self.closed = False
        self._acc = StepMetrics()
        self._last_rollout: dict[str, Any] | None = None
        self.failures = FailurePolicy(self.strict, self._on_error)
        self.threshold_watch = ThresholdWatch(self.correctness)
        self.reward_fn_names: list[str] = []  # the same on every rank: fixes the vector length
        self._phase: str | None = None
        self._lock = threading.RLock()
        self.reuse_warning: str | None = None  # set by an adapter when LLDS can never act
        self._notes_said: set[str] = set()  # llds checks and notes said once per run
        self.last_local_sums: torch.Tensor | None = None  # strict mode: see sum_layout()

    # -- setup --------------------------------------------------------------------------------

    def _make_detector(self, detector: Any) -> Any | None:
        if detector is None or detector is False:
            return None
        if detector is True:
            try:
                from lld_monitor.analysis import PhaseDetector
            except ImportError as err:
                logger.warning(
                    "lld_monitor: no online phase detector (%s); rows are still logged", err
                )
                return None
            return PhaseDetector()
        if not hasattr(detector, "update"):
            raise ValueError("detector must be True, None, or an object with update(row) -> alerts")
        return detector

    def attach(self, trainer: Any) -> LLDMonitor:
        """Hook into ``trainer`` (TRL GRPOTrainer: full; transformers Trainer: standard metrics)."""
        kind = type(trainer).__module__ + "." + type(trainer).__qualname__
        try:
            from trl import GRPOTrainer
        except ImportError:
            GRPOTrainer = None
        if GRPOTrainer is not None and isinstance(trainer, GRPOTrainer):
            from lld_monitor.integrations.trl import GRPOAdapter

            self.adapter = GRPOAdapter(self, trainer)
        else:
            from transformers import Trainer

            if not isinstance(trainer, Trainer):
                raise ValueError(
                    f"attach() needs a trl.GRPOTrainer or a transformers.Trainer, got {kind}; "
                    "for a hand-written loop call observe_rollout/observe_update/end_step instead"
                )
            from lld_monitor.integrations.transformers import TrainerAdapter

            self.adapter = TrainerAdapter(self, trainer)
        self.adapter.install()
        return self

    def start(self, *, trainer: str = "custom", lld_columns: bool = True, **meta: Any) -> None:
        """Open the run log (rank 0) with the run's meta; called by attach or the first end_step."""
        with self._lock:
            if self.writer is not None or self.closed:
                return
            self.rank = distributed.rank()
            if self.rank != 0:
                return
            from lld_monitor.runlog import RunWriter

            full_meta = {
                "trainer": trainer,
                "lld_columns": bool(lld_columns),
                "config": self._config_meta(),
                **meta,
                **self.meta,
            }
            if not lld_columns:
                full_meta["lld_columns_absent"] = list(C.LLD_COLUMNS)
            if self.resume:
                from lld_monitor.runlog import is_run_dir, load_run

                if is_run_dir(self.run_dir):
                    steps = load_run(self.run_dir).steps
                    if len(steps):
                        self.resumed_last_step = int(steps[C.STEP].max())
            self.writer = RunWriter(self.run_dir, meta=full_meta, resume=self.resume)
            self.dispatch.open(
                self.writer,
                make_event("lifecycle", self.step, "attach", f"monitor attached to {trainer}"),
            )

    def _config_meta(self) -> dict[str, Any]:
        cfg = self.llds.config
        return {
            "probe_fraction": self.probe_fraction,
            "correct_threshold": self.correct_threshold,
            "correct_fn": getattr(self.correct_fn, "__name__", None),
            "correctness": self.correctness.describe(),
            "auto_llds": self.auto_llds,
            "auto_llds_on": list(self.auto_llds_on),
            "stop_on_collapse": self.stop_on_collapse,
            "checkpoint_on_collapse": self.checkpoint_on_collapse,
            "token_samples_per_step": self.tokens.token_samples,
            "llds_with_dropout": self.llds_with_dropout,
            "response_samples_per_step": self.tokens.response_samples,
            "detector": type(self.detector).__name__ if self.detector is not None else None,
            "llds": {
                "enabled": cfg.enabled,
                "lam": cfg.lam,
                "gate": cfg.gate,
                "normalize": cfg.normalize,
                "answer_weighting": cfg.answer_weighting,
            },
        }

    # -- failure policy (lld_monitor/failure.py) -------------------------------------------------

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
        with self.guard("error event"):
            self._event(
                make_event(
                    "error",
                    self.step,
                    where,
                    f"{where} failed on rank(s) {failed}: {what} (that rank's log has the "
                    "traceback)",
                    "warning",
                    {"ranks": failed},
                )
            )

    def _on_error(self, where: str, err: BaseException) -> None:
        self._event(
            make_event(
                "error",
                self.step,
                where,
                f"{where} failed: {type(err).__name__}: {err}",
                "warning",
                {"exception": type(err).__name__},
            )
        )

    def _report_error(self, where: str, err: BaseException) -> None:
        self.failures.report(where, err)

    # -- events -------------------------------------------------------------------------------

    def _event(self, event: dict[str, Any]) -> None:
        """Write an event (rank 0) and pass it to the sinks; queued until the run log opens."""
        if self.rank != 0:
            return
        self.dispatch.event(event)

    @property
    def sinks(self) -> list[Any]:
        return self.dispatch.sinks

    def _on_llds_change(self, enabled: bool, lam: float, reason: str) -> None:
        state = f"on (lambda={lam:g})" if enabled else "off"
        msg = f"LLDS switched {state} by {reason}"
        if enabled and self.reuse_warning:
            warnings.warn(self.reuse_warning, UserWarning, stacklevel=4)
            msg += f"; {self.reuse_warning}"
        with self.guard("llds switch event"):
            self._event(
                make_event(
                    "intervention",
                    self.step,
                    "llds_enable" if enabled else "llds_disable",
                    msg,
                    "info",
                    {"enabled": int(enabled), "lam": lam, "reason": reason},
                )
            )

    # -- correctness --------------------------------------------------------------------------

    @property
    def correct_fn(self) -> Callable[..., Any] | None:
        return self.correctness.correct_fn

    @correct_fn.setter
    def correct_fn(self, fn: Callable[..., Any] | None) -> None:
        rule = self.correctness
        self.correctness = CorrectnessRule(fn, rule.threshold, rule.reward)
        self.threshold_watch.rule = self.correctness

    @property
    def correct_threshold(self) -> float:
        return self.correctness.threshold

    def correct_mask(
        self,
        rewards: torch.Tensor | None,
        advantages: torch.Tensor | None,
        batch: int,
        device: torch.device,
        rewards_per_func: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """[B] bool by the monitor's correctness rule (lld_monitor/correctness.py)."""
        return self.correctness(rewards, advantages, batch, device, rewards_per_func)

    # -- plain API: observe ---------------------------------------------------------------------

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
    ) -> None:
        """Record a batch under the sampling policy; ``logp_old``, ``mask``, ``entropy`` are [B, L].

        ``mask`` is 1 on generated tokens only (tool feedback and padding 0). Confidence, reward,
        entropy and length columns of the current step come from here; the batch is kept for
        :meth:`observe_post_update`. ``completion_mask`` [B, L] (1 on every completion position,
        tool feedback included; 0 on padding) lets the token samples show tool feedback.
        ``rewards`` [B] is the total reward (NaN = unscored); ``rewards_per_func`` maps each
        reward function's name to its raw rewards [B] (columns ``reward_fn/<name>``, and the
        correctness rule's ``correct_reward`` / ``correct_fn``).
        """
        with self.guard("observe_rollout"):
            self._observe_rollout(
                logp_old,
                mask,
                rewards,
                advantages,
                token_ids,
                entropy,
                num_searches,
                kl,
                completion_mask,
                rewards_per_func,
            )

    def _observe_rollout(
        self,
        logp_old: torch.Tensor,
        mask: torch.Tensor,
        rewards: torch.Tensor | None,
        advantages: torch.Tensor | None,
        token_ids: torch.Tensor | None,
        entropy: torch.Tensor | None,
        num_searches: torch.Tensor | None,
        kl: torch.Tensor | None = None,
        completion_mask: torch.Tensor | None = None,
        rewards_per_func: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        if logp_old.dim() != 2 or logp_old.shape != mask.shape:
            raise ValueError(
                f"logp_old and mask must both be [B, L], got {tuple(logp_old.shape)} and "
                f"{tuple(mask.shape)}"
            )
        _check_completion_mask(completion_mask, mask)
        logp_old = logp_old.detach()
        batch, device = logp_old.shape[0], logp_old.device
        if rewards is not None:
            rewards = torch.as_tensor(rewards, device=device).detach().float().reshape(-1)
        if advantages is not None:
            advantages = torch.as_tensor(advantages, device=device).detach().float()
        if rewards_per_func is not None:
            rewards_per_func = {
                name: torch.as_tensor(r, device=device).detach().float().reshape(-1)
                for name, r in rewards_per_func.items()
            }
            for name, r in rewards_per_func.items():
                self.observe_reward_fn(name, r)
        correct = self.correct_mask(rewards, advantages, batch, device, rewards_per_func)
        rule_r = self.correctness.rule_rewards(rewards, rewards_per_func)  # [B] or None
        self._acc.add_rollout(
            logp_old, mask, correct, rewards, entropy, kl, num_searches, rule_rewards=rule_r
        )
        self._last_rollout = {
            "logp_old": logp_old,
            "mask": mask.to(device),
            "rewards": rewards,
            "advantages": advantages,
            "token_ids": token_ids,
            "correct": correct,
            "completion_mask": None if completion_mask is None else completion_mask.to(device),
        }

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
            ro = self._last_rollout
            idx = rows
            pick = (lambda t: t) if idx is None else (lambda t: None if t is None else t[idx])
            self.measure_displacement(
                pick(ro["logp_old"]),
                logp_new,
                pick(ro["mask"]),
                pick(ro["correct"]),
                token_ids=pick(ro["token_ids"]),
                rewards=pick(ro["rewards"]),
                advantages=pick(ro["advantages"]),
                rows=rows,
                tokenizer=tokenizer,
                completion_mask=pick(ro["completion_mask"]),
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
            self._acc.add_in_batch(
                ro["logp_old"], logp_new, ro["mask"], ro["correct"], ro["rewards"]
            )

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

        ``mask`` marks generated tokens; ``completion_mask`` [B, L] every completion position
        (tool feedback included, padding 0; default ``mask``), for the whole-response samples.
        A probe in which the optimizer did not step (``stepped=False`` from the adapter: learning
        rate 0, skipped steps; or no generated token's log-prob changed at all) is no evidence of
        displacement: it is left out of the displacement columns (NaN when it is the step's only
        probe), and the run log says why once.
        """
        from lld_monitor.metrics import displacement_sums

        logp_new = logp_new.detach().to(logp_old.device)
        if logp_new.shape != logp_old.shape:
            raise ValueError(
                f"logp_new {tuple(logp_new.shape)} must match the rollout's logp_old "
                f"{tuple(logp_old.shape)} (same rows, same token positions)"
            )
        _check_completion_mask(completion_mask, logp_old)
        scored_mask = mask
        if rewards is not None:  # unscored responses are in neither likelihood group
            finite = torch.isfinite(rewards.reshape(-1).to(mask.device))  # [B]
            scored_mask = mask * finite[:, None].to(mask.dtype)
        sums = displacement_sums(
            logp_old=logp_old, logp_new=logp_new, mask=scored_mask, correct=correct
        )
        gen = mask.to(logp_old.device) != 0  # [B, L]
        moved = ((logp_new != logp_old) & gen).any()  # device bool: did any log-prob change?
        if stepped is False:
            moved = torch.zeros_like(moved)
        self._acc.add_probe(sums, moved)
        maskf = mask.to(logp_old.dtype)
        delta = ((logp_new - logp_old) * maskf).sum(-1)  # [B]
        record = ProbeRecord(
            self.step,
            token_ids,
            mask,
            logp_old,
            logp_new,
            correct,
            delta,
            rows,
            None if completion_mask is None else completion_mask.to(logp_old.device),
        )
        self.last_probe = record
        self.tokens.add(record, rewards, advantages, tokenizer, keep=self.rank == 0)
        return record

    def token_sample_rows(self, sources: Sequence[TokenSource] | None = None) -> list[dict]:
        """The step's token samples (lld_monitor/token_sampling.py, ``sample_rows``)."""
        return self.tokens.rows(sources)

    # -- plain API: LLDS ------------------------------------------------------------------------

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
        yourself). The output's statistics are recorded into the current step's llds_* columns.
        With ``answer_mask`` [B, L] and the config's ``answer_weighting``, the answer span is
        weighted by beta (adaptive schedules need ``mean_valid_searches``); other keywords
        (``action_ids``) go to ``llds_loss``.
        """
        zero = logp_new.new_zeros(())
        if not self.llds.enabled:
            return zero, None
        try:
            from lld_monitor.llds import llds_loss

            cfg = self.llds.config
            searches = kw.pop("mean_valid_searches", None)
            if kw.get("answer_mask") is not None and "answer_weight" not in kw:
                kw["answer_weight"] = cfg.answer_weight(searches)
            out = llds_loss(
                logp_new=logp_new,
                logp_old=logp_old.detach(),
                advantages=advantages,
                mask=mask,
                gate=cfg.gate,
                normalize=cfg.normalize,
                **kw,
            )
            self._acc.add_llds(out)
            return cfg.lam * out.loss, out
        except Exception as err:
            if self.strict:
                raise
            self._report_error("llds_term", err)
            return zero, None

    @staticmethod
    def sum_layout() -> tuple[tuple[str, ...], int]:
        """Layout of the reduced vector: standard fields, K confidence sums, K probe sums."""
        from lld_monitor.metrics import SUM_FIELDS

        return FIELD_NAMES, len(SUM_FIELDS)

    # -- plain API: the row -------------------------------------------------------------------

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
        acc = self._acc
        names = self.reward_fn_names
        for name in sorted(set(acc.reward_fn) - set(names)):  # first seen this step
            names.append(name)
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
            vec[FIELD_NAMES.index("llds_on")] = float(self.llds.enabled)
            vec[FIELD_NAMES.index("llds_lam")] = self.llds.lam
        with self.collective("end_step reduction"):
            rows = distributed.gather_rows(vec)  # [world, n]
            host = StepMetrics.reduce(rows).tolist()  # the one host transfer of the step
        i_failed = FIELD_NAMES.index("n_failed")
        if distributed.world_size() == 1:
            return None if host[i_failed] > 0 else host  # the failure is reported already
        s = dict(zip(FIELD_NAMES, host[: len(FIELD_NAMES)], strict=True))
        if s["n_failed"] > 0:
            failed = [r for r, f in enumerate(rows[:, i_failed].tolist()) if f > 0.5]
            self._record_rank_failure(
                "end_step", failed, "those ranks sent zeros; the row holds the other ranks' sums"
            )
        on, lam = s["llds_on"], s["llds_lam"]
        if not math.isnan(on) and self.llds._sync(bool(on > 0.5), lam):
            logger.info("lld_monitor: LLDS state adopted from rank 0")
        return host

    def _write_row(self, step: int, host: list[float], extra: Mapping[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {C.STEP: step, C.TIME: time.time()}
        row.update(row_from_sums(host, self.reward_fn_names))
        i_probe, i_still = FIELD_NAMES.index("n_probe"), FIELD_NAMES.index("n_probe_still")
        if host[i_probe] == 0 and host[i_still] > 0:
            self._note_once(
                "no_step_probe",
                step,
                "displacement columns left out: the post-update probe found no generated token "
                "whose log-prob changed (the optimizer did not step: learning rate 0 during "
                "warm-up, or skipped steps; or the policy puts probability 1 on every sampled "
                "token), so such rows are no evidence of displacement; said once, it applies to "
                "every such row",
                "info",
                {"probes": host[i_still]},
            )
        row.update(extra)
        self._check_threshold_reached(row, host[FIELD_NAMES.index("rule_reward_max")])

        self.last_row = row
        if self.rank == 0 and self.writer is not None and not self._replaying(step):
            self.dispatch.row(row)
            self.rows_written += 1
            self.tokens.write(self.writer, step)
        self._check_zero_std(row, step)
        self._detect(row, step)
        return row

    def _check_threshold_reached(self, row: Mapping[str, Any], rule_max: float) -> None:
        """Warn once when rewards vary but no response has reached the threshold for a while."""
        msg = self.threshold_watch.update(row, rule_max)
        if msg is None:
            return
        logger.warning("lld_monitor: %s", msg)
        if self.rank == 0:
            warnings.warn(msg, UserWarning, stacklevel=2)
        self._event(
            make_event(
                "lifecycle",
                int(row.get(C.STEP, self.step)),
                "no_correct_responses",
                msg,
                "warning",
                {"rule_reward_max": self.threshold_watch.rule_max},
            )
        )

    # -- LLDS checks ----------------------------------------------------------------------------

    def _note_once(
        self, key: str, step: int, message: str, severity: str, evidence: Mapping[str, Any]
    ) -> bool:
        """Record ``message`` as a lifecycle event ``key`` (rank 0), once per run; warn too if
        ``severity`` is "warning". False when it was said before."""
        if key in self._notes_said:
            return False
        self._notes_said.add(key)
        if severity == "warning":
            logger.warning("lld_monitor: %s", message)
            warnings.warn(message, UserWarning, stacklevel=3)
        else:
            logger.info("lld_monitor: %s", message)
        with self.guard("llds check event"):
            self._event(make_event("lifecycle", step, key, message, severity, dict(evidence)))
        return True

    def check_llds_can_act(
        self, *, reuse_problem: str | None = None, num_generations: int | None = None
    ) -> list[str]:
        """Warn (once each) when LLDS is on or may be switched on but cannot act or rarely does.

        Adapters call this at attach with what they know of the trainer's settings:
        ``reuse_problem`` (why each batch gets a single update, naming the settings; see
        ``integrations.trl.llds_reuse_problem``) and ``num_generations`` (responses per prompt).
        Returns the messages said now. Nothing is said while LLDS is off and ``auto_llds`` is off.
        """
        said: list[str] = []
        if not (self.llds.enabled or self.auto_llds):
            return said
        who = (
            "LLDS is on"
            if self.llds.enabled
            else f"auto_llds may switch LLDS on ({', '.join(self.auto_llds_on)} alerts)"
        )
        if reuse_problem:
            msg = f"{who}, but it cannot act: {reuse_problem}"
            if self._note_once("llds_check_reuse", self.step, msg, "warning", {}):
                said.append(msg)
        if num_generations is not None and int(num_generations) <= 2:
            msg = (
                f"{who}, but its gate rarely fires with num_generations={int(num_generations)}: "
                "with two responses per prompt most groups have equal rewards (advantage 0, no "
                "gradient, nothing displaced) and a mixed group has one preserving response. "
                "Set num_generations >= 4 (the paper uses 5)."
            )
            if self._note_once(
                "llds_check_generations",
                self.step,
                msg,
                "warning",
                {"num_generations": num_generations},
            ):
                said.append(msg)
        return said

    def _check_zero_std(self, row: Mapping[str, Any], step: int) -> None:
        """Warn once when most prompt groups of a rollout batch have zero reward variance while
        LLDS is on or may be switched on: few responses get a gradient, the gate rarely fires."""
        frac = row.get(C.FRAC_ZERO_STD_GROUPS)
        if frac is None or not (self.llds.enabled or self.auto_llds):
            return
        if not (isinstance(frac, int | float) and frac >= ZERO_STD_WARN):
            return
        who = "LLDS is on" if self.llds.enabled else "auto_llds may switch LLDS on"
        self._note_once(
            "llds_check_zero_std",
            step,
            f"{who}, but {frac:.0%} of the prompt groups of the rollout batch at step {step} have "
            f"zero reward variance ({C.FRAC_ZERO_STD_GROUPS} >= {ZERO_STD_WARN}): their responses "
            "get advantage 0 and no gradient, so LLDS's gate rarely fires. Use more generations "
            "per prompt, a higher temperature, or prompts the policy solves sometimes (not "
            "always or never); said once",
            "warning",
            {C.FRAC_ZERO_STD_GROUPS: float(frac)},
        )

    # -- detector and actions -------------------------------------------------------------------

    def _detect(self, row: Mapping[str, Any], step: int) -> None:
        """Feed the detector (every rank, same rows -> same alerts) and act on its alerts."""
        if self.detector is None:
            self.last_alerts = []
            return
        alerts: list[Alert] = []
        with self.guard("detector"):
            alerts = list(self.detector.update(row) or [])
        self.last_alerts = alerts
        phase = getattr(self.detector, "phase", None)
        if phase is not None and phase != self._phase:
            if self._phase is not None or phase != "healthy":
                self._event(
                    make_event(
                        "phase",
                        step,
                        str(phase),
                        f"phase {self._phase} -> {phase}"
                        if self._phase is not None
                        else f"phase {phase} at the first analysed step",
                        "info",
                        {"previous": self._phase},
                    )
                )
            self._phase = phase
        for alert in alerts:
            self._event(alert.to_event())
            self.dispatch.alert(alert)
            self._act(alert, step)

    def decide(self, alert: Alert) -> list[tuple[str, str]]:
        """The actions this monitor's settings take on ``alert``: ``[(action, reason), ...]``."""
        return self.actions.decide(alert, self.llds.enabled)

    @property
    def auto_llds(self) -> bool:
        return self.actions.auto_llds

    @property
    def auto_llds_on(self) -> tuple[str, ...]:
        return self.actions.auto_llds_on

    @property
    def stop_on_collapse(self) -> bool:
        return self.actions.stop_on_collapse

    @property
    def checkpoint_on_collapse(self) -> bool:
        return self.actions.checkpoint_on_collapse

    @property
    def token_samples_per_step(self) -> int:
        return self.tokens.token_samples

    @property
    def response_samples_per_step(self) -> int:
        return self.tokens.response_samples

    def _act(self, alert: Alert, step: int) -> None:
        for action, reason in self.decide(alert):
            if action == "llds_enable":
                if self.llds.blocked is not None:
                    self._event(
                        make_event(
                            "intervention",
                            step,
                            "llds_enable_refused",
                            f"{reason}: refused, {self.llds.blocked}",
                            "warning",
                            {"alert": alert.kind},
                        )
                    )
                    continue
                lam = self.llds.lam if self._llds_given else AUTO_LLDS_LAMBDA
                self.llds.enable(lam, reason=reason)
                continue
            if action == "stop":
                self.should_stop = True
            elif action == "checkpoint":
                self.should_save = True
            self._event(
                make_event("intervention", step, action, reason, "warning", {"alert": alert.kind})
            )

    # -- resume -------------------------------------------------------------------------------

    def _replayed_event(self, event: Mapping[str, Any]) -> bool:
        """An alert/phase/intervention event of a step the resumed folder already holds."""
        kind = event.get(C.EVENT_TYPE)
        return kind in ("alert", "phase", "intervention") and self._replaying(
            event.get(C.EVENT_STEP)
        )

    def _replaying(self, step: Any) -> bool:
        """True for a step a resumed folder already holds (replayed after an earlier checkpoint)."""
        last = self.resumed_last_step
        return last is not None and isinstance(step, int | float) and step <= last

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs (plain JSON): step, LLDS switch, detector, phase, warnings.

        The adapters save it with every Trainer checkpoint (``trainer_state.json``).
        """
        det = self.detector
        return {
            "version": 1,
            "step": self.step,
            "llds": {"enabled": self.llds.enabled, "lam": self.llds.lam},
            "phase": self._phase,
            "detector": det.state_dict() if hasattr(det, "state_dict") else None,
            "reward_fn_names": list(self.reward_fn_names),
            "correctness": self.threshold_watch.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` (the LLDS switch state is an ``intervention`` event)."""
        if state.get("version") != 1:
            raise ValueError(f"unsupported LLDMonitor state version {state.get('version')!r}")
        self.step = int(state["step"])
        det_state = state.get("detector")
        if det_state is not None and hasattr(self.detector, "load_state_dict"):
            self.detector.load_state_dict(det_state)
        self._phase = state.get("phase")
        for name in state.get("reward_fn_names", []):
            if name not in self.reward_fn_names:
                self.reward_fn_names.append(name)
        self.threshold_watch.load_state_dict(state.get("correctness") or {})
        llds = state["llds"]
        enabled, lam = bool(llds["enabled"]), float(llds["lam"])
        self.llds._sync(enabled, lam)
        with self.guard("resume event"):
            self._event(
                make_event(
                    "lifecycle",
                    self.step,
                    "restore",
                    f"monitor state restored from the checkpoint before step {self.step}: LLDS "
                    + (f"on (lambda={lam:g})" if enabled else "off")
                    + f", phase {self._phase}",
                    "info",
                    {"llds_enabled": int(enabled), "llds_lam": lam},
                )
            )

    # -- end ----------------------------------------------------------------------------------

    def close(self, error: BaseException | None = None) -> None:
        """Flush and close the run log and the sinks; idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.adapter is not None:
            with self.guard("adapter.uninstall"):
                self.adapter.uninstall()
        self.dispatch.close()
        if self.writer is not None:
            self.tokens.close()  # pending token files first
            with self.guard("run log close"):
                self.writer.close(error=error)

    def __enter__(self) -> LLDMonitor:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(error=exc)
