"""The host side of a validation job: the structural checks of one shard, read from the stored bits, against
decoding every value to fp32 first (what validation did until 2026-12-06).

Writes a shard of random states in the real format (`ShardWriter`, fp8 or bf16), then times both over the same
file in one run and prints the figures. The stored-bits figure is the whole of `structural_checks` (ids,
masks, values, checksum); the decoded one only the values and the checksum, so their ratio understates the
gain. The recomputation on the GPU is not timed: it checks a few samples, while these checks read every byte
of the shard, on the job's few host threads.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from draftsmith.dataset.shards import (
    STORAGE_DTYPES,
    ShardReader,
    ShardWriter,
    decode,
    quantize_fp8,
    sample_crc,
)
from draftsmith.dataset.validate import structural_checks

SMOLLM2_WIDTH = 5 * 576  # the study's five taps of SmolLM2-135M


def write_shard(
    path: Path, *, samples: int, tokens: int, width: int, storage: str
) -> tuple[pd.DataFrame, dict]:
    """A shard of `samples` random samples of about `tokens` tokens each; its prepared rows and manifest."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(tokens // 2, tokens * 3 // 2 + 1, samples).tolist()
    writer = ShardWriter(path, lengths, width, storage)
    rows = []
    for i, t in enumerate(lengths):
        h = torch.randn(t, width, dtype=torch.bfloat16)
        hidden, scale = quantize_fp8(h) if storage == "fp8" else (h, None)
        ids = torch.randint(0, 49_152, (t,))
        mask = torch.arange(t) >= t // 4
        writer.write_sample(i, hidden, ids, mask, scale)
        rows.append({"id": f"s{i}", "input_ids": ids.numpy(), "prompt_len": t // 4, "num_tokens": t})
    manifest = {
        "sample_ids": [r["id"] for r in rows],
        "sample_tokens": lengths,
        "taps": [1],  # one tap as wide as all of them: the checks only multiply the two
        "hidden_size": width,
        "regenerated": True,
        "checksum": writer.close(),
    }
    return pd.DataFrame(rows), manifest


def decoded_checks(reader: ShardReader) -> int:
    """The checks as they were: each sample decoded to fp32, then tested value by value; the zero rows."""
    zero = 0
    for i in range(len(reader)):
        raw, scale = reader.raw(i)
        h = decode(raw, scale, torch.float32)
        assert torch.isfinite(h).all()
        zero += int((h == 0).all(dim=-1).sum())
        sample_crc(raw, scale)
    return zero


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--samples", type=int, default=600)
    p.add_argument("--tokens", type=int, default=344, help="mean tokens a sample (the 40k study's: 344)")
    p.add_argument("--width", type=int, default=SMOLLM2_WIDTH, help="taps x hidden size")
    p.add_argument("--storage", choices=STORAGE_DTYPES, default="fp8")
    p.add_argument("--threads", type=int, default=2, help="host threads (a validation job's default: 2)")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shard.safetensors"
        prepared, manifest = write_shard(
            path, samples=args.samples, tokens=args.tokens, width=args.width, storage=args.storage
        )
        reader = ShardReader(path)
        mb = path.stat().st_size / 1e6
        stored, old = [], []
        for _ in range(args.repeats):  # interleaved, so that both see the same page cache
            t = time.perf_counter()
            assert structural_checks(reader, manifest, prepared) == []
            stored.append(time.perf_counter() - t)
            t = time.perf_counter()
            assert decoded_checks(reader) == 0
            old.append(time.perf_counter() - t)
    s, o = min(stored), min(old)
    print(f"shard: {args.samples} samples, {int(reader.offsets[-1]):,} tokens, {mb:,.0f} MB ({args.storage})")
    print("| checks | s | MB/s |\n| --- | --- | --- |")
    print(f"| stored bits (structural_checks) | {s:.2f} | {mb / s:,.0f} |")
    print(f"| decoded to fp32 (before) | {o:.2f} | {mb / o:,.0f} |")
    print(f"decoded / stored bits: {o / s:.1f}x (best of {args.repeats}, {args.threads} threads)")


if __name__ == "__main__":
    main()
