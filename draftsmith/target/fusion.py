"""Which of a target's modules run as one Triton kernel each, and the switch that swaps those kernels in.

Two kinds, each in its own file: the RMSNorms (target.norms) and the gated MLP's SiLU and product
(target.gated_mlp). The engine's prefill and decode steps and the extraction forward run them on a GPU;
validation's reference recomputation keeps Transformers' forwards, so every shard checks the kernels too.
A call a kernel cannot compute as the module would goes to the module's own forward; a kind of kernel that
fails to run hands every later call to it, with one warning. `DRAFTSMITH_LAYER_KERNELS=0` in the environment
turns both off in every job (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch
from torch import nn

from draftsmith.target import gated_mlp, norms

OFF_ENV = "DRAFTSMITH_LAYER_KERNELS"
log = logging.getLogger(__name__)
_failed: dict[str, str] = {}  # kind of kernel -> why it could not run in this process


def kernel_modules(model: nn.Module) -> list[nn.Module]:
    """Every module of `model` that `fused_modules` can swap: not those whose forward someone else wrapped
    already (accelerate's hooks on a model spread over GPUs), which keep that forward; none where
    DRAFTSMITH_LAYER_KERNELS=0."""
    if os.environ.get(OFF_ENV) == "0":
        return []
    return [
        m
        for m in model.modules()
        if "forward" not in vars(m) and (norms.norm_form(m) is not None or gated_mlp.is_gated_mlp(m))
    ]


@contextlib.contextmanager
def fused_modules(modules: list[nn.Module] | None) -> Iterator[int]:
    """While active, each module of `modules` runs its kernel on CUDA tensors (and on CPU tensors where Triton
    runs interpreted, TRITON_INTERPRET=1 as Triton was imported: the tests); yields how many were swapped."""
    swapped = []
    try:
        for module in modules or ():
            if "forward" not in vars(module):
                is_norm = norms.norm_form(module) is not None
                kind, make = (
                    ("RMSNorm", norms.fused_forward) if is_norm else ("gated MLP", gated_mlp.fused_forward)
                )
                module.forward = _guarded(kind, make(module, module.forward), module.forward)
                swapped.append((module, module.forward))
        yield len(swapped)
    finally:
        for module, ours in swapped:
            if vars(module).get("forward") is ours:  # not another wrapper installed meanwhile
                del module.forward


def _guarded(kind: str, ours, original):
    """`ours`, until a kernel of `kind` fails in this process (a Triton that cannot compile it on some
    machine): then one warning, and `original` from that call on. Out of memory is the caller's to handle."""

    def forward(*args, **kwargs):
        if kind not in _failed:
            try:
                return ours(*args, **kwargs)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # noqa: BLE001 - a kernel that cannot compile here must not stop the job
                log.warning(
                    "%s kernel failed (%s: %s); Transformers' forward runs instead", kind, type(e).__name__, e
                )
                _failed[kind] = repr(e)
        return original(*args, **kwargs)

    return forward


def failures() -> list[str]:
    """Why a kind of kernel stopped running in this process (Transformers' forwards run then)."""
    return [f"{kind}: {why}" for kind, why in _failed.items()]
