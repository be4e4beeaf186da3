"""Adapter for any transformers ``Trainer``: loss, pre-clip grad norm, learning rate, metrics.

The only module that wraps ``Trainer`` methods: ``training_step`` (the step's loss) and
``_get_grad_norm`` (the pre-clip global norm the Trainer computes when it clips). LLD columns are
absent for a plain Trainer (no rollouts); the run's meta says so.
"""

from __future__ import annotations

import inspect
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState

from lld_monitor import columns as C
from lld_monitor.events import warn_user
from lld_monitor.monitor.sigterm import install_sigterm, restore_sigterm

#: Trainer methods this adapter wraps, with the leading parameters it relies on.
WRAPPED_TRAINER_METHODS: dict[str, tuple[str, ...]] = {
    "training_step": ("self", "model", "inputs", "num_items_in_batch"),
    "_get_grad_norm": ("self", "model", "grad_norm"),
}

# Keys of the Trainer's own logs that the row already has from the hooks, or that are not numbers.
_LOG_MAPPED = {"loss": C.LOSS, "grad_norm": C.GRAD_NORM, "learning_rate": C.LEARNING_RATE}


def peft_meta(model: Any) -> dict[str, Any] | None:
    """The PEFT adapters of ``model`` (a ``peft.PeftModel``, possibly wrapped) for ``meta.json``:
    per adapter its type, rank, alpha, dropout and target modules; None for a plain model."""
    inner = getattr(model, "module", model)  # DDP / accelerate wrappers
    configs = getattr(inner, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return None
    out: dict[str, Any] = {"active_adapter": getattr(inner, "active_adapter", None), "adapters": {}}
    for name, cfg in configs.items():
        kind = getattr(cfg, "peft_type", None)
        targets = getattr(cfg, "target_modules", None)
        out["adapters"][str(name)] = {
            "peft_type": getattr(kind, "value", None if kind is None else str(kind)),
            "r": getattr(cfg, "r", None),
            "lora_alpha": getattr(cfg, "lora_alpha", None),
            "lora_dropout": getattr(cfg, "lora_dropout", None),
            "target_modules": sorted(targets)
            if isinstance(targets, set | list | tuple)
            else targets,
        }
    if not isinstance(out["active_adapter"], str | type(None)):
        out["active_adapter"] = str(out["active_adapter"])
    return out


def check_trainer_internals(cls: type = Trainer) -> list[str]:
    """Problems with the Trainer methods we wrap (empty when the installed version fits)."""
    return signature_problems(cls, WRAPPED_TRAINER_METHODS)


def signature_problems(cls: type, methods: dict[str, tuple[str, ...]]) -> list[str]:
    """Methods of ``cls`` that are missing or whose leading parameters are not the expected ones."""
    problems = []
    for name, params in methods.items():
        fn = getattr(cls, name, None)
        if fn is None:
            problems.append(f"{cls.__name__}.{name} is missing")
            continue
        got = tuple(inspect.signature(fn).parameters)[: len(params)]
        if got != params:
            problems.append(f"{cls.__name__}.{name} parameters are {got}, expected {params}")
    return problems


def active_dropout(model: torch.nn.Module) -> list[str]:
    """Where ``model`` applies dropout in training mode: ``["name: p=0.1", ...]`` (empty if none).

    Finds ``nn.Dropout`` modules with ``p > 0`` (what TRL's ``disable_dropout`` zeroes) and the
    functional attention dropout of transformers' attention modules (``attention_dropout``,
    which ``disable_dropout`` leaves as it is).
    """
    found = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            found.append(f"{name or type(module).__name__}: p={module.p:g}")
        p = getattr(module, "attention_dropout", None)
        if isinstance(p, int | float) and not isinstance(p, bool) and p > 0:
            found.append(f"{name}.attention_dropout={p:g}")
    return found


def dropout_problem(model: torch.nn.Module) -> str | None:
    """Why dropout makes the LLD measurement noise in ``model``, or None without dropout."""
    found = active_dropout(model)
    if not found:
        return None
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return (
        f"the model applies dropout in training ({shown}): the post-update probe and the LLDS "
        "term compare two differently-dropped forwards, so the displacement columns are noise "
        "(with lr 0 most tokens read as displaced) and LLDS puts a gradient on that noise. "
        "Disable it: GRPOConfig(disable_dropout=True) zeroes nn.Dropout; set the model "
        "config's attention_dropout=0 too"
    )


class LLDMonitorCallback(TrainerCallback, ExportableState):
    """Forwards Trainer events to the adapter; writes only ``control``.

    An ``ExportableState``: the monitor's :meth:`~lld_monitor.LLDMonitor.state_dict` is saved
    with every checkpoint (``trainer_state.json``) and restored at ``on_train_begin`` when
    training resumes from one. Each adapter binds a subclass of the same name to itself, so the
    callback transformers rebuilds with ``restore_callback_states_from_checkpoint=True``
    (``type(callback)()``) still reaches the live monitor.
    """

    bound_adapter: TrainerAdapter | None = None

    def __init__(self, adapter: TrainerAdapter | None = None) -> None:
        self.adapter = adapter if adapter is not None else type(self).bound_adapter
        if self.adapter is None:
            raise ValueError("LLDMonitorCallback needs the adapter it forwards to")

    @classmethod
    def bound_to(cls, adapter: TrainerAdapter) -> LLDMonitorCallback:
        bound = type(cls.__name__, (cls,), {"bound_adapter": adapter})
        return bound(adapter)

    @property
    def active(self) -> bool:
        return not self.adapter.monitor.closed

    def state(self) -> dict[str, Any]:
        """Saved in ``trainer_state.json``: must be plain JSON, and must never fail a save."""
        lld_state = None
        with self.adapter.monitor.guard("checkpoint state"):
            state = self.adapter.monitor.state_dict()
            json.dumps(state)  # e.g. a custom detector whose state is not JSON: not saved
            lld_state = state
        return {"args": {}, "attributes": {"lld_state": lld_state}}

    @property
    def lld_state(self) -> dict[str, Any]:
        return self.adapter.monitor.state_dict()

    @lld_state.setter
    def lld_state(self, value: Mapping[str, Any]) -> None:  # transformers' own restore path
        self.adapter.callback = self
        if value is not None:  # None: not saved; on_train_begin says so
            self.adapter.restore(value)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.adapter.monitor.closed:
            warn_user(
                "lld_monitor: this trainer's monitor was closed when the previous train() ended; "
                "this train() runs unmonitored. Attach a new LLDMonitor (resume=True on the same "
                "folder continues it)"
            )
            return
        with self.adapter.hook("on_train_begin"):
            self.adapter.on_train_begin(state)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.active:
            return
        with self.adapter.hook("on_optimizer_step"):
            self.adapter.on_optimizer_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if not self.active:
            return control
        with self.adapter.hook("on_step_end"):
            self.adapter.on_step_end(state, control)
        return self.adapter.apply_control(control)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        if not self.active:
            return control
        with self.adapter.hook("on_log"):
            self.adapter.on_log(state, control, logs or {})
        return self.adapter.apply_control(control)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.active:
            return
        with self.adapter.hook("on_train_end"):
            self.adapter.on_train_end(state)


class TrainerAdapter:
    """Hooks a ``transformers.Trainer`` into an ``LLDMonitor``: one row per optimizer step.

    The row of a logging step waits for the Trainer's ``on_log`` so that everything the Trainer
    logs (eval metrics excepted) joins it; other rows are written at ``on_step_end``.
    """

    trainer_name = "transformers.Trainer"
    lld_columns = False
    defer_to_log = True

    def __init__(self, monitor: Any, trainer: Trainer) -> None:
        self.monitor = monitor
        self.trainer = trainer
        self.callback = LLDMonitorCallback.bound_to(self)
        self._originals: dict[str, Callable[..., Any]] = {}
        self._loss: torch.Tensor | None = None
        self._lr: float | None = None
        self._pending: int | None = None  # step whose row waits for on_log
        self._installed = False
        self._restored = False
        self.hook_seconds = 0.0  # wall time spent in the monitor's hooks (overhead, benchmarks)
        self.hook_cpu_seconds = 0.0  # process CPU time in them (other processes' load: not in)

    @contextmanager
    def hook(self, name: str) -> Iterator[None]:
        """A top-level hook: the monitor's failure policy, and its time added to hook_seconds
        (wall) and hook_cpu_seconds (process CPU)."""
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            with self.monitor.guard(name):
                yield
        finally:
            self.hook_seconds += time.perf_counter() - t0
            self.hook_cpu_seconds += time.process_time() - c0

    # -- install ------------------------------------------------------------------------------

    def meta(self) -> dict[str, Any]:
        args = self.trainer.args
        meta: dict[str, Any] = {
            "trainer_config": {
                "per_device_train_batch_size": args.per_device_train_batch_size,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "learning_rate": args.learning_rate,
                "max_grad_norm": args.max_grad_norm,
                "world_size": args.world_size,
                # where the trainer saves its checkpoint-N folders (lld-monitor report names
                # the last one before an onset)
                "output_dir": str(args.output_dir) if args.output_dir is not None else None,
            }
        }
        peft = peft_meta(getattr(self.trainer, "model", None))
        if peft is not None:
            meta["peft"] = peft
        return meta

    def install(self) -> None:
        problems = check_trainer_internals(type(self.trainer))
        if problems:
            raise RuntimeError(
                "lld_monitor cannot hook this transformers Trainer: "
                + "; ".join(problems)
                + ". Install a transformers version lld_monitor supports (see docs/monitor.md)."
            )
        self.monitor.start(trainer=self.trainer_name, lld_columns=self.lld_columns, **self.meta())
        self._wrap("train", self._train)
        self._wrap("training_step", self._training_step)
        self._wrap("_get_grad_norm", self._get_grad_norm)
        self.trainer.add_callback(self.callback)
        self._installed = True

    def _wrap(self, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(self.trainer, name)
        self._originals[name] = original
        setattr(self.trainer, name, make(original))

    def uninstall(self) -> None:
        """Restore the wrapped methods and drop the callback."""
        for name in self._originals:
            self.trainer.__dict__.pop(name, None)
        self._originals.clear()
        self._installed = False  # the callback stays registered but goes inert

    # -- wrappers -----------------------------------------------------------------------------

    def _train(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``trainer.train``: when it raises (a reward function, a CUDA error, Ctrl-C), the run
        log still gets its ``end`` event naming the exception and its ``closed.json``; the
        exception goes on to the caller unchanged."""

        def train(*args: Any, **kwargs: Any) -> Any:
            previous = install_sigterm()
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                with self.monitor.guard("close after the trainer raised"):
                    self.monitor.close(error=exc)
                raise
            finally:
                restore_sigterm(previous)

        return train

    def _training_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def training_step(model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            out = original(model, inputs, num_items_in_batch)
            with self.hook("training_step"):
                if isinstance(out, torch.Tensor) and self.trainer.model.training:
                    loss = out.detach().float()
                    self._loss = loss if self._loss is None else self._loss + loss
            return out

        return training_step

    def _get_grad_norm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _get_grad_norm(model: Any, grad_norm: Any = None) -> Any:
            out = original(model, grad_norm=grad_norm)
            with self.hook("grad norm"):
                self.monitor.observe_update(grad_norm=out, loss=self._loss)
                self._loss = None
            return out

        return _get_grad_norm

    # -- events -------------------------------------------------------------------------------

    def on_optimizer_step(self) -> None:
        opt = self.trainer.optimizer
        self._lr = float(opt.param_groups[0]["lr"])

    def extra_columns(self) -> dict[str, Any]:
        return {} if self._lr is None else {C.LEARNING_RATE: self._lr}

    def on_step_end(self, state: Any, control: Any) -> None:
        if self.defer_to_log and control.should_log:
            self._pending = state.global_step
            return
        self.finish_step(state.global_step, {})

    def on_log(self, state: Any, control: Any, logs: Mapping[str, Any]) -> None:
        if self._pending is None or self._pending != state.global_step:
            return
        extra = {}
        for key, value in logs.items():
            if key in _LOG_MAPPED or key.startswith("eval_") or isinstance(value, bool):
                continue
            if isinstance(value, int | float) and math.isfinite(float(value)):
                extra[key] = float(value)
        self._pending = None
        self.finish_step(state.global_step, extra)

    def finish_step(self, step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        return self.monitor.end_step(step=step, **{**extra, **self.extra_columns()})

    def on_train_begin(self, state: Any) -> None:
        """On a resume from a checkpoint, restore the monitor's state saved with it."""
        if state.global_step > 0:
            with self.monitor.guard("resume checks"):
                self.resume_checks(int(state.global_step))
        if state.global_step <= 0:
            if self.monitor.resumed_last_step is not None:
                warn_user(
                    f"lld_monitor: the run folder {self.monitor.run_dir} already holds steps up "
                    f"to {self.monitor.resumed_last_step} but training starts from step 0: rows "
                    "of those steps will not be written again. Resume from a checkpoint, or give "
                    "the monitor a new folder"
                )
            return
        saved = (state.stateful_callbacks or {}).get(type(self.callback).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        lld_state = (saved or {}).get("attributes", {}).get("lld_state")
        if lld_state is None:
            warn_user(
                f"lld_monitor: training resumes at step {state.global_step} from a checkpoint "
                "without the monitor's state (saved before the monitor was attached?): the LLDS "
                "switch, detector and phase start afresh"
            )
            return
        self.restore(lld_state)

    def resume_checks(self, step: int) -> None:
        """What a trainer of this kind must say when training resumes at ``step`` (none here)."""

    def restore(self, lld_state: Mapping[str, Any]) -> None:
        """Load a saved monitor state once (both restore paths may call it)."""
        if self._restored:
            return
        self._restored = True
        with self.monitor.guard("restore monitor state"):  # e.g. other detector settings
            self.monitor.load_state_dict(lld_state)

    def on_train_end(self, state: Any) -> None:
        if self._pending is not None:
            step, self._pending = self._pending, None
            self.finish_step(step, {})
        self.monitor.close()

    def apply_control(self, control: Any) -> Any:
        """Copy the monitor's stop/checkpoint decisions into the Trainer's ``control``."""
        if self.monitor.should_stop:
            control.should_training_stop = True
        if self.monitor.take_save_request():
            control.should_save = True
        return control


_Callback = LLDMonitorCallback  # the former name
