"""verl adapter: the LLDS policy loss and LLD metrics through verl's policy-loss registry.

Importing this module registers the policy loss ``"llds"`` in
``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``. It computes verl's own policy loss (the
``base_loss_mode``, ``"vanilla"`` by default) and adds ``lambda * L_LLDS`` from the tensors verl
passes; actions are the runs of ``response_mask`` (verl masks tool observations out of it). Its
settings live in the actor's ``policy_loss`` section through :class:`LLDSPolicyLossConfig`
(``actor_rollout_ref.actor.policy_loss._target_=lld_monitor.integrations.verl.LLDSPolicyLossConfig``):
instantiating that ``_target_`` imports this module in every verl worker, which registers the loss.
See docs/verl.md. This module and ``verl_trainer`` are the only ones of the package that
import verl.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from lld_monitor import columns as C
from lld_monitor.llds import LLDSConfig, llds_loss
from lld_monitor.metrics import (
    displacement_sums,
    last_action_mask,
    stats_from_sums,
)
from lld_monitor.metrics import tool_rounds as _tool_rounds

#: verl releases this adapter is tested with (``major.minor``); others raise at import.
TESTED_VERL_SERIES: tuple[str, ...] = ("0.9",)
#: Name under which the loss is registered: ``actor_rollout_ref.actor.policy_loss.loss_mode=llds``.
LOSS_NAME = "llds"
#: Prefix of every metric this loss adds to verl's metric dict (verl's trainer then prefixes
#: ``actor/``, so trackers show ``actor/lld/<column>``).
METRIC_PREFIX = "lld/"
#: Prefix of the displacement columns the loss measures (``lld/loss_call/delta_correct``, ...):
#: ``log_prob - old_log_prob`` at the policy-loss call, i.e. what the earlier mini-batches and
#: epochs of this rollout batch did, not the post-update probe's ``delta_*`` (the policy after the
#: batch's last update, written by the driver-side monitor). Importers do not map these names.
LOSS_CALL_PREFIX = METRIC_PREFIX + "loss_call/"
#: Extra metrics beyond the canonical columns (``lld/`` + these).
METRIC_LLDS_N_GATED = "llds_n_gated"  # gated actions/responses/tokens in the micro-batch
METRIC_LLDS_ANSWER_WEIGHT = "llds_answer_weight"  # beta in force (1.0 without answer weighting)
METRIC_LLDS_SCALE = "llds_scale"  # micro-batch -> global mini-batch weight applied to L_LLDS
METRIC_LLDS_CONTROL_VERSION = "llds_control_version"  # the driver control's state used (or -1)

_LOG = logging.getLogger(__name__)


def _version_tuple(version: str) -> tuple[str, ...]:
    """``"0.9.1"`` -> ``("0", "9")``: the release series of a version string."""
    return tuple(version.split("+")[0].split(".")[:2])


def check_verl_version(version: str) -> None:
    """Raise ImportError unless ``version`` is in :data:`TESTED_VERL_SERIES`."""
    series = ".".join(_version_tuple(version))
    if series not in TESTED_VERL_SERIES:
        raise ImportError(
            f"lld_monitor.integrations.verl is tested with verl {', '.join(TESTED_VERL_SERIES)}.x "
            f"and found verl {version}: its policy-loss and metric internals may differ. Install "
            "a tested release (pip install 'lld_monitor[verl]', which pins verl==0.9.1)."
        )


try:
    import verl
except ImportError as exc:  # pragma: no cover - exercised only without verl installed
    raise ImportError(
        "lld_monitor.integrations.verl needs verl: pip install 'lld_monitor[verl]' (verl==0.9.1)"
    ) from exc

check_verl_version(verl.__version__)

from verl.trainer.ppo import core_algos  # noqa: E402  (after the version check on purpose)
from verl.workers.config import PolicyLossConfig  # noqa: E402

TRL_COMPAT_MODULE = "trl.experimental.ppo"


def ensure_trl_compat() -> bool:
    """Let verl 0.9.x's FSDP engine build a model when trl >= 1 is installed; True if patched.

    verl's ``apply_monkey_patch`` imports ``AutoModelForCausalLMWithValueHead`` from
    ``trl.experimental.ppo`` or ``trl`` whenever trl is importable (it only replaces that class's
    ``state_dict``); trl 1.x (lld_monitor pins 1.16) has neither, so the actor crashes at model
    build. This registers a stand-in module holding an empty class, and logs it.
    """
    import importlib
    import importlib.util
    import sys
    import types

    if importlib.util.find_spec("trl") is None or TRL_COMPAT_MODULE in sys.modules:
        return False
    import warnings

    for name in (TRL_COMPAT_MODULE, "trl"):
        try:
            with warnings.catch_warnings():  # trl warns on any trl.experimental import
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
            getattr(module, "AutoModelForCausalLMWithValueHead")  # noqa: B009 (lazy trl attrs)
            return False
        except (ImportError, AttributeError):
            continue
    stand_in = types.ModuleType(TRL_COMPAT_MODULE)
    stand_in.__doc__ = "lld_monitor stand-in: verl 0.9.x imports this class from trl < 1."
    stand_in.AutoModelForCausalLMWithValueHead = type(
        "AutoModelForCausalLMWithValueHead", (torch.nn.Module,), {}
    )
    sys.modules[TRL_COMPAT_MODULE] = stand_in
    _LOG.warning(
        "lld_monitor: installed trl has no AutoModelForCausalLMWithValueHead, which verl %s's "
        "FSDP engine imports; registered a stand-in %s (verl only patches its state_dict)",
        verl.__version__,
        TRL_COMPAT_MODULE,
    )
    return True


ensure_trl_compat()

__all__ = [
    "LOSS_CALL_PREFIX",
    "LOSS_NAME",
    "METRIC_PREFIX",
    "TESTED_VERL_SERIES",
    "TRL_COMPAT_MODULE",
    "LLDSPolicyLossConfig",
    "LLDSVerlSettings",
    "apply_control",
    "check_verl_version",
    "compute_policy_loss_llds",
    "configure",
    "ensure_trl_compat",
    "last_action_mask",
    "metric_name",
    "read_control",
    "reset_metric_state",
    "settings_from_config",
]


def metric_name(column: str) -> str:
    """The key a column gets in verl's metric dict: ``"lld/" + column``; the displacement
    columns (``columns.DISPLACEMENT_COLUMNS``) get ``"lld/loss_call/" + column``."""
    if column in C.DISPLACEMENT_COLUMNS:
        return LOSS_CALL_PREFIX + column
    return METRIC_PREFIX + column


# --- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LLDSVerlSettings:
    """The llds loss mode's settings: the base verl loss plus an :class:`LLDSConfig`.

    ``answer_span="last_action"`` marks the last run of ``response_mask`` as the answer span for
    answer weighting; the number of tool rounds (actions - 1) stands for the valid searches.
    """

    base_loss_mode: str = "vanilla"
    llds: LLDSConfig = field(default_factory=LLDSConfig)
    answer_span: str = "last_action"

    def __post_init__(self) -> None:
        if not isinstance(self.base_loss_mode, str) or self.base_loss_mode == LOSS_NAME:
            raise ValueError(
                f"base_loss_mode must name another verl policy loss (e.g. 'vanilla'), got "
                f"{self.base_loss_mode!r}"
            )
        if self.answer_span != "last_action":
            raise ValueError(f"answer_span must be 'last_action', got {self.answer_span!r}")


@dataclass
class LLDSPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus the LLDS keys (a verl ``BaseConfig``: mutable dataclass).

    Select it with ``actor_rollout_ref.actor.policy_loss._target_=`` this class and set the keys
    with ``+actor_rollout_ref.actor.policy_loss.<key>=...``. ``llds_answer_weighting``: ``None``,
    ``"paper"``, ``"code"`` or a fixed beta written as a number.
    """

    loss_mode: str = LOSS_NAME
    base_loss_mode: str = "vanilla"
    llds_enabled: bool = True
    llds_lambda: float = 0.2
    llds_gate: str = "action"
    llds_normalize: str = "paper"
    # Optional[...], not `str | None`: OmegaConf's structured configs read the annotation
    llds_answer_weighting: Optional[str] = None  # noqa: UP045
    # name of the driver's LLDS control (a named Ray actor, lld_monitor.integrations.verl_live):
    # when set, its on/off and lambda override llds_enabled / llds_lambda at every loss call
    llds_control: Optional[str] = None  # noqa: UP045

    def __post_init__(self) -> None:
        settings_from_config(self)  # validate early, with our messages


