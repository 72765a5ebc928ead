"""A shard file's size from its token and sample counts, without torch: the plan reads it at every parse
of the workflow, where importing torch would cost more than the rest of the parse (draftsmith.dataset.shards
writes the files these sizes describe)."""

from __future__ import annotations

STORAGE_DTYPES = ("bf16", "fp8")


def hidden_value_bytes(storage: str) -> int:
    """Bytes per stored hidden-state value: fp8 e4m3 or bf16."""
    return 1 if storage == "fp8" else 2


def shard_bytes(tokens: int, num_samples: int, width: int, storage: str = "bf16") -> int:
    """Bytes of a shard file's tensors (the header adds a few hundred): what the disk-space preflight
    needs. Per token: the hidden row (and its fp32 scale in fp8), an int32 id and a uint8 loss mask; per
    sample an int64 offset, plus one."""
    hidden = tokens * width * hidden_value_bytes(storage)
    scales = tokens * 4 if storage == "fp8" else 0
    return hidden + scales + tokens * (4 + 1) + (num_samples + 1) * 8
