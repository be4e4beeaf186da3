"""Adapters: the only modules that import a trainer (trl, transformers, verl)."""

from __future__ import annotations

from typing import Any


def adapter_for(monitor: Any, trainer: Any) -> Any:
    """The adapter for ``trainer``: TRL ``GRPOTrainer`` (full), transformers ``Trainer``.

    ValueError for any other object (a hand-written loop calls the monitor's plain methods).
    """
    try:
        from trl import GRPOTrainer
    except ImportError:
        GRPOTrainer = None
    if GRPOTrainer is not None and isinstance(trainer, GRPOTrainer):
        from lld_monitor.integrations.trl import GRPOAdapter

        return GRPOAdapter(monitor, trainer)
    from transformers import Trainer

    if not isinstance(trainer, Trainer):
        kind = type(trainer).__module__ + "." + type(trainer).__qualname__
        raise ValueError(
            f"attach() needs a trl.GRPOTrainer or a transformers.Trainer, got {kind}; "
            "for a hand-written loop call observe_rollout/observe_update/end_step instead"
        )
    from lld_monitor.integrations.transformers import TrainerAdapter

    return TrainerAdapter(monitor, trainer)
