"""LLDMonitor: the trainer-agnostic core that turns observed tensors into one run-log row per step.

Adapters (integrations/trl.py, integrations/transformers.py) and hand-written loops call the same
plain methods: ``observe_rollout``, ``observe_update``, ``observe_post_update``, ``llds_term``,
``end_step``, ``close``. Sums stay on the trainer's device until ``end_step``, which reduces them
across ranks (``all_reduce(SUM)``, exact), moves one small vector to the host, writes the row on
rank 0 and runs the detector, the sinks and the actions.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from lld_monitor import columns as C
from lld_monitor.events import Alert, make_event

logger = logging.getLogger("lld_monitor")

#: Alert kinds on which ``auto_llds=True`` switches LLDS on by default: the earliest credible
#: signals (the paper's phases I and II, and its >50%-displaced indicator), collapse as the last
#: resort.
AUTO_LLDS_KINDS: tuple[str, ...] = ("stagnation", "decay", "displacement", "collapse")
#: Alert kinds ``auto_llds_on`` accepts.
AUTO_LLDS_ACCEPTED: tuple[str, ...] = ("stagnation", "decay", "displacement", "collapse")
#: ``frac_zero_std_groups`` of a rollout batch at or above which the monitor warns (once) that
#: LLDS's gate rarely fires (most groups give every response advantage 0).
ZERO_STD_WARN = 0.75
#: Alert kinds on which ``stop_on_collapse`` / ``checkpoint_on_collapse`` act.
COLLAPSE_KINDS: tuple[str, ...] = ("collapse",)
#: Lambda used by ``auto_llds`` when no ``LLDSConfig`` was given (the paper's value).
AUTO_LLDS_LAMBDA = 0.2

# Fixed layout of the per-step sum vector reduced across ranks (indices into _Acc.vector()).
_STD_FIELDS: tuple[str, ...] = (
    "n_resp",  # responses observed (rollout rows)
    "n_rewarded",  # responses with a known reward
    "reward_sum",
    "reward_sq_sum",
    "n_correct_resp",
    "entropy_sum",
    "entropy_count",
    "length_sum",  # generated (non-tool) tokens
    "searches_sum",
    "searches_count",
    "grad_sum",
    "grad_count",
    "loss_sum",
    "loss_count",
    "llds_loss_sum",
    "llds_frac_sum",
    "llds_count",
    "kl_sum",
    "kl_count",
    "zero_std_groups",  # prompt groups whose rewards are all equal
    "n_groups",
    "n_probe",  # probe measurements (post-update forwards) folded in
    "n_probe_still",  # probes left out: no log-prob moved (the optimizer did not step)
    "llds_on",  # rank 0's switch state (others contribute 0): keeps ranks in agreement
    "llds_lam",
    "grad_max",  # rank 0's max pre-clip grad norm over the step's updates
)
_STD_INDEX = {name: i for i, name in enumerate(_STD_FIELDS)}


def _torch_dist() -> Any | None:
    """torch.distributed when initialised with more than one rank, else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def _check_completion_mask(completion_mask: torch.Tensor | None, ref: torch.Tensor) -> None:
    """ValueError unless ``completion_mask`` is None or [B, L] like ``ref``."""
    if completion_mask is not None and completion_mask.shape != ref.shape:
        raise ValueError(
            f"completion_mask must be [B, L] = {list(ref.shape)} like the log-probs and mask, got "
            f"{tuple(completion_mask.shape)} (1 on every completion position, 0 on padding)"
        )


def _rank() -> int:
    dist = _torch_dist()
    return dist.get_rank() if dist is not None else 0


class LLDSSwitch:
    """Thread-safe LLDS on/off switch with its lambda; every change is an intervention event."""

    def __init__(self, config: Any, on_change: Callable[[bool, float, str], None]) -> None:
        self._lock = threading.Lock()
        self._config = config
        self._enabled = bool(config.enabled)
        self._lam = float(config.lam)
        self._on_change = on_change

    @property
    def config(self) -> Any:
        """The ``LLDSConfig`` (gate, normalisation, answer weighting) with the lambda in force."""
        with self._lock:
            return replace(self._config, lam=self._lam, enabled=self._enabled)

    @property
    def enabled(self) -> bool:
        with self._lock:
            return self._enabled

    @property
    def lam(self) -> float:
        """Lambda that applies while enabled (kept when disabled)."""
        with self._lock:
            return self._lam

    def enable(self, lam: float | None = None, *, reason: str = "user") -> None:
        """Switch LLDS on from the next loss computation; optionally set lambda."""
        if lam is not None and (not math.isfinite(float(lam)) or float(lam) < 0):
            raise ValueError(f"LLDS lambda must be a finite number >= 0, got {lam!r}")
        with self._lock:
            self._enabled = True
            if lam is not None:
                self._lam = float(lam)
            enabled, lam_now = self._enabled, self._lam
        self._on_change(enabled, lam_now, reason)

    def disable(self, *, reason: str = "user") -> None:
        """Switch LLDS off from the next loss computation."""
        with self._lock:
            self._enabled = False
            lam_now = self._lam
        self._on_change(False, lam_now, reason)

    def _sync(self, enabled: bool, lam: float) -> bool:
        """Adopt rank 0's state without an event; True when it changed."""
        with self._lock:
            changed = enabled != self._enabled or (enabled and abs(lam - self._lam) > 1e-12)
            self._enabled, self._lam = enabled, lam if enabled else self._lam
        return changed


