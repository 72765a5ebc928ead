"""Merging validated shards into one dataset index, and the dataset that training reads through it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from draftsmith.core.io import read_json, write_json
from draftsmith.dataset.shards import Sample, ShardReader


class MergedDataset:
    """All shards of a merged manifest as one indexable dataset (global sample index -> shard, local
    index)."""

    def __init__(self, manifest_path: str | Path):
        self.manifest_path = Path(manifest_path)
        self.manifest = read_json(self.manifest_path)
        root = self.manifest_path.parent
        self.shard_paths = [(root / s["path"]).resolve() for s in self.manifest["shards"]]
        self._readers: dict[int, ShardReader] = {}
        counts = [s["num_samples"] for s in self.manifest["shards"]]
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.lengths = (
            np.concatenate([np.asarray(s["sample_tokens"], dtype=np.int64) for s in self.manifest["shards"]])
            if counts
            else np.zeros(0, dtype=np.int64)
        )
        self.taps: list[int] = self.manifest["taps"]
        self.hidden_size: int = self.manifest["hidden_size"]

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _locate(self, i: int) -> tuple[ShardReader, int]:
        s = int(np.searchsorted(self._starts, i, side="right") - 1)
        if s not in self._readers:  # opened lazily: a DataLoader worker opens only what it touches
            self._readers[s] = ShardReader(self.shard_paths[s])
        return self._readers[s], i - int(self._starts[s])

    def __getitem__(self, i: int) -> Sample:
        reader, j = self._locate(int(i))
        return reader.sample(j)

    def stored(self, i: int) -> Sample:
        """Sample i as stored, decoded later (ShardReader.stored_sample)."""
        reader, j = self._locate(int(i))
        return reader.stored_sample(j)


def merge(manifest_paths: list[str | Path], out_path: str | Path) -> dict:
    """One dataset manifest over all shards; refuses shards made with another config, model or tap set."""
    out_path = Path(out_path)
    shards = []
    ref = None
    keys = ("config_hash", "model", "revision", "taps", "hidden_size", "storage")
    for mp in manifest_paths:
        mp = Path(mp)
        m = read_json(mp)
        if ref is None:
            ref = m
        diff = [k for k in keys if m.get(k) != ref.get(k)]
        if diff:
            raise ValueError(
                f"{mp}: made with a different {', '.join(diff)} than {manifest_paths[0]} "
                f"({', '.join(f'{k}={m.get(k)!r} vs {ref.get(k)!r}' for k in diff)}); delete the stale "
                "shards and rerun, or restore the config they were made with"
            )
        shard_file = mp.parent / m["file"]
        shards.append(
            {
                "path": os.path.relpath(shard_file, out_path.parent),
                "num_samples": m["num_samples"],
                "num_tokens": m["num_tokens"],
                "loss_tokens": m["loss_tokens"],
                "sample_tokens": m["sample_tokens"],
                "sample_ids": m["sample_ids"],
                "checksum": m["checksum"],
            }
        )
    assert ref is not None, "merge needs at least one shard"
    merged = {k: ref.get(k) for k in keys}
    merged.update(
        format="draftsmith-merged-v1",
        dtype=ref.get("dtype"),
        num_shards=len(shards),
        total_samples=sum(s["num_samples"] for s in shards),
        total_tokens=sum(s["num_tokens"] for s in shards),
        total_loss_tokens=sum(s["loss_tokens"] for s in shards),
        shards=shards,
    )
    write_json(out_path, merged)
    return merged
