"""The GPU memory a job may use.

By default a job may use the whole device, or its share where DRAFTSMITH_GPUS lists the device several times.
The config's `gpu_memory` (which the workflow hands to every job as DRAFTSMITH_GPU_MEMORY) caps it: on a 96 GB
card whose context and fragmentation need room, on a GPU shared with other work, on a MIG slice. Every GPU job
sizes itself from `job_memory` (regeneration's slots, extraction's token budget, the probe's placement),
and `hold_to_cap` makes PyTorch's allocator refuse to go past the cap, so a job that would exceed it fails
in itself with an out-of-memory error rather than starving a neighbour. Memory allocated outside PyTorch
(the CUDA context, some kernels' workspaces) comes on top of the cap.
"""

from __future__ import annotations

import os

from draftsmith.core.gpu_pool import slots_sharing
from draftsmith.core.units import parse_size

ENV = "DRAFTSMITH_GPU_MEMORY"
KEY = "gpu_memory"


def memory_cap() -> int | None:
    """The cap in bytes from DRAFTSMITH_GPU_MEMORY (`96GB`, `90GiB`, bytes), None when unset."""
    text = os.environ.get(ENV, "").strip()
    if text.lower() in ("", "none", "null"):
        return None
    return parse_size(text, key=ENV)


def cap_setting(setting: str | int | None) -> str | None:
    """The config's `gpu_memory` as the bytes DRAFTSMITH_GPU_MEMORY carries to the jobs (None: no cap from the
    config); a value that is not a size stops the parse naming the key."""
    if setting is None:
        return None
    size = parse_size(setting, key=KEY)
    if size <= 0:
        raise ValueError(f"{KEY}: {setting!r} must be a positive size such as `90GB`, or null for no cap")
    return str(size)


def device_limit(cuda_index: int, total: int) -> int:
    """What a job may use of a device of `total` bytes: its share of it, and at most the cap."""
    limit = total // slots_sharing(cuda_index)
    cap = memory_cap()
    return min(limit, cap) if cap else limit


def job_memory(device) -> tuple[int, int]:
    """(free, limit) in bytes for this job on a CUDA `device`: the limit as `device_limit`, free what is left
    of it beside what this process already holds, and never more than the device has free."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    limit = device_limit(device.index or 0, total)
    return max(0, min(free, limit - torch.cuda.memory_reserved(device))), limit


def hold_to_cap(device) -> None:
    """Holds PyTorch's allocator on a CUDA `device` to the cap (nothing to do without one, or on the CPU)."""
    import torch

    cap = memory_cap()
    if cap is None or getattr(device, "type", "cpu") != "cuda":
        return
    _, total = torch.cuda.mem_get_info(device)
    if cap < total:
        torch.cuda.set_per_process_memory_fraction(cap / total, device)


def max_memory_map(devices: int) -> dict[int, int] | None:
    """`max_memory` for Transformers' device_map over a group of `devices` GPUs under the cap, else None."""
    cap = memory_cap()
    return {i: cap for i in range(devices)} if cap else None
