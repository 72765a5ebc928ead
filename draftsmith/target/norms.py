"""The target's RMSNorms as one Triton kernel each, where Transformers runs about ten element-wise kernels.

Transformers writes an RMSNorm as a chain of torch operations (a cast to fp32, a square, a mean, an add, a
reciprocal square root, two multiplies, casts back): each its own kernel with an fp32 intermediate the size of
the input. Those chains are most of a decode step's small kernels (docs/measurements.md), and in a long
prefill each link reads and writes the whole activation again. `fused_forward` is one kernel for a norm
module's forward (target.fusion swaps it in): it reads the row once, keeps every
intermediate in registers and rounds to x's dtype where Transformers does. In fp32 they still differ by a few
rounding steps (the squares are summed in another order, and the reciprocal square root, exp and division
are the GPU's fast ones), which seldom moves a bf16 result by one step.

Three forms, by class (anything else keeps its own forward):
- zero-centred (Qwen3.5/3.6, Qwen3-Next, Gemma): `(x * rsqrt(mean(x^2) + eps) * (1 + w)).to(x.dtype)`,
  all in fp32;
- weighted (Llama, Qwen2/3, Mistral): `w * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`;
- gated (the Gated DeltaNet output norm of Qwen3.5/3.6 and Qwen3-Next): the weighted form in x's dtype,
  times `silu(gate)` in fp32, rounded to x's dtype.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

ZERO_CENTRED, WEIGHTED, GATED = 0, 1, 2
_FORMS = {
    **dict.fromkeys(
        (
            "Qwen3_5RMSNorm",
            "Qwen3_5MoeRMSNorm",
            "Qwen3NextRMSNorm",
            "GemmaRMSNorm",
            "Gemma2RMSNorm",
            "Gemma3RMSNorm",
        ),
        ZERO_CENTRED,
    ),
    **dict.fromkeys(
        ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "MistralRMSNorm"),
        WEIGHTED,
    ),
    **dict.fromkeys(("Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated", "Qwen3NextRMSNormGated"), GATED),
}
_MAX_TILE = 8192  # elements a program holds: wider rows keep Transformers' forward
_ROWS_TILE = 4096  # elements a program takes when rows are short (several rows a program)


def norm_form(module: nn.Module) -> int | None:
    """The form of an RMSNorm module this file can run, or None."""
    form = _FORMS.get(type(module).__name__)
    if form is None or not isinstance(getattr(module, "weight", None), torch.Tensor):
        return None
    return form if _eps(module) is not None else None


def _eps(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return None


def fused_forward(module: nn.Module, original, guard):
    """A forward for `module` (one `norm_form` knows) that runs the kernel where it computes what `original`
    would, and `original` elsewhere. `guard(launch, fallback)` runs the launch, or the fallback once the
    kernel has failed in this process (target.fusion)."""
    form, eps, weight = norm_form(module), _eps(module), module.weight
    assert form is not None and eps is not None and isinstance(weight, torch.Tensor)  # chosen by norm_form

    def forward(*args, **kwargs) -> torch.Tensor:
        positional = not kwargs and len(args) in (1, 2)  # Transformers calls norms with x (and the gate)
        x, gate = (args[0], args[1] if len(args) == 2 else None) if positional else (None, None)
        if x is None or not _fits(x, weight, gate, gated=form == GATED):
            return original(*args, **kwargs)
        return guard(lambda: rms_norm(x, weight, eps, form=form, gate=gate), lambda: original(*args))

    return forward


def _fits(x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor | None, *, gated: bool) -> bool:
    """Whether the kernel computes this call as the module would; anything else goes to its own forward."""
    n = x.shape[-1]
    on = x.is_cuda or (x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")
    trained = x.requires_grad or weight.requires_grad or (gate is not None and gate.requires_grad)
    on = on and not (torch.is_grad_enabled() and trained)  # the kernel has no backward
    ok = (
        on
        and 0 < n <= _MAX_TILE
        and weight.shape == (n,)
        and weight.device == x.device
        and weight.is_contiguous()
    )
    if gated:  # the weighted part is rounded to x's dtype only where the weight has it too
        ok = ok and gate is not None and gate.shape == x.shape and weight.dtype == x.dtype
    return ok and (gated or gate is None)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    form: int,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """One RMSNorm of `form` over x's last dimension, in one kernel; returns a new contiguous tensor of x's
    shape in the dtype Transformers' forward returns."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)  # a view unless x's rows are not evenly strided (then one copy)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    gate_rows = rows if gate is None else gate.reshape(-1, n)
    if gate is not None and gate_rows.stride(-1) != 1:
        gate_rows = gate_rows.contiguous()
    dtype = torch.promote_types(weight.dtype, x.dtype) if form == WEIGHTED else x.dtype
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    per_program, block, warps = launch_shape(n)
    if rows.shape[0] == 0:  # nothing to launch (a grid of no programs is an error)
        return out
    _kernel()[(-(-rows.shape[0] // per_program),)](
        rows,
        gate_rows,
        weight,
        out,
        rows.shape[0],
        n,
        rows.stride(0),
        gate_rows.stride(0),
        eps,
        1.0 / n,
        FORM=form,
        ROWS=per_program,
        BLOCK=block,
        num_warps=warps,
    )
    return out


def launch_shape(n: int) -> tuple[int, int, int]:
    """Rows a program, the power of two of columns it holds, and its warps, for rows of `n` elements."""
    block = 1 << (n - 1).bit_length()
    rows = max(1, _ROWS_TILE // block)
    return rows, block, 4 if block * rows <= 4096 else 8


@functools.cache
def _kernel():
    """Compiled lazily: Triton is only there on GPU machines (and where the tests install it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm_kernel(
        x,
        gate,
        w,
        out,
        n_rows,
        n,
        sx,
        sg,
        eps,
        inv_n,
        FORM: tl.constexpr,
        ROWS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # one program: ROWS rows of n <= BLOCK columns; offsets in int64 (rows x stride passes 2^31 at ~400k
        # tokens of width 5120)
        r = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]).to(tl.int64)  # [ROWS, 1]
        c = tl.arange(0, BLOCK)[None, :]  # [1, BLOCK]
        keep = (r < n_rows) & (c < n)
        xf = tl.load(x + r * sx + c, mask=keep, other=0.0).to(tl.float32)  # [ROWS, BLOCK]
        inv = tl.math.rsqrt(tl.sum(xf * xf, axis=1) * inv_n + eps)  # [ROWS]; torch's mean multiplies by 1/n
        normed = xf * inv[:, None]
        wf = tl.load(w + c, mask=c < n, other=0.0).to(tl.float32)  # [1, BLOCK]
        if FORM == 0:  # zero-centred: fp32 throughout, one rounding at the end
            y = normed * (1.0 + wf)
        elif FORM == 1:  # weighted: rounded to x's dtype, then times the weight
            y = wf * normed.to(x.dtype.element_ty).to(tl.float32)
        else:  # gated: the weighted form rounded to x's dtype, then times silu(gate) in fp32
            p = (wf * normed.to(x.dtype.element_ty).to(tl.float32)).to(x.dtype.element_ty).to(tl.float32)
            g = tl.load(gate + r * sg + c, mask=keep, other=0.0).to(tl.float32)
            y = p * tl.math.div_rn(g, 1.0 + tl.exp(-g))
        tl.store(out + r * n + c, y.to(out.dtype.element_ty), mask=keep)

    return rms_norm_kernel