_default_settings = LLDSVerlSettings()


def configure(settings: LLDSVerlSettings | None = None) -> LLDSVerlSettings:
    """Set the process-wide fallback used when the policy_loss section has no LLDS keys.

    Reaches only the current process: under Ray use :class:`LLDSPolicyLossConfig` instead.
    ``None`` restores the defaults. Returns the settings now in force.
    """
    global _default_settings
    if settings is None:
        settings = LLDSVerlSettings()
    if not isinstance(settings, LLDSVerlSettings):
        raise ValueError(f"configure() takes an LLDSVerlSettings, got {type(settings).__name__}")
    _default_settings = settings
    return settings


def _parse_answer_weighting(value: Any) -> str | float | None:
    """``None``/``"none"``/``"paper"``/``"code"`` or a number (possibly a string) -> LLDSConfig."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "none", "null"):
            return None
        if text in ("paper", "code"):
            return text
        try:
            return float(text)
        except ValueError:
            raise ValueError(
                "llds_answer_weighting must be null, 'paper', 'code' or a number (fixed beta), "
                f"got {value!r}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"llds_answer_weighting must be null, 'paper', 'code' or a number, got {value!r}"
        )
    return float(value)


def _get(section: Any, key: str) -> Any:
    """``section.key`` for dataclass, DictConfig or dict sections; ``_MISSING`` when absent."""
    if section is None:
        return _MISSING
    if isinstance(section, Mapping) or hasattr(section, "get"):
        try:
            value = section.get(key, _MISSING)
        except (KeyError, AttributeError):
            return _MISSING
        return value
    return getattr(section, key, _MISSING)


_MISSING = object()
_KEYS = (
    "base_loss_mode",
    "llds_enabled",
    "llds_lambda",
    "llds_gate",
    "llds_normalize",
    "llds_answer_weighting",
)


def settings_from_config(config: Any) -> LLDSVerlSettings:
    """The LLDS settings for a policy-loss call: keys of ``config`` (a policy_loss section or an
    actor config holding one) win; missing keys come from :func:`configure`'s settings.
    """
    section = config
    policy_loss = _get(config, "policy_loss")
    if policy_loss is not _MISSING and policy_loss is not None:
        section = policy_loss
    found = {key: _get(section, key) for key in _KEYS}
    base = _default_settings
    if all(v is _MISSING for v in found.values()):
        return base

    def pick(key: str, default: Any) -> Any:
        value = found[key]
        return default if value is _MISSING else value

    lam = pick("llds_lambda", base.llds.lam)
    if isinstance(lam, int) and not isinstance(lam, bool):
        lam = float(lam)
    enabled = pick("llds_enabled", base.llds.enabled)
    answer = pick("llds_answer_weighting", base.llds.answer_weighting)
    try:
        llds = LLDSConfig(
            lam=lam,
            gate=pick("llds_gate", base.llds.gate),
            normalize=pick("llds_normalize", base.llds.normalize),
            answer_weighting=_parse_answer_weighting(answer),
            enabled=bool(enabled) if isinstance(enabled, bool | int) else enabled,
        )
    except ValueError as exc:  # LLDSConfig names its own fields (gate); name the verl keys
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss: {exc} (verl keys: llds_lambda, llds_gate, "
            "llds_normalize, llds_answer_weighting, llds_enabled)"
        ) from exc
    return LLDSVerlSettings(
        base_loss_mode=pick("base_loss_mode", base.base_loss_mode),
        llds=llds,
        answer_span=base.answer_span,
    )


# --- tensors ------------------------------------------------------------------------------------


def _response_advantage(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B]: masked mean of verl's token-level advantages (constant per response in GRPO)."""
    if advantages.dim() == 1:
        return advantages
    m = mask.to(advantages.dtype)  # [B, L]
    return (advantages * m).sum(1) / m.sum(1).clamp(min=1)  # [B]