class _Acc:
    """Per-step sums on the trainer's device; ``vector()`` packs them for one all_reduce."""

    def __init__(self) -> None:
        self.device: torch.device | None = None
        self.std: dict[str, torch.Tensor | float] = {}
        self.conf: torch.Tensor | None = None  # [K] displacement_sums of observed rollouts
        self.disp: torch.Tensor | None = None  # [K] displacement_sums of probed responses
        self.grad_max: float | torch.Tensor = float("nan")
        self.reward_fn: dict[str, torch.Tensor] = {}  # name -> [2] (sum, count)
        self.groups: dict[tuple[str, ...], torch.Tensor] = {}  # field names -> [n] device sums

    def add(self, name: str, value: torch.Tensor | float) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().float()
            if self.device is None:
                self.device = value.device
        self.std[name] = self.std.get(name, 0.0) + value

    def add_group(self, names: tuple[str, ...], values: list[torch.Tensor]) -> None:
        """Add device scalars to fields ``names`` with one stack and one add (per micro-batch)."""
        v = torch.stack(values).detach().float()  # [n]
        if self.device is None:
            self.device = v.device
        prev = self.groups.get(names)
        self.groups[names] = v if prev is None else prev + v

    def vector(self, n_sum: int, device: torch.device) -> torch.Tensor:
        """[len(_STD_FIELDS) + 2K] float64 vector of every sum (zeros where absent).

        Packed with a handful of ops (one host-built vector for the plain floats, one stack for
        the device scalars), not one small tensor per field: this runs every step.
        """
        n_std = len(_STD_FIELDS)
        floats = [0.0] * n_std
        t_idx: list[int] = []
        t_val: list[torch.Tensor] = []
        for i, name in enumerate(_STD_FIELDS):
            v = self.std.get(name, 0.0) if name != "grad_max" else self.grad_max
            if isinstance(v, torch.Tensor):
                t_idx.append(i)
                t_val.append(v.reshape(()).float())  # add() made them float32 already: no op
            elif not math.isnan(v):
                floats[i] = v
        std = torch.tensor(floats, dtype=torch.float64, device=device)  # [n_std]
        if t_val:
            idx = torch.tensor(t_idx, device=device)
            std.index_copy_(0, idx, torch.stack(t_val).to(device, torch.float64))
        for names, v in self.groups.items():
            idx = torch.tensor([_STD_INDEX[n] for n in names], device=device)
            std.index_add_(0, idx, v.to(device, torch.float64))
        parts = [std]
        for sums in (self.conf, self.disp):
            if sums is None:
                parts.append(torch.zeros(n_sum, dtype=torch.float64, device=device))
            else:
                parts.append(sums.detach().to(device, torch.float64).reshape(-1))
        return torch.cat(parts)


@dataclass(frozen=True)
class ProbeRecord:
    """The last post-update measurement (device tensors, for drill-down and tests)."""

    step: int
    token_ids: torch.Tensor | None  # [B, L] completion ids of the probed responses
    mask: torch.Tensor  # [B, L] generated-token mask (tool feedback 0)
    logp_old: torch.Tensor  # [B, L]
    logp_new: torch.Tensor  # [B, L]
    correct: torch.Tensor  # [B] bool
    delta: torch.Tensor  # [B] summed logp_new - logp_old over generated tokens
    rows: torch.Tensor | None = None  # [B] indices of the probed rows in the adapter's batch
    completion_mask: torch.Tensor | None = None  # [B, L] every completion position (0 = padding)


#: Values of the token-sample column ``C.TOK_SAMPLE``.
SAMPLE_RESPONSE = "response"  # a position of a whole sampled response (every completion position)
SAMPLE_TOP_TOKEN = "top_token"  # one of the step's most displaced tokens, outside those responses


