"""Splitting prepared samples into shards balanced by token count (deterministic)."""

from __future__ import annotations

import pandas as pd


def assign_shards(lengths: list[int], ids: list[str], num_shards: int) -> list[int]:
    """Balanced by token count (longest first onto the lightest shard); depends only on the data, never on
    time."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], ids[i]))
    load = [0] * num_shards
    count = [0] * num_shards
    out = [0] * len(lengths)
    for i in order:
        s = min(range(num_shards), key=lambda k: (load[k], count[k], k))
        out[i] = s
        load[s] += lengths[i]
        count[s] += 1
    return out


def shard(samples: pd.DataFrame, num_shards: int) -> list[pd.DataFrame]:
    if len(samples) < num_shards:
        raise ValueError(
            f"{len(samples)} samples cannot fill {num_shards} shards; lower extract.shards_per_slot or add "
            "data"
        )
    which = assign_shards(samples["num_tokens"].tolist(), samples["id"].tolist(), num_shards)
    samples = samples.assign(_shard=which)
    return [
        samples[samples["_shard"] == s].drop(columns="_shard").sort_values("id").reset_index(drop=True)
        for s in range(num_shards)
    ]
