"""Extraction throughput on a random-weight target of a real shape: bare forward vs the real extraction path.

Builds the target from its config only (presets in configs/shapes/, or a model directory) directly on the GPU,
draws a realistic token stream, and in one run on identical batches times (a) the bare body forward, (b) the
real extraction (batching, hooks, device-to-host copies, writer thread, a real shard on --out-dir) and (c) the
naive `model(ids, output_hidden_states=True)` on a subset. Prints tokens/s, (b)/(a), fraction of a matmul
ceiling measured in the same run, padding waste, device idle time and write rates. Without a GPU it runs on
the CPU (use a small shape or --num-layers) and prints the same ratios. --gpus N runs one process per GPU at
once, like N workflow extraction jobs, and prints the scaling over one GPU."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from draftsmith.perf.extraction import bench


def table(r: dict) -> str:
    """The printed summary: one line per figure, with what it means."""
    rows = [
        ("device", r["device"], ""),
        (
            "target",
            f"{r['model_type']} {r['layers_run']}/{r['num_layers']} layers run, hidden {r['hidden_size']}, "
            f"{r['dtype']}, storage {r['storage']}",
            r["kernels"],
        ),
        (
            "tokens / samples / batches",
            f"{r['tokens']} / {r['samples']} / {r['batches']}",
            f"{r['lengths']}, token budget {r['token_budget']}",
        ),
        ("padding waste", f"{100 * r['padding_waste']:.1f}%", "padded tokens computed for nothing"),
        (
            "matmul ceiling",
            f"{r['matmul_ceiling_tflops']:.1f} TFLOP/s",
            "bf16 8192^3 (fp32 1024^3 on CPU), same run",
        ),
        (
            "model FLOPs / token",
            f"{r['model_flops_per_token'] / 1e9:.2f} GFLOP",
            "useful: layers run, real lengths",
        ),
        (
            "(a) bare forward",
            f"{r['bare_tokens_per_s']:.0f} tok/s",
            f"{r['bare_fraction_of_ceiling']:.2f} of ceiling",
        ),
        (
            "(b) extraction",
            f"{r['extract_tokens_per_s']:.0f} tok/s",
            f"{r['extract_fraction_of_ceiling']:.2f} of ceiling",
        ),
        ("(b)/(a)", f"{r['extract_over_bare']:.3f}", "end-to-end extraction over bare forward, same batches"),
        (
            "device idle",
            f"{r['gpu_idle_s']:.2f}s of {r['extract_stats']['seconds']:.2f}s "
            f"({100 * r['gpu_idle_fraction']:.1f}%)",
            "waiting on host, writer or disk",
        ),
        ("waited on writer / flush", f"{r['writer_wait_s']:.2f}s / {r['flush_s']:.2f}s", ""),
        ("written", f"{r['written_gb_per_s']:.3f} GB/s", f"{r['bytes_per_token'] / 1e3:.1f} KB/token"),
        (
            "produce vs storage",
            f"{r['produce_gb_per_s']:.3f} vs {r['storage_gb_per_s']:.3f} GB/s",
            "STORAGE-LIMITED" if r["storage_limited"] else "compute-limited",
        ),
    ]
    if "naive_tokens_per_s" in r:
        rows.append(
            (
                "(c) naive output_hidden_states",
                f"{r['naive_tokens_per_s']:.0f} tok/s",
                f"{r['naive_over_bare']:.3f} of bare on the same {r['naive_tokens']}-token subset (bare "
                f"there {r['naive_bare_tokens_per_s']:.0f} tok/s)",
            )
        )
    elif "naive_error" in r:
        rows.append(("(c) naive output_hidden_states", "failed", r["naive_error"]))
    w = max(len(a) for a, _, _ in rows)
    v = max(len(b) for _, b, _ in rows)
    return "\n".join(f"{a:<{w}}  {b:<{v}}  {c}".rstrip() for a, b, c in rows)


def strip_flags(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """Command-line arguments without the given `--flag value` pairs (the multi-GPU launcher sets them
    itself)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in flags:
            skip = True
        elif not any(x.startswith(f + "=") for f in flags):
            out.append(x)
    return out


