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
            if "forward" in vars(module):
                continue
            if norms.norm_form(module) is not None:
                module.forward = norms.fused_forward(module, module.forward, _guard("RMSNorm"))
            elif gated_mlp.is_gated_mlp(module):
                module.forward = gated_mlp.fused_forward(module, module.forward, _guard("gated MLP"))
            else:
                continue  # nothing of ours computes it
            swapped.append((module, module.forward))
        yield len(swapped)
    finally:
        for module, ours in swapped:
            if vars(module).get("forward") is ours:  # not another wrapper installed meanwhile
                del module.forward


def _guard(kind: str):
    """Runs a kernel's launch until a kernel of `kind` fails in this process (a Triton that cannot compile it
    on some machine): then one warning, and the fallback from that call on. Only the launch is guarded: the
    module's own work (projections, Transformers' forward) raises as it would; so does running out of
    memory."""

    def run(launch, fallback):
        if kind not in _failed:
            try:
                return launch()
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # noqa: BLE001 - a kernel that cannot compile here must not stop the job
                log.warning(
                    "%s kernel failed (%s: %s); Transformers' forward runs instead", kind, type(e).__name__, e
                )
                _failed[kind] = repr(e)
        return fallback()

    return run


def failures() -> list[str]:
    """Why a kind of kernel stopped running in this process (Transformers' forwards run then)."""
    return [f"{kind}: {why}" for kind, why in _failed.items()]
