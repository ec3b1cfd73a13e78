"""torch.distributed helpers: who am I, wait for the others, agree on a value.

Processes are started by torchrun (never by us): it sets RANK, LOCAL_RANK and WORLD_SIZE.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

LOGGER = logging.getLogger(__name__)


def de_parallel(model: nn.Module) -> nn.Module:
    """The bare model inside a DDP/DataParallel wrapper."""
    return model.module if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)) else model


@dataclass(frozen=True)
class DistInfo:
    rank: int = -1  # -1: not distributed
    local_rank: int = -1
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank in (-1, 0)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def dist_info() -> DistInfo:
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world <= 1:
        return DistInfo()
    return DistInfo(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), world)


def init_process_group(info: DistInfo, device: torch.device) -> None:
    """NCCL on CUDA, Gloo on CPU."""
    if info.distributed and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def broadcast_flag(value: bool, device: torch.device) -> bool:
    """Rank 0's value of a boolean, on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([int(value)], device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def destroy() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def wrap_ddp(model: nn.Module, info: DistInfo, device: torch.device, sync_bn: bool) -> nn.Module:
    """The model as DDP trains it (unchanged without DDP); --sync-bn converts BatchNorm on CUDA only."""
    if not info.distributed:
        return model
    if sync_bn and device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    elif sync_bn:
        LOGGER.warning("--sync-bn needs CUDA (SyncBatchNorm has no CPU kernel); each process keeps its own BN statistics")
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
