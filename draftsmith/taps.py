"""Reading a target's hidden states at its tap layers.

Convention (DFlash / z-lab): tap id i is the output of decoder layer i, which is Hugging Face
`hidden_states[i + 1]` (index 0 holds the embeddings; the last entry comes after the final norm). We read taps
with forward hooks on the decoder layers instead of `output_hidden_states`, because hooks let the forward stop
after the deepest tap (no later layers, no LM head over a huge vocabulary) and keep only the layers we need.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def default_taps(num_layers: int, num_taps: int = 5) -> list[int]:
    """Evenly spaced layer ids from 1 to N-3, as the DFlash drafters do (Qwen3-8B: 1, 9, 17, 25, 33)."""
    if num_taps == 1:
        return [num_layers // 2]
    start, end = 1, num_layers - 3
    if end <= start:
        raise ValueError(f"a target with {num_layers} layers is too shallow for {num_taps} evenly spaced taps")
    span = end - start
    taps = [int(round(start + i * span / (num_taps - 1))) for i in range(num_taps)]
    if len(set(taps)) != len(taps):
        raise ValueError(
            f"{num_taps} taps between layers 1 and {end} would repeat a layer ({taps}); "
            "set taps.layers explicitly or lower taps.count"
        )
    return taps


def body(model: nn.Module) -> nn.Module:
    """The decoder stack without the LM head (`model.model` for every HF causal LM we support)."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise TypeError(f"{type(model).__name__}: expected a `.model` with `.layers` (a Hugging Face causal LM)")
    return inner


def layer_types(model: nn.Module) -> list[str]:
    """Each decoder layer's kind from the text config; `full_attention` throughout when the config names none."""
    cfg = model.config.get_text_config()
    return list(getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers)


def sliding_window(model: nn.Module) -> int | None:
    """The window of the target's sliding layers (None: no layer slides), read as Transformers' caches and masks
    read it: the config's one `sliding_window`, for the layers named `sliding_attention`, or for every layer where a
    config gives a window and names no kinds (Mistral). Chunked attention (Llama 4) is another pattern, refused."""
    cfg = model.config.get_text_config()
    named = list(getattr(cfg, "layer_types", None) or [])
    if getattr(cfg, "attention_chunk_size", None) or any("chunk" in t for t in named):
        raise NotImplementedError("chunked attention (Llama 4) is not supported by regeneration or the real "
                                  "speculative loop; set data.regenerate.enabled: false and bench.real_loop: false")
    if named and not names_sliding_layers(model):
        return None
    return getattr(cfg, "sliding_window", None)


def names_sliding_layers(model: nn.Module) -> bool:
    """Whether the config names sliding layers among others: such models take one attention mask per layer kind."""
    return any("sliding" in t for t in layer_types(model))


@functools.cache
def _cache_kwarg(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def cache_kwarg(module: nn.Module) -> str:
    """The keyword a forward takes its cache by: `cache` from Transformers 5.2x (which deprecates
    `past_key_values` and drops it in 5.40), `past_key_values` before and in remote code."""
    return _cache_kwarg(type(module))  # once per class: the real loop and AR decoding call it every forward


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return body(model).layers


class _StopForward(Exception):
    """Raised by the deepest tap's hook: everything after it is wasted work for extraction."""


@contextmanager
def capture(model: nn.Module, taps: list[int], stop_early: bool = True) -> Iterator[dict[int, torch.Tensor]]:
    """Hooks the tap layers; the yielded dict fills with {tap: output [B, T, H]} during a body forward."""
    layers = decoder_layers(model)
    n = len(layers)
    if any(t < 0 or t >= n for t in taps):
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
    **kwargs,
) -> torch.Tensor:
    """Runs the body only (no logits, no cache) and returns the taps concatenated: [B, T, len(taps) * H]."""
    with capture(model, taps) as store:
        try:
            body(model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        except _StopForward:
            pass
    return torch.cat([store[t] for t in taps], dim=-1)


@torch.inference_mode()
def reference_taps(model: nn.Module, input_ids: torch.Tensor, taps: list[int]) -> torch.Tensor:
    """An independent path for validation: one unpadded sequence through `output_hidden_states`, no hooks.

    The final layer's HF hidden state is taken after the final norm, so for a tap on the last layer we read the
    norm's input instead.
    """
    inner = body(model)
    n = len(inner.layers)
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