def _global_scale(normalize: str, mask: torch.Tensor, config: Any) -> torch.Tensor | float:
    """Weight turning a micro-batch L_LLDS into its share of the mini-batch L_LLDS.

    verl sums the micro-batch losses of a mini-batch (no division) and FSDP averages the ranks, so
    its pg loss is pre-scaled by ``global_batch_info``; LLDS follows: token_mean by
    ``tokens / batch_num_tokens * dp_size``, paper by ``rows / global_batch_size * dp_size``.
    """
    info = _get(config, "global_batch_info")
    info = info if isinstance(info, Mapping) else {}
    dp_size = int(info.get("dp_size") or 1)
    if normalize == "token_mean":
        total = info.get("batch_num_tokens")
        if total is None:
            if dp_size > 1:
                raise ValueError("global_batch_info['batch_num_tokens'] is needed when dp_size > 1")
            return 1.0
        local = (mask != 0).sum().to(torch.float32)
        return local / float(total) * dp_size
    total = info.get("global_batch_size")
    if total is None:
        if dp_size > 1:
            raise ValueError("global_batch_info['global_batch_size'] is needed when dp_size > 1")
        return 1.0
    return mask.shape[0] / float(total) * dp_size


# --- metrics ------------------------------------------------------------------------------------


class _MiniBatchPool:
    """Pools the LLD sums of one mini-batch's micro-batches on this rank (exact group ratios).

    verl averages a key's per-micro-batch values; the pooled statistic of a mini-batch is emitted
    on its last micro-batch, scaled by the number of micro-batches, and 0 on the others, so verl's
    mean equals it and no micro-batch without correct responses turns the step into NaN.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget any partial mini-batch."""
        self._sums: torch.Tensor | None = None
        self._rows = 0
        self._calls = 0

    def add(self, sums: torch.Tensor, rows: int, expected_rows: int | None) -> dict[str, float]:
        """Add a micro-batch's sums [K]; return the values to emit for the LLD columns."""
        with self._lock:
            if expected_rows is None or expected_rows <= 0:
                self.reset()
                return stats_from_sums(sums).as_row()
            if self._sums is not None and self._rows + rows > expected_rows:
                _LOG.warning(
                    "lld_monitor: micro-batch rows overran the mini-batch size (%d + %d > %d); "
                    "dropping the partial LLD metric pool",
                    self._rows,
                    rows,
                    expected_rows,
                )
                self.reset()
            s = sums.detach().to("cpu", torch.float64)
            self._sums = s if self._sums is None else self._sums + s
            self._rows += rows
            self._calls += 1
            if self._rows < expected_rows:
                return dict.fromkeys(C.LLD_COLUMNS, 0.0)
            row = stats_from_sums(self._sums).as_row()
            calls = self._calls
            self.reset()
            return {k: v * calls for k, v in row.items()}


