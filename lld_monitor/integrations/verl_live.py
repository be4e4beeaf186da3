"""verl driver side: the live monitor, the runtime LLDS switch, the post-update probe, the flight
recorder.

Runs in verl's driver (the process that holds ``RayPPOTrainer`` / the v1 ``PPOTrainer``); the
workers only run the ``llds`` policy loss (:mod:`lld_monitor.integrations.verl`). Per training
step the driver calls, in this order::

    live.before_update()                      # push the LLDS switch to the workers (Ray actor)
    ...  verl's update_actor  ...
    rows = live.probe_rows(batch_size)        # a sample of the batch, or None
    ...  verl's compute_log_prob on those rows (the probe)  ...
    live.end_step(step, batch, metrics, probe_log_probs=..., probe_rows=rows)

``end_step`` turns the step's padded tensors and verl's metric dict into one run-folder row
through :class:`lld_monitor.LLDMonitor`'s plain-loop API (so the dashboard follows the run and the
detector, alerts, sinks and ``auto_llds`` work as in TRL), then feeds the flight recorder.
:mod:`lld_monitor.integrations.verl_trainer` wires these calls into verl's v1 trainer.

The LLDS switch: ``live.llds.enable()`` / ``disable()`` (or ``auto_llds`` on an alert) changes
:class:`lld_monitor.monitor.LLDSSwitch`; ``before_update`` copies it into a named Ray actor
(:class:`LLDSControl`) that the ``llds`` loss reads at every call when the policy_loss section's
``llds_control`` names it. So the loss uses the new lambda from the next update on.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from lld_monitor import columns as C
from lld_monitor import metrics
from lld_monitor.events import make_event
from lld_monitor.importers.names import FOREIGN_NAMES
from lld_monitor.monitor.config import MonitorConfig

_LOG = logging.getLogger(__name__)

__all__ = [
    "FLIGHT_DIR",
    "TRAINER_SETTINGS",
    "FlightRecorder",
    "LLDSControl",
    "VerlLiveMonitor",
    "control_name_for",
    "response_rewards",
    "settings_from",
    "sinks_from",
]

#: Folder of the flight recorder inside the run folder.
FLIGHT_DIR = "flight"
#: verl's step metrics the monitor reads (after verl prefixed ``actor/``).
GRAD_NORM_KEY = "actor/grad_norm"
PG_LOSS_KEY = "actor/pg_loss"
LLDS_LOSS_KEY = "actor/lld/" + C.LLDS_LOSS
LLDS_FRAC_KEY = "actor/lld/" + C.LLDS_FRAC_GATED
#: verl's sampler-vs-trainer metrics of a step (``rollout_corr/*`` of its rollout correction,
#: ``training/rollout_probs_diff_*`` of its rollout-vs-actor debug metrics) -> our column: the
#: importer's names for them (``importers.names.FOREIGN_NAMES``, one definition), written to the
#: row when verl computed them, as on import (the ``sampler_mismatch`` check reads them).
VERL_SAMPLER_METRICS: dict[str, str] = {
    key: col
    for col in (C.IS_RATIO_MEAN, C.SAMPLER_LOGP_DIFF, C.SAMPLER_PROB_DIFF)
    for key in FOREIGN_NAMES[col]
    if key.startswith(("rollout_corr/", "training/"))
}


# --- settings of the trainer (verl_trainer.LLDMonitorTrainer) ------------------------------------

#: Keys of the ``lld_monitor`` config section and their defaults.
TRAINER_SETTINGS: dict[str, Any] = {
    "run_dir": None,  # default: <trainer.default_local_dir>/lld_run
    # share of each batch probed after its update (0 = off): the monitor's own default
    "probe_fraction": MonitorConfig().probe_fraction,
    "auto_llds": False,  # switch LLDS on at a stagnation/decay alert
    "auto_llds_on": ["stagnation", "decay"],
    "llds_lambda": 0.2,  # lambda for auto_llds / llds.enable()
    "flight_recorder": True,
    "console": True,  # alerts to the log
    "wandb": False,  # alerts and rows to the W&B run verl's tracker opened
    "webhook": None,  # URL for Slack-compatible alert POSTs
}


def settings_from(config: Any) -> dict[str, Any]:
    """The ``lld_monitor`` section merged over :data:`TRAINER_SETTINGS`; unknown keys raise."""
    from omegaconf import OmegaConf

    section = config.get("lld_monitor") if hasattr(config, "get") else None
    given = OmegaConf.to_container(section, resolve=True) if section is not None else {}
    if not isinstance(given, dict):
        raise ValueError(f"lld_monitor config must be a mapping of settings, got {given!r}")
    unknown = sorted(set(given) - set(TRAINER_SETTINGS))
    if unknown:
        raise ValueError(
            f"lld_monitor config: unknown keys {unknown}; known: {sorted(TRAINER_SETTINGS)}"
        )
    return {**TRAINER_SETTINGS, **given}


def sinks_from(settings: Mapping[str, Any]) -> list[Any]:
    """The sinks the trainer settings ask for (console, W&B, webhook)."""
    from lld_monitor.sinks import ConsoleSink, WandbSink, WebhookSink

    sinks: list[Any] = []
    if settings["console"]:
        sinks.append(ConsoleSink())
    if settings["wandb"]:
        sinks.append(WandbSink())
    if settings["webhook"]:
        sinks.append(WebhookSink(settings["webhook"]))
    return sinks


# --- the runtime switch ---------------------------------------------------------------------------


class LLDSControl:
    """The LLDS state the workers' ``llds`` loss reads: on/off, lambda, a version counter.

    A plain class; the driver runs it as a named Ray actor (``ray.remote(LLDSControl)``) with no
    CPU reserved. ``version`` grows by one per change, so a loss's metrics say which state it used.
    """

    def __init__(self, enabled: bool = False, lam: float = 0.0) -> None:
        self._state = {"enabled": bool(enabled), "lam": float(lam), "version": 0, "step": None}

    def set(self, enabled: bool, lam: float, step: int | None = None) -> dict[str, Any]:
        """Change the state; returns it."""
        self._state = {
            "enabled": bool(enabled),
            "lam": float(lam),
            "version": self._state["version"] + 1,
            "step": step,
        }
        return dict(self._state)

    def get(self) -> dict[str, Any]:
        """The state in force."""
        return dict(self._state)


def control_name_for(run_dir: str | Path) -> str:
    """The Ray actor name of a run folder's LLDS control (unique per folder)."""
    return "lld_monitor_llds:" + str(Path(run_dir).resolve())


