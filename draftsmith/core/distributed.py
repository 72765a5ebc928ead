"""Rank, world size and device of a (possibly torchrun-launched) process; DDP wrapping."""

from __future__ import annotations

import os

import torch


def dist_info() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) when run directly."""
    return (
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
    )


def setup_device() -> tuple[int, int, torch.device]:
    """Rank, world size and this process's device: one GPU per rank under torchrun (NCCL), else GPU 0 or CPU.

    Without GPUs, torchrun ranks run on the CPU over gloo: the same DDP code path, testable anywhere."""
    rank, world, local = dist_info()
    if world > 1 and not torch.cuda.is_available():
        torch.distributed.init_process_group("gloo")
        return rank, world, torch.device("cpu")
    if world > 1:
        torch.distributed.init_process_group("nccl")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        return rank, world, device
    return rank, world, torch.device("cuda" if torch.cuda.is_available() else "cpu")


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DDP over this rank's GPU, or over CPU processes (gloo) when there is none."""
    ids = None if device.type == "cpu" else [device.index]
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
