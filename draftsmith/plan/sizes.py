"""Sizes the plan counts: a size written in a config, a token's hidden states, a drafter's files."""

from __future__ import annotations

from draftsmith.dataset.shard_sizes import shard_bytes

CHECKPOINTS_KEPT = 2  # training keeps the newest two: a run killed while writing one still has the one before
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights and AdamW's two fp32 moments
EXPORT_BYTES_PER_PARAM = 4  # final/ holds the weights in fp32 (the export as many again)
ROUND_STATES_KEPT = 2  # a round's state and the next one's, while the next trains


def states_bytes(tokens: int, samples: int, *, taps: int, hidden: int, storage: str) -> int:
    """A shard's bytes on disk (the shard store's own layout: states, ids, mask, index)."""
    return shard_bytes(int(tokens), int(samples), taps * hidden, storage)


def token_bytes(*, taps: int, hidden: int, storage: str) -> float:
    """Bytes a token of hidden states takes on disk, ids and mask included (51.2 KB for the 27B in bf16)."""
    return states_bytes(1_000_000, 0, taps=taps, hidden=hidden, storage=storage) / 1_000_000


def drafter_params(shape: dict, drafter: dict, taps: int) -> int:
    """The drafter's parameter count from the target's text shape and the `drafter` section: `fc` over the
    taps and k Qwen3 decoder layers at the target's width (no embedding or head of its own)."""
    hidden = int(shape["hidden_size"])
    heads = int(shape.get("num_attention_heads") or max(1, hidden // 128))
    kv = int(shape.get("num_key_value_heads") or heads)
    head_dim = int(shape.get("head_dim") or hidden // heads)
    inter = drafter.get("intermediate_size", "auto")
    inter = int(shape.get("intermediate_size") or 3 * hidden) if inter == "auto" else int(inter)
    attention = hidden * head_dim * (2 * heads + 2 * kv) + 2 * head_dim
    layer = attention + 3 * hidden * inter + 2 * hidden
    return int(drafter["num_layers"]) * layer + taps * hidden * hidden + 2 * hidden


def training_bytes(params: int, *, checkpoints: bool, rounds: int) -> int:
    """What training writes beside the hidden states: checkpoints (when on), the fp32 export and the exported
    drafter, and with rounds the state handed from one round to the next."""
    per_param = 2 * EXPORT_BYTES_PER_PARAM
    if checkpoints:
        per_param += CHECKPOINT_BYTES_PER_PARAM * CHECKPOINTS_KEPT
    if rounds > 1:
        per_param += CHECKPOINT_BYTES_PER_PARAM * ROUND_STATES_KEPT
    return params * per_param


def target_params(shape: dict) -> float:
    """Parameters of a decoder-only target from its shape (12 L H^2 for the body, the embedding and head)."""
    hidden, layers = int(shape["hidden_size"]), int(shape["num_hidden_layers"])
    inter = int(shape.get("intermediate_size") or 4 * hidden)
    vocab = int(shape.get("vocab_size") or 32000)
    return layers * (4 * hidden * hidden + 3 * hidden * inter) + 2 * vocab * hidden
