"""Extraction throughput on a random-weight target of a real shape: bare forward vs the real extraction path.

Builds the target from its config only (presets in configs/shapes/, or a model directory) directly on the GPU,
draws a realistic token stream, and in one run on identical batches times (a) the bare body forward, (b) the real
extraction (batching, hooks, device-to-host copies, writer thread, a real shard on --out-dir) and (c) the naive
`model(ids, output_hidden_states=True)` on a subset. Prints tokens/s, (b)/(a), fraction of a matmul ceiling
measured in the same run, padding waste, device idle time and write rates. Without a GPU it runs on the CPU (use a
small shape or --num-layers) and prints the same ratios. --gpus N runs one process per GPU at once, like N workflow
extraction jobs, and prints the scaling over one GPU.
"""

import argparse
import json
import logging
import sys
from pathlib import Path

from draftsmith import benchmark

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3.6-27b", help="shape JSON, preset name (configs/shapes) or model dir")
    p.add_argument("--num-layers", type=int, default=None, help="shrink the depth (taps become the DFlash default)")
    p.add_argument("--tokens", type=int, default=400_000)
    p.add_argument("--lengths", default="loguniform:64:8192", help="loguniform:LO:HI")
    p.add_argument("--shard", default=None, help="take sample lengths from a prepared shard (parquet) instead")
    p.add_argument("--max-length", type=int, default=None, help="clip sample lengths")
    p.add_argument("--token-budget", default="auto", help="padded tokens per batch, or auto (probe rule, <= 65536)")
    p.add_argument("--storage", default="bf16", choices=["bf16", "fp8"])
    p.add_argument("--out-dir", default="/tmp/draftsmith-bench", help="local disk: the shard is really written")
    p.add_argument("--keep", action="store_true", help="keep the written shard")
    p.add_argument("--dtype", default="auto", help="auto = bf16 on GPU, fp32 on CPU")
    p.add_argument("--repeats", type=int, default=1, help="bare/extract pairs; the fastest of each is reported")
    p.add_argument("--naive-fraction", type=float, default=0.1, help="share of samples for path (c); 0 skips it")
    p.add_argument("--naive-budget", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    p.add_argument("--gpus", type=int, default=1, help=">1: one process per GPU at once, scaling over one GPU")
    p.add_argument("--baseline-json", default=None, help="with --gpus: a 1-GPU --json-out to skip its rerun")
    p.add_argument("--barrier-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if a.gpus > 1:
        r = benchmark.bench_multi(sys.argv[1:], a.gpus, __file__, a.baseline_json, a.out_dir)
        print(f"{a.gpus} GPUs at once: {r['per_gpu_extract_tokens_per_s']} tok/s each, total "
              f"{r['total_extract_tokens_per_s']:.0f}; one GPU alone {r['one_gpu_extract_tokens_per_s']:.0f}; "
              f"scaling {r['scaling']:.2f}x; written {r['written_gb_per_s_total']:.2f} GB/s in all; "
              f"storage-limited {r['storage_limited']}")
    else:
        r = benchmark.bench(a.shape, a.num_layers, a.tokens, a.shard or a.lengths, a.token_budget, a.storage,
                            a.out_dir, a.dtype, a.repeats, a.naive_fraction, a.naive_budget, a.max_length, a.keep,
                            a.seed, a.barrier_dir, a.world, a.rank)
        print(benchmark.table(r))
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_out).write_text(json.dumps(r, indent=2) + "\n")
