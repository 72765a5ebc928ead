"""Reading a target's hidden states at its tap layers.

Convention (DFlash / z-lab): tap id i is the output of decoder layer i, which is Hugging Face
`hidden_states[i + 1]` (index 0 holds the embeddings; the last entry comes after the final norm). We read taps
with forward hooks on the decoder layers instead of `output_hidden_states`, because hooks let the forward stop
after the deepest tap (no later layers, no LM head over a huge vocabulary) and keep only the layers we need.
On a GPU the forward's RMSNorms and gated MLP products run as one kernel each (target.fusion); validation's
reference path keeps Transformers' own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from draftsmith.config import taps_out_of_range
from draftsmith.target.fusion import fused_modules, kernel_modules
from draftsmith.target.layers import body, decoder_layers


class _StopForward(Exception):
    """Raised by the deepest tap's hook: everything after it is wasted work for extraction."""


@contextmanager
def capture(model: nn.Module, taps: list[int], stop_early: bool = True) -> Iterator[dict[int, torch.Tensor]]:
    """Hooks the tap layers; the yielded dict fills with {tap: output [B, T, H]} during a body forward."""
    layers = decoder_layers(model)
    n = len(layers)
    if taps_out_of_range(taps, n):
        raise ValueError(f"tap layers {taps} out of range for a target with {n} decoder layers")
    store: dict[int, torch.Tensor] = {}
    deepest = max(taps)

    def hook_for(i: int):
        def hook(_module, _args, output):
            store[i] = output[0] if isinstance(output, tuple) else output
            if stop_early and i == deepest:
                raise _StopForward

        return hook

    handles = [layers[i].register_forward_hook(hook_for(i)) for i in sorted(set(taps))]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


@torch.inference_mode()
def forward_taps(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    taps: list[int],
    *,
    layer_kernels: bool = True,
    **kwargs,
) -> torch.Tensor:
    """Runs the body only (no logits, no cache) and returns the taps concatenated: [B, T, len(taps) * H].
    `layer_kernels`: target.fusion's kernels where they run on a GPU (off: Transformers' forwards)."""
    modules = kernel_modules(model) if layer_kernels else None
    with capture(model, taps) as store, fused_modules(modules):
        try:
            body(model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        except _StopForward:
            pass
    return torch.cat([store[t] for t in taps], dim=-1)


@torch.inference_mode()
def reference_taps(model: nn.Module, input_ids: torch.Tensor, taps: list[int]) -> torch.Tensor:
    """An independent path for validation: one unpadded sequence through `output_hidden_states`, no hooks.

    The final layer's HF hidden state is taken after the final norm, so for a tap on the last layer we read
    the norm's input instead.
    """
    inner = body(model)
    n = len(decoder_layers(model))
    pre_norm: list[torch.Tensor] = []
    handle = None
    if n - 1 in taps:
        handle = inner.norm.register_forward_pre_hook(lambda _m, args: pre_norm.append(args[0]))
    try:
        out = inner(input_ids=input_ids, use_cache=False, output_hidden_states=True)
    finally:
        if handle is not None:
            handle.remove()
    parts = [pre_norm[0] if t == n - 1 else out.hidden_states[t + 1] for t in taps]
    return torch.cat(parts, dim=-1)
