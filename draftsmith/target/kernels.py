"""Kernel choice for hybrid targets: fla's Triton kernels where they run, Transformers' torch ones on the
CPU."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from draftsmith.target.layers import has_linear_attention, mixer_module

log = logging.getLogger(__name__)


def fla_available() -> bool:
    try:
        import fla  # noqa: F401
    except ImportError:
        return False
    return True


def report_kernels(model) -> str:
    """Says which linear-attention kernels run: fla's Triton kernels are ~1.5x faster than the torch
    fallback."""
    if not has_linear_attention(model):
        return "attention-only target: flash-linear-attention not needed"
    if fla_available():
        msg = "flash-linear-attention found: its kernels run the linear-attention layers"
        log.info(msg)
    else:
        msg = (
            "flash-linear-attention is NOT installed: linear-attention layers use the slow torch fallback "
            "(install the `gpu` extra: pip install 'draftsmith[gpu]')"
        )
        if torch.cuda.is_available():
            log.warning(msg)
        else:
            log.info(msg)
    return msg


# the Gated DeltaNet functions Transformers binds to a kernel package (fla, causal_conv1d) at import when
# present
_KERNEL_NAMES = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)


_REFERENCE_ON_GPU: ContextVar[bool] = ContextVar("reference_on_gpu", default=False)


@contextmanager
def exact_fp32() -> Iterator[None]:
    """fp32 on the GPU without tf32 anywhere, for the block: Transformers' torch gated delta rule runs
    instead of fla's (fla-core 0.6.0's chunked forward fixes some of its dot products at tf32 inside the
    kernel, and Triton rounds the other fp32 dot operands to tf32 by default), and cuDNN's convolutions and
    cuBLAS's matmuls may not round to tf32 either. fla's short convolution stays: it has no dot products.
    For checks that fp32 results are equal; slower, so only there."""
    token = _REFERENCE_ON_GPU.set(True)
    conv, mm = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        _REFERENCE_ON_GPU.reset(token)
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = conv, mm


def _torch_function(bound):
    """Transformers' torch function behind a kernel binding: what `functools.wraps` recorded (up to 5.24), or,
    where the binding is a `kernels` module (5.25 binds that way), what the module's forward calls."""
    found = inspect.unwrap(bound)
    if isinstance(found, torch.nn.Module):
        for cell in getattr(type(found).forward, "__closure__", None) or ():
            if hasattr(cell.cell_contents, "__wrapped__"):
                return inspect.unwrap(cell.cell_contents)
    return found


def kernels_follow_device(model) -> None:
    """CPU tensors go to Transformers' own torch functions, CUDA tensors to the kernels it bound (inside
    `exact_fp32`, to the torch functions too).

    Transformers binds fla's Triton kernels whenever fla is installed, whatever device the model is on, so a
    hybrid model on the CPU (the demo target's training, a CPU extraction, the tests on a GPU node) would fail
    inside Triton. The mixer module's functions are wrapped once per process; CUDA calls are unchanged.
    """
    module = mixer_module(model)
    for name in _KERNEL_NAMES if module is not None else ():
        fast = getattr(module, name, None)
        if fast is None or getattr(fast, "follows_device", False):
            continue
        reference = _torch_function(fast)
        if reference is fast:
            continue
        accepted = set(inspect.signature(reference).parameters)

        @functools.wraps(fast)  # __wrapped__ leads back to the torch function, as Transformers' binding does
        def call(*args, _fast=fast, _reference=reference, _accepted=accepted, **kwargs):
            first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
            if first is not None and first.is_cuda and not _REFERENCE_ON_GPU.get():
                return _fast(*args, **kwargs)
            return _reference(*args, **{k: v for k, v in kwargs.items() if k in _accepted})

        setattr(call, "follows_device", True)  # noqa: B010 (a mark on a function object)
        setattr(module, name, call)


def use_fla_conv(model) -> bool:
    """Runs the Gated DeltaNet short convolution on fla's Triton kernel instead of Transformers' torch
    fallback.

    Transformers looks for the separate `causal_conv1d` CUDA package and otherwise runs a grouped `F.conv1d`
    (which it warns is much slower). fla, already needed for the recurrence, ships a Triton causal conv over
    the [batch, time, channels] layout the projection produced, so the adapter below is two transposes (free
    views unless a cache padded the input). Only the multi-token path is replaced, not the one-token decode
    update; True when installed.
    """
    if (
        not (fla_available() and has_linear_attention(model))
        or next(model.parameters()).device.type != "cuda"
    ):
        return False
    import importlib.util

    from fla.modules.causal_conv1d import causal_conv1d

    module = mixer_module(model)
    original = getattr(module, "causal_conv1d_fn", None)
    if getattr(original, "fla_conv", False):  # installed by an earlier model of this process
        return True

    def conv_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        if (
            not hidden_states.is_cuda
        ):  # the patch is process-wide; a CPU model in the same process keeps torch's
            return original(hidden_states, weight, bias, activation=activation, **kwargs)
        # a free view when the input came straight from the projection; a copy only for cache-padded prompts
        x = hidden_states.transpose(1, 2).contiguous()
        out, _state = causal_conv1d(x, weight, bias, activation=activation)
        return out.transpose(1, 2)

    installed = module is not None and original is not None
    installed = (
        installed and importlib.util.find_spec("causal_conv1d") is None
    )  # the CUDA package wins if present
    if installed:
        setattr(conv_fn, "fla_conv", True)  # noqa: B010 (a mark on a function object)
        module.causal_conv1d_fn = conv_fn
        log.info("short convolutions run on fla's Triton causal_conv1d")
    return installed