@dataclass(frozen=True)
class _TokenSource:
    """One post-update measurement kept (rank 0) until ``end_step`` builds the step's samples."""

    record: ProbeRecord
    rewards: torch.Tensor | None  # [B]
    advantages: torch.Tensor | None  # [B]
    tokenizer: Any | None
    offset: int  # response index of the record's row 0 among the step's probed responses


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
    ) -> None:
        if not 0.0 <= float(probe_fraction) <= 1.0:
            raise ValueError(
                f"probe_fraction must be in [0, 1] (0 turns the post-update probe off), "
                f"got {probe_fraction!r}"
            )
        if token_samples_per_step < 0:
            raise ValueError(f"token_samples_per_step must be >= 0, got {token_samples_per_step}")
        if response_samples_per_step < 0:
            raise ValueError(
                f"response_samples_per_step must be >= 0 (0 = no whole responses), "
                f"got {response_samples_per_step}"
            )
        from lld_monitor.llds import LLDSConfig

        if llds is not None and not isinstance(llds, LLDSConfig):
            raise ValueError("llds must be an lld_monitor.LLDSConfig or None")
        self.run_dir = Path(run_dir)
        launched_rank = os.environ.get("RANK", "0")  # set by torchrun/accelerate before init
        if (
            _rank() == 0
            and launched_rank == "0"
            and ((self.run_dir / "steps.jsonl").exists() or (self.run_dir / "meta.json").exists())
        ):
            # fail here, not at the first step (where the error would be reported and swallowed)
            raise FileExistsError(
                f"{self.run_dir} already holds a run; give the monitor a new folder (or delete "
                "that one): a run folder is written once"
            )
        self.probe_fraction = float(probe_fraction)
        self.correct_fn = correct_fn
        self.correct_threshold = float(correct_threshold)
        self.sinks = list(sinks)
        self.auto_llds = bool(auto_llds)
        known = AUTO_LLDS_ACCEPTED
        if isinstance(auto_llds_on, str) or not set(auto_llds_on) <= set(known):
            raise ValueError(
                f"auto_llds_on must be a sequence of alert kinds from {known} (default "
                f"{AUTO_LLDS_KINDS}), got {auto_llds_on!r}"
            )
        self.auto_llds_on = tuple(auto_llds_on)
        self.stop_on_collapse = bool(stop_on_collapse)
        self.checkpoint_on_collapse = bool(checkpoint_on_collapse)
        self.token_samples_per_step = int(token_samples_per_step)
        self.response_samples_per_step = int(response_samples_per_step)
        self.strict = bool(strict)
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
        self._acc = _Acc()
        self._token_sources: list[_TokenSource] = []  # this step's probes (rank 0, sampling on)
        self._probed_in_step = 0  # responses probed so far this step (offset of the next probe)
        self._last_rollout: dict[str, Any] | None = None
        self._errors_seen: set[str] = set()
        self._phase: str | None = None
        self._lock = threading.RLock()
        self._pending_events: list[dict[str, Any]] = []
        self._token_pool: Any | None = None  # one background thread writes token samples
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
            self.rank = _rank()
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
            self.writer = RunWriter(self.run_dir, meta=full_meta)
            self._event(
                make_event("lifecycle", self.step, "attach", f"monitor attached to {trainer}")
            )
            for event in self._pending_events:
                self._event(event)
            self._pending_events.clear()

    def _config_meta(self) -> dict[str, Any]:
        cfg = self.llds.config
        return {
            "probe_fraction": self.probe_fraction,
            "correct_threshold": self.correct_threshold,
            "correct_fn": getattr(self.correct_fn, "__name__", None),
            "auto_llds": self.auto_llds,
            "auto_llds_on": list(self.auto_llds_on),
            "stop_on_collapse": self.stop_on_collapse,
            "checkpoint_on_collapse": self.checkpoint_on_collapse,
            "token_samples_per_step": self.token_samples_per_step,
            "response_samples_per_step": self.response_samples_per_step,
            "detector": type(self.detector).__name__ if self.detector is not None else None,
            "llds": {
                "enabled": cfg.enabled,
                "lam": cfg.lam,
                "gate": cfg.gate,
                "normalize": cfg.normalize,
                "answer_weighting": cfg.answer_weighting,
            },
        }

    # -- failure policy -----------------------------------------------------------------------

    @contextmanager
    def guard(self, where: str) -> Iterator[None]:
        """Run a hook: in strict mode re-raise, else report once, record an event, carry on."""
        try:
            yield
        except Exception as err:
            if self.strict:
                raise
            self._report_error(where, err)

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

    def _report_error(self, where: str, err: BaseException) -> None:
        key = f"{where}:{type(err).__name__}"
        first = key not in self._errors_seen
        self._errors_seen.add(key)
        if first:
            logger.error(
                "lld_monitor: %s failed (%s: %s); training continues, the monitor skips this "
                "hook when it fails (pass strict=True to raise)\n%s",
                where,
                type(err).__name__,
                err,
                "".join(traceback.format_exception(err)),
            )
            try:
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
            except Exception as log_err:
                logger.error("lld_monitor: could not record the error event either: %s", log_err)

    # -- events -------------------------------------------------------------------------------

    def _event(self, event: dict[str, Any]) -> None:
        """Write an event (rank 0) and pass it to the sinks; queued until the run log opens."""
        if self.rank != 0:
            return
        if self.writer is None:
            self._pending_events.append(event)
            return
        self.writer.log_event(event)
        for sink in self.sinks:
            fn = getattr(sink, "log_event", None)
            if fn is not None:
                with self.guard(f"sink {type(sink).__name__}.log_event"):
                    fn(event)

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

    def correct_mask(
        self,
        rewards: torch.Tensor | None,
        advantages: torch.Tensor | None,
        batch: int,
        device: torch.device,
    ) -> torch.Tensor:
        """[B] bool: correct_fn, else reward >= correct_threshold, else advantage > 0."""
        if advantages is not None and advantages.dim() == 2:
            advantages = advantages[:, 0]
        if self.correct_fn is not None:
            out = torch.as_tensor(self.correct_fn(rewards, advantages), device=device)
            if out.shape != (batch,):
                raise ValueError(
                    f"correct_fn must return a [B]={batch} tensor, got {tuple(out.shape)}"
                )
            return out.bool()
        if rewards is not None:
            return rewards.to(device) >= self.correct_threshold
        if advantages is not None:
            return advantages.to(device) > 0
        return torch.zeros(batch, dtype=torch.bool, device=device)

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
    ) -> None:
        """Record a batch under the sampling policy; ``logp_old``, ``mask``, ``entropy`` are [B, L].

        ``mask`` is 1 on generated tokens only (tool feedback and padding 0). Confidence, reward,
        entropy and length columns of the current step come from here; the batch is kept for
        :meth:`observe_post_update`. ``completion_mask`` [B, L] (1 on every completion position,
        tool feedback included; 0 on padding) lets the token samples show tool feedback.
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
    ) -> None:
        from lld_monitor.metrics import displacement_sums

        if logp_old.dim() != 2 or logp_old.shape != mask.shape:
            raise ValueError(
                f"logp_old and mask must both be [B, L], got {tuple(logp_old.shape)} and "
                f"{tuple(mask.shape)}"
            )
        _check_completion_mask(completion_mask, mask)
        logp_old = logp_old.detach()
        batch, device = logp_old.shape[0], logp_old.device
        maskf = mask.to(device=device, dtype=torch.float32)  # [B, L]; exact counts under bf16
        if rewards is not None:
            rewards = torch.as_tensor(rewards, device=device).detach().float().reshape(-1)
        if advantages is not None:
            advantages = torch.as_tensor(advantages, device=device).detach().float()
        correct = self.correct_mask(rewards, advantages, batch, device)
        acc = self._acc
        acc.add("n_resp", float(batch))
        n_tok = maskf.sum()
        names, vals = ["n_correct_resp", "length_sum"], [correct.sum(), n_tok]
        if rewards is not None:
            finite = torch.isfinite(rewards)
            r = torch.where(finite, rewards, 0.0)  # [B]
            names += ["n_rewarded", "reward_sum", "reward_sq_sum"]
            vals += [finite.sum(), r.sum(), r.dot(r)]
        if entropy is not None:
            ent = entropy.detach().float()
            if ent.dim() == 2:
                names += ["entropy_sum", "entropy_count"]
                vals += [(ent * maskf).sum(), n_tok]
            else:
                names.append("entropy_sum")
                vals.append(ent.sum())
                acc.add("entropy_count", float(ent.numel()))
        if kl is not None:
            names += ["kl_sum", "kl_count"]
            vals += [(kl.detach().float() * maskf).sum(), n_tok]
        if num_searches is not None:
            ns = torch.as_tensor(num_searches, device=device).float().reshape(-1)
            names.append("searches_sum")
            vals.append(ns.sum())
            acc.add("searches_count", float(ns.numel()))
        acc.add_group(tuple(names), [v.float() for v in vals])
        sums = displacement_sums(logp_old, None, mask.to(device), correct)
        acc.conf = sums if acc.conf is None else acc.conf + sums
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
            r = rewards.detach().float().reshape(-1)
            finite = torch.isfinite(r)
            part = torch.stack(
                [torch.where(finite, r, torch.zeros_like(r)).sum(), finite.sum().float()]
            )
            prev = self._acc.reward_fn.get(name)
            self._acc.reward_fn[name] = part if prev is None else prev + part

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
            acc = self._acc
            if grad_norm is not None:
                g = (
                    grad_norm.detach().float()
                    if isinstance(grad_norm, torch.Tensor)
                    else float(grad_norm)
                )
                acc.add("grad_sum", g)
                acc.add("grad_count", 1.0)
                m = acc.grad_max
                if isinstance(m, float) and math.isnan(m):
                    acc.grad_max = g
                else:
                    acc.grad_max = (
                        torch.maximum(torch.as_tensor(m), torch.as_tensor(g))
                        if (isinstance(m, torch.Tensor) or isinstance(g, torch.Tensor))
                        else max(m, g)
                    )
            if loss is not None:
                acc.add(
                    "loss_sum",
                    loss.detach().float() if isinstance(loss, torch.Tensor) else float(loss),
                )
                acc.add("loss_count", 1.0)
            if llds_out is not None:
                self._record_llds(llds_out)

    def _record_llds(self, out: Any) -> None:
        acc = self._acc
        acc.add("llds_loss_sum", out.loss.detach().float())
        frac = out.frac_gated
        acc.add(
            "llds_frac_sum",
            frac.detach().float() if isinstance(frac, torch.Tensor) else float(frac),
        )
        acc.add("llds_count", 1.0)

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
        sums = displacement_sums(logp_old, logp_new, mask, correct)
        gen = mask.to(logp_old.device) != 0  # [B, L]
        moved = ((logp_new != logp_old) & gen).any()  # device bool: did any log-prob change?
        if stepped is False:
            moved = torch.zeros_like(moved)
        keep = moved.to(sums.dtype)
        acc = self._acc
        acc.disp = sums * keep if acc.disp is None else acc.disp + sums * keep
        acc.add_group(("n_probe", "n_probe_still"), [keep, 1 - keep])
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
        sampling = self.token_samples_per_step > 0 or self.response_samples_per_step > 0
        if sampling and self.rank == 0:
            adv = advantages
            if adv is not None and adv.dim() == 2:
                adv = adv[:, 0]
            self._token_sources.append(
                _TokenSource(record, rewards, adv, tokenizer, self._probed_in_step)
            )
        self._probed_in_step += int(logp_old.shape[0])
        return record

    def token_sample_rows(self, sources: Sequence[_TokenSource] | None = None) -> list[dict]:
        """The step's token samples: whole responses, then the most displaced other tokens.

        Picks ``response_samples_per_step`` responses (correct ones first, each group by summed
        change ascending, ties by index) and logs every completion position of each; adds the
        ``token_samples_per_step`` most displaced generated tokens of the step that are not in
        those responses. One row per (response, position); text decoded in one tokenizer call.
        """
        from lld_monitor.metrics import action_ids, top_displaced_tokens

        sources = list(self._token_sources if sources is None else sources)
        if not sources:
            return []
        # Host copies of the per-response keys: [B] summed change, correct, has positions.
        keys = []
        for s in sources:
            rec = s.record
            pos = rec.mask != 0 if rec.completion_mask is None else rec.completion_mask != 0
            pos = pos | (rec.mask != 0)  # [B, L] positions to log
            keys.append(
                torch.stack([rec.delta.double(), rec.correct.double(), pos.any(1).double()], 1)
                .cpu()
                .tolist()
            )  # [B, 3]
        any_correct = any(c > 0.5 for k in keys for _, c, _ in k)
        cands = []
        for i, (s, k) in enumerate(zip(sources, keys, strict=True)):
            for b, (d, c, has) in enumerate(k):
                if has > 0.5:
                    d = d if math.isfinite(d) else math.inf
                    cands.append((0 if c > 0.5 else 1, d, s.offset + b, i, b))
        cands.sort()
        picked = cands[: self.response_samples_per_step]

        rows: list[dict] = []
        for i, s in enumerate(sources):
            sel = [b for (_, _, _, j, b) in picked if j == i]
            if sel:
                rows.extend(self._response_rows(s, sel, action_ids))
        order = {resp: n for n, (_, _, resp, _, _) in enumerate(picked)}
        rows.sort(key=lambda r: (order[r[C.TOK_RESPONSE]], r[C.TOK_POSITION]))
        taken = {(r[C.TOK_RESPONSE], r[C.TOK_POSITION]) for r in rows}

        top: list[dict] = []
        k = self.token_samples_per_step
        if k > 0:
            for s in sources:
                rec = s.record
                found = top_displaced_tokens(
                    rec.logp_old,
                    rec.logp_new,
                    rec.mask,
                    k,
                    correct=rec.correct,
                    token_ids=rec.token_ids,
                    rewards=s.rewards,
                    advantages=s.advantages,
                    only_correct=any_correct,  # no correct response: the most displaced overall
                )
                for row in found:
                    row[C.TOK_RESPONSE] += s.offset
                top.extend(found)
            top.sort(key=lambda r: (r[C.TOK_DELTA], r[C.TOK_RESPONSE], r[C.TOK_POSITION]))
            top = top[:k]  # the step's k most displaced tokens, some of them in picked responses
            for row in top:
                row[C.TOK_CORRECT] = int(row.get(C.TOK_CORRECT, False))
                row[C.TOK_SAMPLE] = SAMPLE_TOP_TOKEN
            top = [r for r in top if (r[C.TOK_RESPONSE], r[C.TOK_POSITION]) not in taken]
        rows.extend(top)
        self._add_text(rows, sources)
        return rows

    @staticmethod
    def _response_rows(
        source: _TokenSource, sel: list[int], action_ids: Callable[..., torch.Tensor]
    ) -> list[dict]:
        """Rows of every completion position of responses ``sel`` of one probe (one host copy)."""
        rec = source.record
        idx = torch.tensor(sel, dtype=torch.long, device=rec.logp_old.device)
        gen = rec.mask[idx] != 0  # [n, L]
        pos = gen if rec.completion_mask is None else (rec.completion_mask[idx] != 0) | gen
        nan = torch.full((), math.nan, dtype=torch.float64, device=idx.device)
        old = rec.logp_old[idx].double()  # [n, L]
        new = rec.logp_new[idx].double()  # [n, L]
        ids = (
            rec.token_ids[idx].to(idx.device).double()
            if rec.token_ids is not None
            else torch.full_like(old, -1.0)
        )  # [n, L]
        table = torch.stack(
            [
                pos.double(),
                ids,
                action_ids(gen).double(),
                gen.double(),
                torch.where(gen, old, nan),
                torch.where(gen, new - old, nan),
            ],
            -1,
        )  # [n, L, 6]
        resp = {}  # per-response constants: correct, reward, advantage
        per = [rec.correct[idx].double()]
        names = [C.TOK_CORRECT]
        for name, t in ((C.TOK_REWARD, source.rewards), (C.TOK_ADVANTAGE, source.advantages)):
            if t is not None:
                per.append(t.reshape(-1)[idx.to(t.device)].to(idx.device).double())
                names.append(name)
        for b, vals in zip(sel, torch.stack(per, 1).cpu().tolist(), strict=True):
            resp[b] = dict(zip(names, vals, strict=True))
        out: list[dict] = []
        for b, positions in zip(sel, table.cpu().tolist(), strict=True):
            const = resp[b]
            for p, (inside, tid, action, is_gen, lp_old, dl) in enumerate(positions):
                if inside < 0.5:
                    continue  # padding
                row = {
                    C.TOK_RESPONSE: source.offset + b,
                    C.TOK_POSITION: p,
                    C.TOK_TOKEN_ID: int(tid),
                    C.TOK_ACTION: int(action),
                    C.TOK_GENERATED: int(is_gen),
                    C.TOK_LOGP_OLD: lp_old,
                    C.TOK_DELTA: dl,
                    C.TOK_CORRECT: int(const[C.TOK_CORRECT] > 0.5),
                    C.TOK_SAMPLE: SAMPLE_RESPONSE,
                }
                for name in (C.TOK_REWARD, C.TOK_ADVANTAGE):
                    if name in const:
                        row[name] = const[name]
                out.append(row)
        return out

    @staticmethod
    def _add_text(rows: list[dict], sources: Sequence[_TokenSource]) -> None:
        """Set ``C.TOK_TEXT`` on every row: one batched tokenizer call per step ('' without one)."""
        tokenizer = next((s.tokenizer for s in sources if s.tokenizer is not None), None)
        ids = sorted({r[C.TOK_TOKEN_ID] for r in rows if r.get(C.TOK_TOKEN_ID, -1) >= 0})
        texts: dict[int, str] = {}
        if tokenizer is not None and ids:
            if hasattr(tokenizer, "batch_decode"):
                decoded = tokenizer.batch_decode(
                    [[i] for i in ids],
                    skip_special_tokens=False,
                    clean_up_tokenization_spaces=False,
                )
            elif hasattr(tokenizer, "convert_ids_to_tokens"):
                decoded = tokenizer.convert_ids_to_tokens(ids)
            else:
                raise ValueError(
                    f"tokenizer {type(tokenizer).__name__} has neither batch_decode nor "
                    "convert_ids_to_tokens; pass a transformers tokenizer, or none (text '')"
                )
            texts = dict(zip(ids, (str(t) for t in decoded), strict=True))
        for row in rows:
            row[C.TOK_TEXT] = texts.get(row.get(C.TOK_TOKEN_ID, -1), "")

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
                logp_new,
                logp_old.detach(),
                advantages,
                mask,
                gate=cfg.gate,
                normalize=cfg.normalize,
                **kw,
            )
            self._record_llds(out)
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

        return _STD_FIELDS, len(SUM_FIELDS)

    # -- plain API: the row -------------------------------------------------------------------

    def end_step(self, step: int | None = None, **extra_columns: Any) -> dict[str, Any]:
        """Close the current step: reduce across ranks, write one row (rank 0), detect, act.

        Returns the row (the same on every rank). ``extra_columns`` are added to it as given.
        """
        row: dict[str, Any] = {}
        with self.guard("end_step"):
            row = self._end_step(step, extra_columns)
        self._acc = _Acc()
        self._token_sources, self._probed_in_step = [], 0
        self.step = (row.get(C.STEP, self.step) if row else self.step) + 1
        return row

    def _end_step(self, step: int | None, extra: Mapping[str, Any]) -> dict[str, Any]:
        from lld_monitor.metrics import SUM_FIELDS, stats_from_sums

        if self.writer is None and self.rank == 0 and self.adapter is None:
            self.start()
        step = self.step if step is None else int(step)
        acc = self._acc
        n_sum = len(SUM_FIELDS)
        device = acc.device or torch.device("cpu")
        dist = _torch_dist()
        if dist is not None and dist.get_backend() == "nccl" and device.type != "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        names = sorted(acc.reward_fn)  # the same reward functions on every rank
        parts = [acc.vector(n_sum, device)]
        parts += [acc.reward_fn[n].to(device, torch.float64) for n in names]  # (sum, count) each
        vec = torch.cat(parts)  # [n_std + 2K + 2F]
        n_std = len(_STD_FIELDS)
        rank0_only = [_STD_FIELDS.index(f) for f in ("llds_on", "llds_lam", "grad_max")]
        if self.strict:  # tests: this rank's sums before the cross-rank reduction
            self.last_local_sums = vec.detach().clone()
        i_on, i_lam = rank0_only[0], rank0_only[1]
        if dist is None or dist.get_rank() == 0:
            vec[i_on] = float(self.llds.enabled)
            vec[i_lam] = self.llds.lam
        else:  # rank 0's value only: the switch state, and the (DDP-global) grad norm max
            vec[rank0_only] = 0.0
        if dist is not None:
            dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        host = vec.tolist()  # the one host transfer of the step
        fn_vals = host[n_std + 2 * n_sum :]
        s = dict(zip(_STD_FIELDS, host[:n_std], strict=True))
        conf = torch.tensor(host[n_std : n_std + n_sum], dtype=torch.float64)
        disp = torch.tensor(host[n_std + n_sum : n_std + 2 * n_sum], dtype=torch.float64)

        if dist is not None and self.llds._sync(bool(s["llds_on"] > 0.5), s["llds_lam"]):
            logger.info("lld_monitor: LLDS state adopted from rank 0")

        row: dict[str, Any] = {C.STEP: step, C.TIME: time.time()}
        n_r = s["n_rewarded"]
        if n_r > 0:
            mean = s["reward_sum"] / n_r
            row[C.REWARD_MEAN] = mean
            var = (s["reward_sq_sum"] - n_r * mean * mean) / (n_r - 1) if n_r > 1 else float("nan")
            row[C.REWARD_STD] = math.sqrt(max(var, 0.0)) if not math.isnan(var) else var
        if s["n_resp"] > 0:
            row[C.ACCURACY] = s["n_correct_resp"] / s["n_resp"]
            row[C.COMPLETION_LENGTH] = s["length_sum"] / s["n_resp"]
        if s["entropy_count"] > 0:
            row[C.ENTROPY] = s["entropy_sum"] / s["entropy_count"]
        if s["kl_count"] > 0:
            row[C.KL] = s["kl_sum"] / s["kl_count"]
        if s["n_groups"] > 0:
            row[C.FRAC_ZERO_STD_GROUPS] = s["zero_std_groups"] / s["n_groups"]
        if s["searches_count"] > 0:
            row[C.NUM_SEARCHES] = s["searches_sum"] / s["searches_count"]
        if s["loss_count"] > 0:
            row[C.LOSS] = s["loss_sum"] / s["loss_count"]
        if s["grad_count"] > 0:
            row[C.GRAD_NORM] = s["grad_sum"] / s["grad_count"]
            row[C.GRAD_NORM_MAX] = s["grad_max"]
        for k, name in enumerate(names):
            tot, cnt = fn_vals[2 * k], fn_vals[2 * k + 1]
            row[C.REWARD_FN_PREFIX + name] = tot / cnt if cnt > 0 else float("nan")
        if s["n_resp"] > 0:
            conf_row = stats_from_sums(conf).as_row()
            row.update({c: conf_row[c] for c in C.CONFIDENCE_COLUMNS})
        if s["n_probe"] > 0:
            disp_row = stats_from_sums(disp).as_row()
            row.update({c: disp_row[c] for c in C.DISPLACEMENT_COLUMNS})
        elif s["n_probe_still"] > 0:
            self._note_once(
                "no_step_probe",
                step,
                "displacement columns left out: the post-update probe found no generated token "
                "whose log-prob changed (the optimizer did not step: learning rate 0 during "
                "warm-up, or skipped steps; or the policy puts probability 1 on every sampled "
                "token), so such rows are no evidence of displacement; said once, it applies to "
                "every such row",
                "info",
                {"probes": s["n_probe_still"]},
            )
        on = s["llds_on"] > 0.5
        row[C.LLDS_ENABLED] = int(on)
        row[C.LLDS_LAMBDA] = s["llds_lam"] if on else 0.0
        if s["llds_count"] > 0:
            row[C.LLDS_LOSS] = s["llds_loss_sum"] / s["llds_count"]
            row[C.LLDS_FRAC_GATED] = s["llds_frac_sum"] / s["llds_count"]
        row.update(extra)

        self.last_row = row
        if self.rank == 0 and self.writer is not None:
            self.writer.log_step(row)
            self.rows_written += 1
            if self._token_sources:
                self._write_tokens(self._token_sources, step)
            for sink in self.sinks:
                fn = getattr(sink, "log_step", None)
                if fn is not None:
                    with self.guard(f"sink {type(sink).__name__}.log_step"):
                        fn(row)
        self._check_zero_std(row, step)
        self._detect(row, step)
        return row

    def _write_tokens(self, sources: list[_TokenSource], step: int) -> None:
        """Build the step's token samples and write them to Parquet off the training thread.

        In strict mode inline, raising. The sources hold detached tensors no one mutates.
        """
        if self.strict:
            self.writer.log_tokens(self.token_sample_rows(sources), step)
            return
        if self._token_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._token_pool = ThreadPoolExecutor(1, thread_name_prefix="lld_monitor_tokens")
        writer = self.writer

        def write() -> None:
            with self.guard("log_tokens"):
                writer.log_tokens(self.token_sample_rows(sources), step)

        self._token_pool.submit(write)

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
            for sink in self.sinks:
                fn = getattr(sink, "alert", None)
                if fn is not None:
                    with self.guard(f"sink {type(sink).__name__}.alert"):
                        fn(alert)
            self._act(alert, step)

    def decide(self, alert: Alert) -> list[tuple[str, str]]:
        """The actions this monitor's settings take on ``alert``: ``[(action, reason), ...]``."""
        actions = []
        if self.auto_llds and alert.kind in self.auto_llds_on and not self.llds.enabled:
            actions.append(
                ("llds_enable", f"auto_llds on a {alert.kind} alert at step {alert.step}")
            )
        if alert.kind in COLLAPSE_KINDS:
            if self.stop_on_collapse:
                actions.append(
                    ("stop", f"stop_on_collapse on a collapse alert at step {alert.step}")
                )
            if self.checkpoint_on_collapse:
                actions.append(("checkpoint", f"checkpoint_on_collapse at step {alert.step}"))
        return actions

    def _act(self, alert: Alert, step: int) -> None:
        for action, reason in self.decide(alert):
            if action == "llds_enable":
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

    # -- end ----------------------------------------------------------------------------------

    def close(self, error: BaseException | None = None) -> None:
        """Flush and close the run log and the sinks; idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.adapter is not None:
            with self.guard("adapter.uninstall"):
                self.adapter.uninstall()
        for sink in self.sinks:
            fn = getattr(sink, "close", None)
            if fn is not None:
                with self.guard(f"sink {type(sink).__name__}.close"):
                    fn()
        if self.writer is not None:
            if self._token_pool is not None:
                self._token_pool.shutdown(wait=True)  # pending token files first
            with self.guard("run log close"):
                self.writer.close(error=error)

    def __enter__(self) -> LLDMonitor:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(error=exc)
