"""Distributed set-up: join the process group `torchrun` describes (chapter 10's multi-GPU runs)."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..utils.gpu import dist_plan, local_world_size


def setup_distributed(device: torch.device | str | None = None) -> tuple[int, int, int]:
    """Join the process group `torchrun` describes (WORLD_SIZE > 1) and return (rank, world, local_rank).

    The backend follows the run's `device` ("cpu", "cuda"; None = cuda when a GPU is present): gloo for a
    CPU run (even on a machine with a GPU), NCCL with one GPU per rank for a CUDA run, which is refused at
    start when this machine runs more ranks than it has GPUs (`tformer.utils.gpu.dist_plan`). Without torchrun
    (or when the group already exists) nothing new is started.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    local = int(os.environ.get("LOCAL_RANK", 0))
    plan = dist_plan(device, local, local_world_size())
    if plan.device.type == "cuda":
        torch.cuda.set_device(plan.device)
    dist.init_process_group(plan.backend)
    return dist.get_rank(), dist.get_world_size(), local


def is_distributed() -> bool:
    """Whether this process is one rank of a running process group of more than one (torchrun)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
