"""Which of a target's modules run as one Triton kernel each, and the switch that swaps those kernels in.

Two kinds, each in its own file: the RMSNorms (target.norms) and the gated MLP's SiLU and product
(target.gated_mlp). The engine's prefill and decode steps and the extraction forward run them on a GPU;
validation's reference recomputation keeps Transformers' forwards, so every shard checks the kernels too.
`DRAFTSMITH_LAYER_KERNELS=0` in the environment turns both off in every job (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from torch import nn

from draftsmith.target import gated_mlp, norms

OFF_ENV = "DRAFTSMITH_LAYER_KERNELS"


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
                make = norms.fused_forward if norms.norm_form(module) is not None else gated_mlp.fused_forward
                module.forward = make(module, module.forward)
                swapped.append((module, module.forward))
        yield len(swapped)
    finally:
        for module, ours in swapped:
            if vars(module).get("forward") is ours:  # not another wrapper installed meanwhile
                del module.forward


def failures() -> list[str]:
    """Why a kind of kernel stopped running in this process (Transformers' forwards run then)."""
    return [
        f"{kind}: {why}"
        for kind, why in (("norms", norms.failure()), ("gated MLP", gated_mlp.failure()))
        if why
    ]
