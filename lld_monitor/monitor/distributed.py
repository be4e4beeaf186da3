"""The one module that calls ``torch.distributed``: rank, agreement and the step's gather.

Every function here is a no-op (or returns the local value) without an initialised process group
of more than one rank, so single-process runs never pay for a collective.
"""

from __future__ import annotations

from typing import Any

import torch


def process_group() -> Any | None:
    """``torch.distributed`` when initialised with more than one rank, else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def rank() -> int:
    """This process's rank (0 without a process group)."""
    dist = process_group()
    return dist.get_rank() if dist is not None else 0


def world_size() -> int:
    """Number of ranks (1 without a process group)."""
    dist = process_group()
    return dist.get_world_size() if dist is not None else 1


def collective_device(device: torch.device | None) -> torch.device:
    """Device for a collective's tensor: NCCL needs CUDA, gloo takes anything."""
    device = device or torch.device("cpu")
    dist = process_group()
    if dist is not None and dist.get_backend() == "nccl" and device.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return device


def failed_ranks(ok: bool, device: torch.device | None = None) -> list[int]:
    """Ranks whose ``ok`` was False: one small ``all_reduce`` of a [world] flag vector.

    Every rank must call it at the same point (it is a collective); all get the same list.
    """
    dist = process_group()
    if dist is None:
        return [] if ok else [0]
    flags = torch.zeros(dist.get_world_size(), dtype=torch.float32)
    flags[dist.get_rank()] = 0.0 if ok else 1.0
    flags = flags.to(collective_device(device))
    dist.all_reduce(flags, op=dist.ReduceOp.SUM)
    return [r for r, f in enumerate(flags.tolist()) if f > 0.5]


def gather_rows(vec: torch.Tensor) -> torch.Tensor:
    """[world, n]: every rank's 1-D ``vec`` (same length everywhere), one ``all_gather``."""
    dist = process_group()
    if dist is None:
        return vec.reshape(1, -1)
    parts = [torch.empty_like(vec) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, vec)
    return torch.stack(parts)