def bench_multi(argv: list[str], gpus: int, script: str, baseline: str | None, out_dir: str) -> dict:
    """One benchmark process per GPU, started together (as the workflow runs one extraction job per GPU, all
    on the same disk), timed phases aligned by a file barrier; scaling = summed tokens/s over one GPU
    alone."""
    import tempfile

    def launch(n: int) -> list[dict]:
        with tempfile.TemporaryDirectory() as tmp:
            procs = []
            for rank in range(n):
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(rank)}
                cmd = [
                    sys.executable,
                    script,
                    *argv,
                    "--naive-fraction",
                    "0",
                    "--json-out",
                    f"{tmp}/r{rank}.json",
                    "--barrier-dir",
                    tmp,
                    "--world",
                    str(n),
                    "--rank",
                    str(rank),
                    "--out-dir",
                    out_dir,
                ]
                procs.append(subprocess.Popen(cmd, env=env))
            codes = [p.wait() for p in procs]
            if any(codes):
                raise RuntimeError(f"benchmark processes failed with exit codes {codes}")
            return [json.loads(Path(f"{tmp}/r{rank}.json").read_text()) for rank in range(n)]

    argv = strip_flags(argv, ("--gpus", "--baseline-json", "--json-out", "--out-dir", "--naive-fraction"))
    one = json.loads(Path(baseline).read_text()) if baseline else launch(1)[0]
    many = launch(gpus)
    total = sum(r["extract_tokens_per_s"] for r in many)
    return {
        "gpus": gpus,
        "one_gpu_extract_tokens_per_s": one["extract_tokens_per_s"],
        "per_gpu_extract_tokens_per_s": [r["extract_tokens_per_s"] for r in many],
        "total_extract_tokens_per_s": total,
        "scaling": total / one["extract_tokens_per_s"],
        "storage_limited": [r["storage_limited"] for r in many],
        "written_gb_per_s_total": sum(r["written_gb_per_s"] for r in many),
        "runs": many,
        "baseline": one,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--shape", default="qwen3.6-27b", help="shape JSON, preset name (configs/shapes) or model dir"
    )
    p.add_argument(
        "--num-layers", type=int, default=None, help="shrink the depth (taps become the DFlash default)"
    )
    p.add_argument("--tokens", type=int, default=400_000)
    p.add_argument("--lengths", default="loguniform:64:8192", help="loguniform:LO:HI")
    p.add_argument(
        "--shard", default=None, help="take sample lengths from a prepared shard (parquet) instead"
    )
    p.add_argument("--max-length", type=int, default=None, help="clip sample lengths")
    p.add_argument(
        "--token-budget", default="auto", help="padded tokens per batch, or auto (probe rule, <= 65536)"
    )
    p.add_argument("--storage", default="bf16", choices=["bf16", "fp8"])
    p.add_argument(
        "--out-dir", default="/tmp/draftsmith-bench", help="local disk: the shard is really written"
    )
    p.add_argument("--keep", action="store_true", help="keep the written shard")
    p.add_argument("--dtype", default="auto", help="auto = bf16 on GPU, fp32 on CPU")
    p.add_argument(
        "--repeats", type=int, default=1, help="bare/extract pairs; the fastest of each is reported"
    )
    p.add_argument(
        "--naive-fraction", type=float, default=0.1, help="share of samples for path (c); 0 skips it"
    )
    p.add_argument("--naive-budget", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    p.add_argument(
        "--gpus", type=int, default=1, help=">1: one process per GPU at once, scaling over one GPU"
    )
    p.add_argument("--baseline-json", default=None, help="with --gpus: a 1-GPU --json-out to skip its rerun")
    p.add_argument("--barrier-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    a = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if a.gpus > 1:
        r = bench_multi(sys.argv[1:], a.gpus, __file__, a.baseline_json, a.out_dir)
        print(
            f"{a.gpus} GPUs at once: {r['per_gpu_extract_tokens_per_s']} tok/s each, total "
            f"{r['total_extract_tokens_per_s']:.0f}; one GPU alone {r['one_gpu_extract_tokens_per_s']:.0f}; "
            f"scaling {r['scaling']:.2f}x; written {r['written_gb_per_s_total']:.2f} GB/s in all; "
            f"storage-limited {r['storage_limited']}"
        )
    else:
        r = bench(
            a.shape,
            a.num_layers,
            tokens=a.tokens,
            lengths_spec=a.shard or a.lengths,
            token_budget=a.token_budget,
            storage=a.storage,
            out_dir=a.out_dir,
            dtype=a.dtype,
            repeats=a.repeats,
            naive_fraction=a.naive_fraction,
            naive_budget=a.naive_budget,
            max_length=a.max_length,
            keep=a.keep,
            seed=a.seed,
            barrier_dir=a.barrier_dir,
            world=a.world,
            rank=a.rank,
        )
        print(table(r))
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_out).write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
