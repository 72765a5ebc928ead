"""Decode attention over each slot's own keys, registered with Transformers as an attention function."""

from __future__ import annotations

import torch

from draftsmith.engine.kernels import attention_

DECODE_ATTENTION = "draftsmith_decode"

_step_positions: dict[
    torch.device, torch.Tensor
] = {}  # the running step's slot positions, per GPU (fused kernels)


def decode_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
):
    """One new token per slot against that slot's keys and values, query heads grouped by the head they share.

    With a per-row mask, Transformers' SDPA path first copies every key and value once per query head of its
    group (6x for Qwen3.6's 24/4 heads) and falls back to the math kernel: most of a decode step's memory
    traffic at large batch. Here each key and value is read once. Logit soft-capping (Gemma 2) and attention
    sinks (gpt-oss) are applied as those models' own eager attention applies them; several tokens go to SDPA.
    """
    mask_ok = isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool
    if query.shape[2] != 1 or not mask_ok or attention_mask.shape[2] != 1:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    b, hq, _, d = query.shape
    hkv = key.shape[1]
    scale = scaling if scaling is not None else d**-0.5
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    sinks = getattr(module, "sinks", None) if sinks is None else sinks
    pos = _step_positions.get(query.device)
    kernel_ok = (
        query.is_cuda and d >= 16 and d & (d - 1) == 0 and key.stride(-1) == 1 and value.stride(-1) == 1
    )
    if pos is not None and kernel_ok and softcap is None and sinks is None:
        # reads only the keys a slot has (within the window on sliding layers)
        return attention_(query, key, value, pos, scale, kwargs.get("sliding_window") or 0), None
    q = query.reshape(
        b, hkv, hq // hkv, d
    )  # query head h reads key/value head h // group, as repeat_kv has it
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scale  # [slots, kv heads, group, length]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~attention_mask, float("-inf"))
    if sinks is not None:  # one more logit per query head that takes probability mass and gives no value
        sink = sinks.float().reshape(1, hkv, hq // hkv, 1).expand(b, -1, -1, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs.to(value.dtype), value)  # [slots, kv heads, group, head dim]
    return out.reshape(b, 1, hq, d), None


def _attention_configs(model) -> list:
    """The config objects the attention layers read their implementation name from (one, or one per
    sub-model)."""
    from transformers import PretrainedConfig

    found = {
        id(m.config): m.config
        for m in model.modules()
        if isinstance(getattr(m, "config", None), PretrainedConfig)
    }
    return list(found.values())
