"""fp32 arithmetic from bf16 weights, one decoder layer at a time.

The bench's losslessness check runs the target in fp32. Cast whole, Qwen3.6-27B takes 108 GB, more than a
96 GB card holds. Here the weights stay in bf16 and each decoder layer is cast to fp32 when its forward starts
and gets its bf16 tensors back when it ends. A bf16 value is exact in fp32, so each layer computes what the
same layer of a model cast whole with `.float()` computes, bit for bit. The embeddings, the final norm and the
head are cast for the whole block: a model's dtype, which its caches and masks follow, is its first
parameter's. For the 27B that is 5 GB more than bf16, plus one layer's 1.7 GB while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from draftsmith.target.layers import decoder_layers

Swapped = list[tuple[torch.Tensor, torch.Tensor]]  # (a parameter or buffer, the bf16 data it had)


@contextmanager
def fp32_by_layer(model: nn.Module) -> Iterator[nn.Module]:
    """The model computing in fp32 for the block, its layers cast one at a time; bf16 again afterwards."""
    layers = decoder_layers(model)
    in_layers = {id(t) for t in _low_tensors(layers)}
    rest = [t for t in _low_tensors(model) if id(t) not in in_layers]
    dtypes = [t.dtype for t in rest]
    _cast_up(rest)
    handles = []
    for layer in layers:
        held: Swapped = []
        handles.append(
            layer.register_forward_pre_hook(lambda m, _a, held=held: held.extend(_cast_up(_low_tensors(m))))
        )
        handles.append(
            layer.register_forward_hook(lambda _m, _a, _o, held=held: _put_back(held), always_call=True)
        )
    try:
        yield model
    finally:
        for h in handles:
            h.remove()
        for t, dtype in zip(rest, dtypes, strict=True):  # exact: the fp32 values came from this dtype
            t.data = t.data.to(dtype)


def fp32_tensor_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers in fp32 now (what `fp32_by_layer` holds at a time)."""
    return sum(t.numel() * 4 for t in _tensors(model) if t.dtype == torch.float32)


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    """Its parameters and buffers, each once (tied weights are one parameter)."""
    return list({id(t): t for t in [*module.parameters(), *module.buffers()]}.values())


def _low_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Its parameters and buffers in a 16-bit float type."""
    return [t for t in _tensors(module) if t.dtype in (torch.bfloat16, torch.float16)]


def _cast_up(tensors: list[torch.Tensor]) -> Swapped:
    """Each tensor's data replaced by an fp32 copy; returns what it had, for `_put_back`."""
    swapped = [(t, t.data) for t in tensors]
    with torch.inference_mode(False):  # a parameter's data may not become an inference tensor
        for t, low in swapped:
            t.data = low.float()
    return swapped


def _put_back(held: Swapped) -> None:
    for t, low in held:
        t.data = low
    held.clear()