_POOL = _MiniBatchPool()


def reset_metric_state() -> None:
    """Drop the partial mini-batch pool (tests; after an interrupted update)."""
    _POOL.reset()


def _expected_rows(config: Any) -> int | None:
    """Rows of the current mini-batch on this rank, from verl's global_batch_info; None if unset."""
    info = _get(config, "global_batch_info")
    if not isinstance(info, Mapping):
        return None
    total, dp_size = info.get("global_batch_size"), int(info.get("dp_size") or 1)
    if total is None:
        return None
    return int(total) // dp_size


# --- the driver's runtime switch ---------------------------------------------------------------

_CONTROL_LOCK = threading.Lock()
_CONTROL_HANDLES: dict[str, Any] = {}
_CONTROL_WARNED: set[str] = set()


def read_control(name: str) -> dict[str, Any]:
    """The state of the named LLDS control (a Ray actor created by the driver's monitor).

    One actor call per loss call: the driver sets the state before it starts an update, so the
    whole update sees the same state. Raises when Ray is not initialised or no such actor exists.
    """
    import ray

    with _CONTROL_LOCK:
        handle = _CONTROL_HANDLES.get(name)
        if handle is None:
            if not ray.is_initialized():
                raise RuntimeError("Ray is not initialised in this process")
            handle = _CONTROL_HANDLES[name] = ray.get_actor(name)
    return ray.get(handle.get.remote(), timeout=60)


