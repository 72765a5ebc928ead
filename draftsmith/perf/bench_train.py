"""Training throughput of a drafter shape (default: the Qwen3.6-27B drafter) on random weights and data.

Prints tokens/s, model FLOPs per token, achieved TFLOP/s and the fraction of a bf16 8192^3 matmul measured in
the same run. --gpus 2 first measures one GPU, then two under torchrun/DDP, and prints the scaling. Without a
GPU it runs a tiny shape on the CPU (a smoke test, not a measurement)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

from draftsmith.drafter.config import FULL, SLIDING, drafter_config
from draftsmith.perf.training import benchmark


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=17408)
    p.add_argument("--vocab", type=int, default=248320)
    p.add_argument("--taps", type=int, default=5)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--sliding-layers", type=int, default=4, help="the first N layers slide, the rest are full"
    )
    p.add_argument("--window", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--seqs-per-step", type=int, default=2)
    p.add_argument("--anchors", type=int, default=512)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="a tiny shape (the default without a GPU)")
    a = p.parse_args(argv)
    if a.tiny or not torch.cuda.is_available():
        a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim, a.intermediate, a.vocab = (
            64,
            2,
            4,
            2,
            16,
            128,
            1000,
        )
        a.seq_len, a.anchors, a.window, a.sliding_layers, a.steps, a.warmup = 128, 16, 64, 1, 3, 1
        a.gpus = 1
    if a.gpus > 1 and "LOCAL_RANK" not in os.environ:
        results = []
        for n in (1, a.gpus):
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={n}",
                __file__,
                *sys.argv[1:],
            ]
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout  # stderr shows
            results.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(results[-1], indent=2))
        print(
            f"scaling {a.gpus} GPUs / 1 GPU: {results[1]['tokens_per_s'] / results[0]['tokens_per_s']:.2f}x"
        )
        sys.exit(0)
    types = [SLIDING] * min(a.sliding_layers, a.layers) + [FULL] * max(0, a.layers - a.sliding_layers)
    shape = {
        "hidden_size": a.hidden,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "intermediate_size": a.intermediate,
        "vocab_size": a.vocab,
    }
    cfg = drafter_config(
        shape,
        list(range(a.taps)),
        num_layers=a.layers,
        num_target_layers=64,
        mask_token_id=a.vocab - 1,
        block_size=a.block_size,
        layer_types=types,
        sliding_window=a.window if a.sliding_layers else None,
    )
    r = benchmark(cfg, a.seq_len, a.seqs_per_step, a.anchors, a.steps, a.warmup)
    if int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
