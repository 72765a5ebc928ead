"""What every step sets up: one log per job, its share of CPU threads, JSON arguments, the compute dtype,
device syncs, and memory formats that pickle by a name every process can import."""

from __future__ import annotations

import copyreg
import os
import sys

import torch

from draftsmith.core.logs import exit_now, json_arg, setup_logging  # noqa: F401 (re-exported)

COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"


def memory_format(name: str) -> torch.memory_format:
    """`torch.<name>`: what a pickled memory format names, so that it loads in any process."""
    return getattr(torch, name)


def _reduce_memory_format(fmt: torch.memory_format):
    return memory_format, (str(fmt).removeprefix("torch."),)


# A memory format pickles as the dotted name "torch.contiguous_format" under whichever module pickle finds
# holding `torch`, and failing that under `__main__`. Inductor's compile cache pickles them in its entries: on
# the H200 each round's training job (`python -m draftsmith.steps.train_round`, a `__main__` without `torch`)
# could not load the entry and compiled again. Pickled through here, the entry names this module instead.
copyreg.pickle(torch.memory_format, _reduce_memory_format)


def set_threads(threads: int | None) -> None:
    """Jobs share the machine: each uses only the threads Snakemake gave it, for its own ops and for the
    workers Inductor compiles with. Those are one a core of the whole machine by default, each a process that
    imports torch, started by a job's first `torch.compile` even when the compile cache answers it: with
    eight jobs on a node, eight such pools. `TORCHINDUCTOR_COMPILE_THREADS`, when set, wins."""
    if threads:
        torch.set_num_threads(threads)
        os.environ.setdefault(COMPILE_THREADS_ENV, str(threads))
        inductor = sys.modules.get("torch._inductor.config")  # read once, as it is imported: set it too
        if inductor is not None:
            inductor.compile_threads = int(os.environ[COMPILE_THREADS_ENV])  # type: ignore[attr-defined]


def cpu_computes_bf16() -> bool:
    """AVX512-BF16 or AMX: the CPU multiplies bf16 natively (elsewhere bf16 is emulated, slower than fp32)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_dtype(name: str | None, device: torch.device, *, exact: bool = False) -> torch.dtype:
    """A config's dtype name. `auto` is bf16 on a GPU, and on a CPU that computes it natively, for the steps
    whose results are checked with a tolerance (extraction, regeneration, training); `exact` steps (the
    bench's losslessness check) keep fp32 on the CPU."""
    if name in ("auto", None):
        if device.type == "cuda" or (cpu_computes_bf16() and not exact):
            return torch.bfloat16
        return torch.float32
    return {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }[name]


def sync_device(device: torch.device) -> None:
    """Waits for the device's queued work (a no-op on the CPU): timers read wall time only after it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