def apply_control(settings: LLDSVerlSettings, name: str) -> tuple[LLDSVerlSettings, int]:
    """``settings`` with the control's on/off and lambda, and the control's version.

    When the control cannot be read, the config's settings stay in force (logged once per name):
    the monitor never stops a training run.
    """
    try:
        state = read_control(name)
        llds = LLDSConfig(
            lam=float(state["lam"]),
            gate=settings.llds.gate,
            normalize=settings.llds.normalize,
            answer_weighting=settings.llds.answer_weighting,
            enabled=bool(state["enabled"]),
        )
    except Exception as err:
        if name not in _CONTROL_WARNED:
            _CONTROL_WARNED.add(name)
            _LOG.warning(
                "lld_monitor: cannot read the LLDS control %r (%s: %s); the policy_loss "
                "section's llds_enabled / llds_lambda stay in force",
                name,
                type(err).__name__,
                err,
            )
        with _CONTROL_LOCK:
            _CONTROL_HANDLES.pop(name, None)
        return settings, -1
    out = LLDSVerlSettings(
        base_loss_mode=settings.base_loss_mode, llds=llds, answer_span=settings.answer_span
    )
    return out, int(state["version"])


# --- the loss -----------------------------------------------------------------------------------


@core_algos.register_policy_loss(LOSS_NAME)
def compute_policy_loss_llds(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's base policy loss + ``lambda * L_LLDS`` and the LLD metrics of the micro-batch.

    All tensors [B, L] over response tokens (``response_mask`` 1 on generated tokens). Returns the
    loss scalar and verl's metrics plus ``lld/<column>`` entries (floats, averaged by verl).
    """
    settings = settings_from_config(config)
    control = _get(config, "policy_loss")
    control = _get(control if control not in (_MISSING, None) else config, "llds_control")
    version = -1
    if control not in (_MISSING, None, ""):
        settings, version = apply_control(settings, str(control))
    base_fn = core_algos.get_policy_loss_fn(settings.base_loss_mode)
    pg_loss, metrics = base_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
    metrics = dict(metrics)
    mask = response_mask.bool()  # [B, L]
    cfg = settings.llds
    with torch.no_grad():
        adv = _response_advantage(advantages.detach(), mask)  # [B]
        sums = displacement_sums(
            logp_old=old_log_prob.detach(), logp_new=log_prob.detach(), mask=mask, correct=adv > 0
        )
    for column, value in _POOL.add(sums, mask.shape[0], _expected_rows(config)).items():
        metrics[metric_name(column)] = value

    active = cfg.enabled and cfg.lam > 0
    metrics[metric_name(C.LLDS_ENABLED)] = 1.0 if active else 0.0
    metrics[metric_name(C.LLDS_LAMBDA)] = float(cfg.lam) if active else 0.0
    if version >= 0:
        metrics[metric_name(METRIC_LLDS_CONTROL_VERSION)] = float(version)
    if not active:
        return pg_loss, metrics

    answer_mask, beta = None, 1.0
    if cfg.answer_weighting is not None:
        answer_mask = last_action_mask(mask)  # [B, L]
        beta = cfg.answer_weight(float(_tool_rounds(mask).mean()))
    out = llds_loss(
        logp_new=log_prob,
        logp_old=old_log_prob,
        advantages=adv,
        mask=mask,
        gate=cfg.gate,
        answer_mask=answer_mask,
        answer_weight=beta,
        normalize=cfg.normalize,
    )
    scale = _global_scale(cfg.normalize, mask, config)
    loss = pg_loss + cfg.lam * scale * out.loss
    metrics[metric_name(C.LLDS_LOSS)] = float(out.loss.detach())
    metrics[metric_name(C.LLDS_FRAC_GATED)] = float(out.frac_gated)
    metrics[metric_name(METRIC_LLDS_N_GATED)] = float(out.n_gated)
    metrics[metric_name(METRIC_LLDS_ANSWER_WEIGHT)] = float(beta)
    metrics[metric_name(METRIC_LLDS_SCALE)] = float(scale)
    if not math.isfinite(metrics[metric_name(C.LLDS_LOSS)]):
        _LOG.warning("lld_monitor: L_LLDS is not finite in this micro-batch (%s)", out.loss)
    return loss, metrics
