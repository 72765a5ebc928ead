"""The gated MLP's SiLU and product as one Triton kernel, where Transformers runs two.

Llama-family MLPs compute `down_proj(silu(gate_proj(x)) * up_proj(x))`: torch runs the SiLU as one kernel (a
read and a write of [tokens, intermediate]) and the product as another (two reads and a write), the largest
element-wise passes of a prefill after the norms. `fused_forward` computes the same product in one pass,
written over the gate projection's output (a temporary: no new [tokens, intermediate] buffer), and rounds
where torch rounds: the SiLU to the input's dtype, then the product. The kernel's exp is the GPU's fast one
where torch's is the accurate one, so a bf16 result seldom moves by one rounding step.

A module qualifies by what its class's forward says, not by its name: the forward must be exactly
Transformers' one-line gated product with a SiLU activation; anything else keeps its own forward.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from typing import Any

import torch
from torch import nn

_GATED_PRODUCT = "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))"
_BLOCK = 2048  # elements a program takes
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.cache
def _forward_is_gated_product(cls: Any) -> bool:
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):  # a class defined where its source cannot be read
        return False
    code = [line.strip() for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not code or not re.fullmatch(r"def forward\(self, x(: [\w.]+)?\)( -> [\w.]+)?:", code[0]):
        return False  # decorated, or another signature
    body = code[1:]
    if len(body) == 1:
        return body[0] == f"return {_GATED_PRODUCT}"
    name = body[0].split(" = ", 1)[0]
    return len(body) == 2 and body[0] == f"{name} = {_GATED_PRODUCT}" and body[1] == f"return {name}"


def _silu_forwards() -> tuple:
    from transformers.activations import SiLUActivation

    return (nn.SiLU.forward, SiLUActivation.forward)


def is_gated_mlp(module: nn.Module) -> bool:
    """Whether `module` is a SiLU-gated MLP whose forward this file can run: the activation's own forward
    (the class's, not the name's) must be torch's or Transformers' SiLU."""
    parts = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    act = getattr(module, "act_fn", None)
    return (
        all(isinstance(p, nn.Linear) for p in parts)
        and isinstance(act, nn.Module)
        and type(act).forward in _silu_forwards()
        and "forward" not in vars(act)
        and _forward_is_gated_product(type(module))  # type: ignore[arg-type]  # classes hash
    )


def fused_forward(module: nn.Module, original, guard):
    """A forward for `module` (chosen by `is_gated_mlp`) that runs the SiLU and product as one kernel where it
    computes what `original` would, and `original` elsewhere. `guard(launch, fallback)` runs the launch, or
    the fallback once the kernel has failed in this process (target.fusion)."""
    gate_proj, up_proj, down_proj, act = module.gate_proj, module.up_proj, module.down_proj, module.act_fn
    assert isinstance(gate_proj, nn.Linear) and isinstance(up_proj, nn.Linear)  # is_gated_mlp chose it
    assert isinstance(act, nn.Module)

    def forward(*args, **kwargs) -> torch.Tensor:
        x = args[0] if len(args) == 1 and not kwargs else None
        if x is None or not _fits(x, gate_proj.weight) or _hooked(act):
            return original(*args, **kwargs)
        gate, up = gate_proj(x), up_proj(x)  # [..., intermediate] each
        if (torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad)) or not _launchable(
            gate, up
        ):
            return down_proj(act(gate) * up)  # autograd follows torch's kernels, not ours
        out = None if _hooked(gate_proj) else gate  # a hook may keep the projection's output: leave it be
        return down_proj(guard(lambda: silu_mul(gate, up, out=out), lambda: act(gate) * up))

    return forward


def _fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    on = x.is_cuda or (x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")
    return on and x.dtype in _DTYPES and weight.dtype == x.dtype


def _launchable(gate: torch.Tensor, up: torch.Tensor) -> bool:
    return gate.shape == up.shape and gate.dtype == up.dtype and gate.is_contiguous() and up.is_contiguous()


def _hooked(module: nn.Module) -> bool:
    """Whether a forward hook (the module's own or a global one) would see or change this module's call."""
    from torch.nn.modules import module as torch_module

    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
    )


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """`silu(gate) * up` as torch computes it in gate's dtype, in one kernel; `out` may be `gate` itself."""
    if not _launchable(gate, up):
        raise ValueError(
            f"silu_mul needs contiguous tensors of one shape and dtype: {gate.shape}, {up.shape}"
        )
    out = torch.empty_like(gate) if out is None else out
    n = gate.numel()
    if n:
        _kernel()[(-(-n // _BLOCK),)](gate, up, out, n, BLOCK=_BLOCK, num_warps=4)
    return out


@functools.cache
def _kernel():
    """Compiled lazily: Triton is only there on GPU machines (and where the tests install it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def silu_mul_kernel(gate, up, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: prefills pass 2^31 elements
        keep = i < n
        g = tl.load(gate + i, mask=keep, other=0.0).to(tl.float32)  # [BLOCK]
        u = tl.load(up + i, mask=keep, other=0.0).to(tl.float32)
        s = tl.math.div_rn(g, 1.0 + tl.exp(-g)).to(gate.dtype.element_ty).to(tl.float32)  # torch rounds here
        tl.store(out + i, (s * u).to(out.dtype.element_ty), mask=keep)

    return silu_mul_kernel
