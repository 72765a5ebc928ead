"""What kind of layers a target has: the decoder body, layer kinds, sliding windows, linear-attention
(Gated DeltaNet) mixers, and the keyword a forward takes its cache under."""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import cast

from torch import nn


def mixer_module(model):
    """The Python module of the model's Gated DeltaNet mixer class (None for attention-only models)."""
    mixer = next((m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")), None)
    return importlib.import_module(type(mixer).__module__) if mixer is not None else None


def has_linear_attention(model) -> bool:
    """From the text config: a multimodal checkpoint (Qwen3.6's) keeps its layer kinds under `text_config`."""
    return any("linear" in t for t in layer_types(model))


def body(model: nn.Module) -> nn.Module:
    """The decoder stack without the LM head (`model.model` for every HF causal LM we support)."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise TypeError(
            f"{type(model).__name__}: expected a `.model` with `.layers` (a Hugging Face causal LM)"
        )
    return inner


def layer_types(model: nn.Module) -> list[str]:
    """Each decoder layer's kind from the text config; `full_attention` throughout when the config names
    none."""
    cfg = model.config.get_text_config()
    return list(getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers)


def sliding_window(model: nn.Module) -> int | None:
    """The window of the target's sliding layers (None: no layer slides), read as Transformers' caches and
    masks read it: the config's one `sliding_window`, for the layers named `sliding_attention`, or for every
    layer where a config gives a window and names no kinds (Mistral). Chunked attention (Llama 4) is another
    pattern, refused."""
    cfg = model.config.get_text_config()
    named = list(getattr(cfg, "layer_types", None) or [])
    if getattr(cfg, "attention_chunk_size", None) or any("chunk" in t for t in named):
        raise NotImplementedError(
            "chunked attention (Llama 4) is not supported by regeneration or the real speculative loop; set "
            "data.regenerate.enabled: false and bench.real_loop: false"
        )
    if named and not names_sliding_layers(model):
        return None
    return getattr(cfg, "sliding_window", None)


def names_sliding_layers(model: nn.Module) -> bool:
    """Whether the config names sliding layers among others: such models take one attention mask per layer
    kind."""
    return any("sliding" in t for t in layer_types(model))


@functools.cache
def _cache_kwarg(cls: type) -> str:
    forward = getattr(cls, "forward")  # noqa: B009 (`type` has no typed forward)
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def cache_kwarg(module: nn.Module) -> str:
    """The keyword a forward takes its cache by: `cache` from Transformers 5.2x (which deprecates
    `past_key_values` and drops it in 5.40), `past_key_values` before and in remote code."""
    return _cache_kwarg(
        cast(type, type(module))
    )  # once per class: the real loop and AR decoding call it every forward


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return cast(nn.ModuleList, body(model).layers)
