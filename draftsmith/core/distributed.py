"""Rank, world size and device of a (possibly torchrun-launched) process; DDP wrapping."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import torch

from draftsmith.core import gpu_pool
from draftsmith.core.gpu_memory import hold_to_cap


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
    else:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    hold_to_cap(device)  # the job's GPU memory cap (`gpu_memory`)
    return rank, world, device


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DDP over this rank's GPU, or over CPU processes (gloo) when there is none."""
    ids = None if device.type == "cpu" else [device.index]
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def launch(module: str, argv: list[str], gpus: int, body: Callable[[], object]) -> int:
    """Runs `body` on `gpus` devices from the pool: with two or more, re-runs `module` under torchrun on them
    (one process per GPU); inside torchrun, or with one device or none, in place."""
    if os.environ.get("DRAFTSMITH_DISTRIBUTED") == "1":
        body()
        return 0

    with gpu_pool.acquire(gpus) as devices:
        if len(devices) >= 2:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={len(devices)}",
                "-m",
                module,
                *argv,
            ]
            return subprocess.call(cmd, env=dict(os.environ, DRAFTSMITH_DISTRIBUTED="1"))
        if gpus > 1:
            print(f"train.gpus={gpus} but the pool gave {devices}: running in one process", file=sys.stderr)
        body()
    return 0