# --- tensors --------------------------------------------------------------------------------------


def response_rewards(batch: Mapping[str, Any]) -> torch.Tensor | None:
    """[B] rewards: the sum over tokens of verl's ``token_level_scores`` ([B, R], the score on the
    last token), else of ``token_level_rewards`` (scores minus any in-reward KL penalty), else
    ``rm_scores`` / ``rewards`` ([B] or [B, R]); None when the batch holds none of them."""
    for key in ("token_level_scores", "token_level_rewards", "rm_scores", "rewards"):
        value = batch.get(key)
        if value is None:
            continue
        value = torch.as_tensor(value).float()
        return value.sum(-1) if value.dim() == 2 else value.reshape(-1)
    return None


def _response_advantage(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B]: masked mean of token-level advantages [B, R] (constant per response in GRPO)."""
    if adv.dim() == 1:
        return adv.float()
    m = mask.float()
    return (adv.float() * m).sum(1) / m.sum(1).clamp(min=1)


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


def _scalar(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean())
    if isinstance(value, list | tuple | np.ndarray):
        arr = np.asarray(value, dtype=float)
        return float(arr.mean()) if arr.size else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


# --- flight recorder ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    step: int
    arrays: dict[str, np.ndarray]
    scalars: dict[str, float | None]
    texts: list[str]
    rows: list[int]


class FlightRecorder:
    """Keeps the last ``before`` steps and writes them, the trigger step and the next ``after``
    steps into ``<run>/flight/`` when a critical alert or a non-finite value is seen.

    What verl's maintainers ask for when a run goes bad, per step: old and current log-probs,
    reference log-probs, advantages, masks, token-level KL (old - ref), grad norm, rewards and
    the decoded responses. Bounded: at most ``max_rows`` responses of ``max_tokens`` tokens per
    step (float32), ``max_triggers`` triggers per run. Files per step: ``step_<N>.npz`` (arrays,
    NaN where a tensor was not given) and ``step_<N>.json`` (scalars, rows, texts);
    ``index.jsonl`` lists each trigger with its reason and the steps written.
    """

    ARRAYS: tuple[str, ...] = (
        "responses",
        "response_mask",
        "old_log_probs",
        "log_probs",
        "ref_log_prob",
        "advantages",
        "kl",
    )

    def __init__(
        self,
        run_dir: str | Path,
        *,
        before: int = 2,
        after: int = 1,
        max_rows: int = 8,
        max_tokens: int = 1024,
        max_triggers: int = 3,
    ) -> None:
        for name, value in (("before", before), ("after", after), ("max_triggers", max_triggers)):
            if int(value) < 0:
                raise ValueError(f"FlightRecorder {name} must be >= 0, got {value!r}")
        for name, value in (("max_rows", max_rows), ("max_tokens", max_tokens)):
            if int(value) < 1:
                raise ValueError(f"FlightRecorder {name} must be >= 1, got {value!r}")
        self.dir = Path(run_dir) / FLIGHT_DIR
        self.before, self.after = int(before), int(after)
        self.max_rows, self.max_tokens = int(max_rows), int(max_tokens)
        self.max_triggers = int(max_triggers)
        self._ring: deque[_Snapshot] = deque(maxlen=self.before)
        self._after_left = 0
        self.triggers: list[dict[str, Any]] = []
        self.written: list[int] = []

    def snapshot(
        self,
        step: int,
        batch: Mapping[str, Any],
        scalars: Mapping[str, Any],
        *,
        probe_log_probs: torch.Tensor | None = None,
        probe_rows: torch.Tensor | None = None,
        decode: Callable[[list[int]], str] | None = None,
    ) -> _Snapshot:
        """The bounded record of one step (rows: the probed rows first, then the others)."""
        mask = torch.as_tensor(batch["response_mask"])
        n = mask.shape[0]
        order = list(range(n))
        if probe_rows is not None:
            probed = [int(i) for i in probe_rows]
            order = probed + [i for i in order if i not in set(probed)]
        rows = order[: self.max_rows]
        width = min(mask.shape[1], self.max_tokens)
        idx = torch.as_tensor(rows, dtype=torch.long)

        def take(t: Any) -> np.ndarray:
            t = torch.as_tensor(t)
            return t[idx][:, :width].detach().float().cpu().numpy().astype(np.float32)

        arrays: dict[str, np.ndarray] = {}
        nan = np.full((len(rows), width), np.nan, dtype=np.float32)
        for key in ("responses", "response_mask", "old_log_probs", "ref_log_prob", "advantages"):
            arrays[key] = take(batch[key]) if batch.get(key) is not None else nan.copy()
        current = nan.copy()
        if probe_log_probs is not None and probe_rows is not None:
            pos = {int(r): k for k, r in enumerate(probe_rows)}
            for j, r in enumerate(rows):
                if r in pos:
                    current[j] = probe_log_probs[pos[r]][:width].detach().float().cpu().numpy()
        arrays["log_probs"] = current
        arrays["kl"] = arrays["old_log_probs"] - arrays["ref_log_prob"]
        texts: list[str] = []
        if decode is not None and batch.get("responses") is not None:
            resp = torch.as_tensor(batch["responses"])
            for r in rows:
                ids = resp[r][mask[r].bool()].tolist()
                try:
                    texts.append(decode(ids))
                except Exception as err:
                    texts.append(f"<decode failed: {type(err).__name__}>")
        clean = {k: _scalar(v) for k, v in scalars.items()}
        return _Snapshot(int(step), arrays, clean, texts, rows)

    def observe(self, snap: _Snapshot, reason: str | None) -> list[int]:
        """Add a step; ``reason`` (not None) triggers a dump. Returns the steps written now."""
        written: list[int] = []
        if reason is not None and len(self.triggers) < self.max_triggers:
            trigger = {"step": snap.step, "reason": reason, "time": time.time(), "steps": []}
            self.triggers.append(trigger)
            for old in [*self._ring, snap]:
                if old.step not in self.written:
                    self._write(old)
                    written.append(old.step)
            trigger["steps"] = list(written)
            self._ring.clear()
            self._after_left = self.after
            self._append_index(trigger)
            return written
        if self._after_left > 0:
            self._after_left -= 1
            if snap.step not in self.written:
                self._write(snap)
                written.append(snap.step)
                self._append_index(
                    {"step": snap.step, "reason": "after trigger", "time": time.time()}
                )
            return written
        if self.before > 0:
            self._ring.append(snap)
        return written

    def _write(self, snap: _Snapshot) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        stem = self.dir / f"step_{snap.step:06d}"
        np.savez_compressed(f"{stem}.npz", **snap.arrays)
        meta = {"step": snap.step, "rows": snap.rows, "scalars": snap.scalars, "texts": snap.texts}
        Path(f"{stem}.json").write_text(json.dumps(meta, allow_nan=True))
        self.written.append(snap.step)

    def _append_index(self, record: Mapping[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "index.jsonl", "a") as f:
            f.write(json.dumps(dict(record)) + "\n")


# --- the driver-side monitor ----------------------------------------------------------------------


class VerlLiveMonitor:
    """An :class:`lld_monitor.LLDMonitor` fed from verl's driver, plus the switch, probe and
    flight recorder.

    ``control``: the name of the Ray actor that carries the LLDS switch to the workers
    (``True``: :func:`control_name_for` the run folder; ``None``: no runtime switch). It must be
    the name in the actor's ``policy_loss.llds_control``. ``probe_fraction``: the share of each
    batch probed after its update (0 = no probe; at least one row otherwise). Other keyword
    arguments go to ``LLDMonitor`` (``sinks``, ``detector``, ``auto_llds``, ``auto_llds_on``,
    ``correct_threshold``, ``strict``, ...). ``tokenizer`` decodes token samples and the flight
    recorder's responses.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        llds: Any | None = None,
        control: str | bool | None = True,
        probe_fraction: float | None = None,
        flight_recorder: FlightRecorder | bool | None = True,
        tokenizer: Any | None = None,
        seed: int = 0,
        meta: Mapping[str, Any] | None = None,
        **monitor_kwargs: Any,
    ) -> None:
        from lld_monitor.monitor import LLDMonitor

        if probe_fraction is not None:
            monitor_kwargs["probe_fraction"] = probe_fraction  # (else the monitor's default)
        self.monitor = LLDMonitor(
            run_dir,
            llds=llds,
            meta={"engine": "verl", **dict(meta or {})},
            **monitor_kwargs,
        )
        self.run_dir = Path(run_dir)
        self.tokenizer = tokenizer
        self._gen = torch.Generator().manual_seed(int(seed))
        if flight_recorder is True:
            flight_recorder = FlightRecorder(run_dir)
        self.flight = flight_recorder or None
        if control is True:
            control = control_name_for(run_dir)
        self.control_name: str | None = control or None
        self._control: Any | None = None
        self._pushed: tuple[bool, float] | None = None
        self.control_version = 0
        self.monitor_seconds: list[float] = []  # driver time spent in this class, per step
        self._step_seconds = 0.0
        self.monitor.start(trainer="verl")

    # -- the switch ---------------------------------------------------------------------------

    @property
    def llds(self) -> Any:
        """The LLDS switch (``enable(lam)`` / ``disable()``), as ``LLDMonitor.llds``."""
        return self.monitor.llds

    def _ensure_control(self) -> Any:
        if self._control is None:
            import ray

            if not ray.is_initialized():  # never start a Ray cluster as a side effect
                raise RuntimeError(
                    "the LLDS control is a Ray actor and Ray is not initialised in this process "
                    "(verl's driver initialises it); pass control=None to run without one"
                )
            cls = ray.remote(num_cpus=0)(LLDSControl)
            self._control = cls.options(name=self.control_name, get_if_exists=True).remote(
                self.llds.enabled, self.llds.lam
            )
        return self._control

    def before_update(self, step: int | None = None) -> int:
        """Copy the switch into the workers' control if it changed; returns the control version.

        Call it before verl's ``update_actor``: the update then sees this state in every loss
        call. Without a control (``control=None``) it does nothing and returns 0.
        """
        t0 = time.perf_counter()
        with self.monitor.guard("verl before_update"):
            if self.control_name is not None:
                import ray

                state = (self.llds.enabled, float(self.llds.lam))
                handle = self._ensure_control()
                if state != self._pushed:
                    got = ray.get(handle.set.remote(state[0], state[1], step))
                    self.control_version = int(got["version"])
                    self._pushed = state
        self._step_seconds += time.perf_counter() - t0
        return self.control_version

    # -- the probe ----------------------------------------------------------------------------

    def probe_rows(
        self, batch_size: int, multiple: int = 1, correct: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Rows to probe after this batch's update (sorted [k]), or None when the probe is off.

        ``k`` is ``probe_fraction * batch_size`` rounded up to a ``multiple`` (verl splits a
        batch evenly over the data-parallel ranks and their micro-batches: pass
        ``dp_size * infer micro-batch size``), at most the batch. ``correct`` ([B] bool, the
        monitor's ``correct_mask`` of the batch): correct responses first, as the TRL adapter
        probes (``metrics.probe_rows``); without it, a random sample.
        """
        frac = self.monitor.probe_fraction
        if frac <= 0 or batch_size <= 0:
            return None
        multiple = max(1, int(multiple))
        k = max(1, math.ceil(frac * batch_size))
        k = min(batch_size, math.ceil(k / multiple) * multiple)
        if correct is not None:
            return metrics.probe_rows(correct, k, self._gen)
        return torch.randperm(batch_size, generator=self._gen)[:k].sort().values

    # -- the step -----------------------------------------------------------------------------

    def end_step(
        self,
        step: int,
        batch: Mapping[str, Any],
        metrics: Mapping[str, Any],
        *,
        probe_log_probs: torch.Tensor | None = None,
        probe_rows: torch.Tensor | None = None,
        step_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Write the step's row, run the detector/alerts/actions, feed the flight recorder.

        ``batch``: padded response tensors ([B, R]): ``response_mask``, ``old_log_probs``,
        ``advantages``, and when present ``responses``, ``token_level_scores``, ``entropy``,
        ``ref_log_prob``. ``metrics``: verl's step metric dict (``actor/grad_norm``,
        ``actor/pg_loss``, ``actor/lld/llds_loss``, and when verl computed them its sampler
        metrics, ``VERL_SAMPLER_METRICS``, ...). ``probe_log_probs`` [k, R]: the
        ``probe_rows`` after the update. Returns the row written.
        """
        t0 = time.perf_counter()
        mon = self.monitor
        observed = False
        with mon.guard("verl end_step rollout"):
            mask = torch.as_tensor(batch["response_mask"])
            old = torch.as_tensor(batch["old_log_probs"]).float()
            adv = batch.get("advantages")
            adv_r = None if adv is None else _response_advantage(torch.as_tensor(adv), mask)
            ref = batch.get("ref_log_prob")
            kl = None if ref is None else old - torch.as_tensor(ref).float()
            mon.observe_rollout(
                old,
                mask,
                rewards=response_rewards(batch),
                advantages=adv_r,
                token_ids=batch.get("responses"),
                entropy=batch.get("entropy"),
                kl=kl,
            )
            observed = True
        with mon.guard("verl end_step update"):
            llds_out = None
            if metrics.get(LLDS_LOSS_KEY) is not None:
                llds_out = SimpleNamespace(
                    loss=torch.tensor(_scalar(metrics[LLDS_LOSS_KEY])),
                    frac_gated=_scalar(metrics.get(LLDS_FRAC_KEY, float("nan"))),
                )
            mon.observe_update(
                grad_norm=_scalar(metrics.get(GRAD_NORM_KEY)),
                loss=_scalar(metrics.get(PG_LOSS_KEY)),
                llds_out=llds_out,
            )
        if probe_log_probs is not None and observed:  # never against an earlier step's batch
            rows = None if probe_rows is None else torch.as_tensor(probe_rows)
            mon.observe_post_update(
                torch.as_tensor(probe_log_probs).float(), rows=rows, tokenizer=self.tokenizer
            )
        sampler: dict[str, float] = {}
        with mon.guard("verl sampler metrics"):
            for key, col in VERL_SAMPLER_METRICS.items():
                value = _scalar(metrics.get(key))
                if value is not None and math.isfinite(value):
                    sampler[col] = value
        row = mon.end_step(step, **sampler)
        with mon.guard("verl flight recorder"):
            self._flight(step, batch, metrics, row, probe_log_probs, probe_rows)
        self._step_seconds += time.perf_counter() - t0
        self.monitor_seconds.append(self._step_seconds)
        self._step_seconds = 0.0
        return row

    def _flight(
        self,
        step: int,
        batch: Mapping[str, Any],
        metrics: Mapping[str, Any],
        row: Mapping[str, Any],
        probe_log_probs: torch.Tensor | None,
        probe_rows: torch.Tensor | None,
    ) -> None:
        if self.flight is None or self.monitor.rank != 0:
            return
        reasons = [
            f"critical {a.kind} alert" for a in self.monitor.last_alerts if a.severity == "critical"
        ]
        bad = sorted(
            k
            for k, v in {**dict(metrics), **dict(row)}.items()
            if isinstance(v, int | float | np.floating) and not _finite(v) and k in _WATCHED
        )
        if bad:
            reasons.append("non-finite " + ", ".join(bad))
        for key in ("old_log_probs", "advantages"):
            t = batch.get(key)
            if t is not None:
                t = torch.as_tensor(t)
                m = torch.as_tensor(batch["response_mask"]).bool()
                if not bool(torch.isfinite(t[m]).all()):
                    reasons.append(f"non-finite {key}")
        scalars = {
            k: v for k, v in dict(metrics).items() if isinstance(v, int | float | np.floating)
        }
        scalars.update({f"row/{k}": v for k, v in row.items() if isinstance(v, int | float)})
        decode = None
        if self.tokenizer is not None:
            decode = self.tokenizer.decode
        snap = self.flight.snapshot(
            step,
            batch,
            scalars,
            probe_log_probs=probe_log_probs,
            probe_rows=probe_rows,
            decode=decode,
        )
        reason = "; ".join(reasons) if reasons else None
        written = self.flight.observe(snap, reason)
        if reason is not None and written and self.monitor.writer is not None:
            self.monitor.writer.log_event(
                make_event(
                    "lifecycle",
                    step,
                    "flight_record",
                    f"flight recorder wrote steps {written} to {FLIGHT_DIR}/ ({reason})",
                    "warning",
                    {"steps": written, "reason": reason},
                )
            )

    def close(self, error: BaseException | None = None) -> None:
        """Close the run log and sinks (the control actor dies with the Ray job)."""
        self.monitor.close(error=error)

    def overhead(self) -> dict[str, float]:
        """Driver time in this class per step: mean and max seconds over the steps so far."""
        s = self.monitor_seconds
        return {"mean_s": float(np.mean(s)) if s else 0.0, "max_s": float(max(s)) if s else 0.0}


#: Values whose non-finiteness triggers the flight recorder (not the LLD columns: they are NaN
#: whenever a group is empty, e.g. no correct response in the batch).
_WATCHED: frozenset[str] = frozenset(
    {
        GRAD_NORM_KEY,
        PG_LOSS_KEY,
        LLDS_LOSS_KEY,
        "actor/kl_loss",
        "actor/entropy",
        C.GRAD_NORM,
        C.LOSS,
        C.KL,
        C.ENTROPY,
        C.LLDS_LOSS,
    }
)
