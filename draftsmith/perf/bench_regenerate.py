"""Regeneration throughput: the slot engine against Transformers' `generate`, in one run, on a random-weight
target.

Builds a preset shape (configs/shapes/, or tiny-hybrid / tiny-attention) from its config alone, directly on
the GPU in bf16, draws random prompts, and prints new tokens/s of the engine at each batch size (prompts =
batch x waves, so finished answers are refilled) and of `generate` against the engine on the same prompts at
the given batch sizes, end to end and decoding alone. EOS is off: every answer is `--new-tokens` long, or with
`--spread` the comparison's answers get lengths from 1/8 to all of `--generate-new-tokens` (generate then runs
each batch to its longest one). A greedy check compares the first tokens with `generate` at batch 1; on a GPU
the in-place decode kernels are checked against the functions they replace.
Without a GPU it runs the tiny shape on the CPU (a smoke run, not a measurement)."""

from __future__ import annotations

import argparse
import time

import torch

from draftsmith.core.io import write_json
from draftsmith.core.runtime import resolve_dtype, sync_device
from draftsmith.engine.engine import PREFILL_TOKENS, Engine
from draftsmith.engine.kernel_checks import time_kernels
from draftsmith.perf.profile_extract import time_by_kind
from draftsmith.perf.regeneration import bare_forward_s, bench, kernel_variants
from draftsmith.perf.shapes import TINY_SHAPES, build_model, load_shape
from draftsmith.target.kernels import report_kernels, use_fla_conv


def admit_times(
    model, vocab: int, prompt_len: int, sizes: list[int], seed: int = 0, *, packed: bool = False, log=print
) -> list[dict]:
    """Seconds to admit (prefill and load into slots) a group of each size of `prompt_len`-token prompts, the
    first time and again, against the bare forward of the same prompts: the first admission includes
    compiling and autotuning whatever kernels are specialised on that size (`packed`: prefill groups as packed
    rows, Engine's option)."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, vocab, (prompt_len,), generator=g).tolist() for _ in range(max(sizes))]
    engine = Engine(model, slots=max(sizes), max_len=prompt_len + 2, eos_ids=[], packed=packed)
    rows = []
    for size in sizes:
        times = []
        for _ in range(2):
            sync_device(device)
            t0 = time.perf_counter()
            engine._admit(list(range(size)), prompts[:size], [1] * size)
            sync_device(device)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        engine._prefill(prompts[:size])
        sync_device(device)
        prefill_s = time.perf_counter() - t0
        bare_s = bare_forward_s(model, prompts[:size])
        rows.append(
            {
                "group": size,
                "packed": packed,
                "packed_calls": engine.packed_calls,  # so far; 0 with packed on a GPU: packing never ran
                "first_s": times[0],
                "again_s": times[1],
                "prefill_s": prefill_s,
                "tokens_per_s": size * prompt_len / times[1],
                "bare_forward_s": bare_s,
                "bare_tokens_per_s": size * prompt_len / bare_s,
                "vs_bare": bare_s / times[1],
            }
        )
        log(
            f"admit {size:3d} prompts of {prompt_len}{' packed' if packed else ''}: first {times[0]:.2f}s, "
            f"again {times[1]:.3f}s (prefill alone {prefill_s:.3f}s, {rows[-1]['tokens_per_s']:.0f} prompt "
            f"tok/s; the bare forward {rows[-1]['bare_tokens_per_s']:.0f}: {rows[-1]['vs_bare']:.2f} of it)"
        )
    return rows


def profile_steps(
    model,
    vocab: int,
    slots: int,
    prompt_len: int,
    steps: int = 4,
    rows: int = 15,
    new_tokens: int = 64,
    fused: bool = True,
    layer_kernels: bool = True,
) -> str:
    """The top kernels of `steps` eager decode steps with every slot live, then a step's GPU time by kind of
    work: where a step's time goes, and what a CUDA graph of the step (no launch gaps) would cost at least
    (each slot's cache holds room for `new_tokens` answers)."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, vocab, (prompt_len,), generator=g).tolist() for _ in range(slots)]
    engine = Engine(
        model,
        slots=slots,
        max_len=prompt_len + new_tokens + 1,
        eos_ids=[],
        fused_kernels=fused,
        layer_kernels=layer_kernels,
    )
    engine.run(prompts[:1], 4, progress=False)  # warm-up
    group = max(1, PREFILL_TOKENS // prompt_len)  # as the engine admits: a whole batch at once would not fit
    for first in range(0, slots, group):
        ids = list(range(first, min(slots, first + group)))
        engine._admit(ids, [prompts[i] for i in ids], [new_tokens] * len(ids))
    for _ in range(2):
        engine._step()
    sync_device(engine.device)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]
    ) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine._step()
        sync_device(engine.device)
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    kinds = [
        f"GPU time a step by kind of work, {slots} slots ({wall / steps * 1e3:.1f} ms a profiled eager step):"
    ]
    kinds += ["| kind | ms a step | share of the eager step |", "| --- | --- | --- |"]
    kinds += [f"| {k} | {s / steps * 1e3:.2f} | {share:.3f} |" for k, s, share in time_by_kind(events, wall)]
    table = events.table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60)
    return table + "\n" + "\n".join(kinds)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="qwen3.6-27b")
    p.add_argument("--batch-sizes", default="16,32,64,128,256")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--waves", type=int, default=2, help="prompts per slot: refills happen from the second on")
    p.add_argument("--generate-batches", default="64", help="batch sizes at which to time generate")
    p.add_argument("--generate-new-tokens", type=int, default=64)
    p.add_argument("--generate-waves", type=int, default=1, help="prompts per batch slot in the comparison")
    p.add_argument(
        "--spread", action="store_true", help="comparison answers of different lengths (see above)"
    )
    p.add_argument(
        "--unfused-batches", default="", help="also time these batches without the Triton decode kernels"
    )
    p.add_argument(
        "--plain-layer-batches",
        default="",
        help="also time these batches with Transformers' RMSNorms and gated MLPs (target.fusion's kernels "
        "otherwise)",
    )
    p.add_argument(
        "--eager-batches", default=None, help="with --cuda-graph, the batches also timed eagerly (all)"
    )
    p.add_argument("--check-prompts", type=int, default=4)
    p.add_argument("--check-tokens", type=int, default=32)
    p.add_argument(
        "--cuda-graph", action="store_true", help="also time the engine with its step as a CUDA graph"
    )
    p.add_argument(
        "--profile-batch",
        type=int,
        default=0,
        help="first print the top kernels of decode steps at this batch, and a step's GPU time by kind "
        "(with Transformers' norms and MLPs, or without any in-place kernels, too where "
        "--plain-layer-batches or --unfused-batches name this batch)",
    )
    p.add_argument("--kernel-times", action="store_true", help="first time the in-place decode kernels alone")
    p.add_argument(
        "--admit-sizes", default="", help="first time admitting prompt groups of these sizes, cold and warm"
    )
    p.add_argument(
        "--any-group-size",
        action="store_true",
        help="prefill refill groups of any size, not only powers of two (the A/B of Engine.pow2_groups)",
    )
    p.add_argument(
        "--min-refill",
        type=int,
        default=1,
        help="free slots wait for this many before a refill (Engine.min_refill; for the A/B, run 1 and k in "
        "one call)",
    )
    p.add_argument(
        "--spread-engine", action="store_true", help="engine rows with answers of 1/8 to all of --new-tokens"
    )
    p.add_argument(
        "--again", action="store_true", help="rerun each engine row warm (every group size compiled)"
    )
    p.add_argument(
        "--dtype", default="auto", help="auto (bf16 on a GPU), bf16 or fp32: fp32 tells rounding from bugs"
    )
    p.add_argument(
        "--packed",
        action="store_true",
        help="prefill groups as one packed row of segments (one fla compilation for every group size)",
    )
    p.add_argument("--json-out", default=None)
    return p


def _cpu_smoke_run(a: argparse.Namespace) -> None:
    """Without a GPU only a tiny shape runs, at sizes a CPU gets through quickly (a smoke run, not a
    measurement)."""
    a.shape, a.batch_sizes, a.generate_batches, a.prompt_len, a.new_tokens = "tiny-hybrid", "4,8", "8", 32, 16
    a.generate_new_tokens, a.check_prompts, a.check_tokens = 16, 2, 8


def _first_figures(model, a: argparse.Namespace, device: torch.device) -> list[dict]:
    """What --kernel-times, --profile-batch and --admit-sizes ask to print before the benchmark; the admit
    rows."""
    if a.kernel_times and device.type == "cuda":
        for slots in (64, 128, 256):
            times = time_kernels(device, slots)
            print(f"decode kernels, one layer at {slots} slots, ms per call:", times)
    if a.profile_batch:
        on_gpu = device.type == "cuda"  # the A/Bs need the kernels they turn off
        variants = kernel_variants(
            a.profile_batch,
            plain_layer_batches=_ints(a.plain_layer_batches) if on_gpu else (),
            unfused_batches=_ints(a.unfused_batches) if on_gpu else (),
        )
        for fused, layer_kernels in variants:
            print(
                f"profile at batch {a.profile_batch}, in-place kernels {fused}, layer kernels", layer_kernels
            )
            print(
                profile_steps(
                    model,
                    model.config.get_text_config().vocab_size,
                    a.profile_batch,
                    a.prompt_len,
                    new_tokens=a.new_tokens,
                    fused=fused,
                    layer_kernels=layer_kernels,
                )
            )
    admit = []
    if a.admit_sizes:
        admit = admit_times(
            model,
            model.config.get_text_config().vocab_size,
            a.prompt_len,
            [int(x) for x in a.admit_sizes.split(",")],
            packed=a.packed,
        )
    return admit


def _ints(spec: str) -> tuple[int, ...]:
    """A comma-separated flag; empty entries (an empty flag, a trailing comma) are skipped."""
    return tuple(int(x) for x in spec.split(",") if x)


def main(argv: list[str] | None = None) -> None:
    a = _parser().parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and a.shape not in TINY_SHAPES:
        _cpu_smoke_run(a)
    fields, _ = load_shape(a.shape)
    model = build_model(fields, None, device, resolve_dtype(a.dtype, device))
    use_fla_conv(model)
    print(
        f"target {a.shape}: {sum(x.numel() for x in model.parameters()) / 1e9:.2f}B params on {device}; "
        f"{report_kernels(model)}"
    )
    admit = _first_figures(model, a, device)
    r = bench(
        model,
        model.config.get_text_config().vocab_size,
        batch_sizes=list(_ints(a.batch_sizes)),
        prompt_len=a.prompt_len,
        new_tokens=a.new_tokens,
        waves=a.waves,
        generate_batches=list(_ints(a.generate_batches)),
        generate_new_tokens=a.generate_new_tokens,
        check_prompts=a.check_prompts,
        check_tokens=a.check_tokens,
        graphs=(False, True) if a.cuda_graph else (False,),
        generate_waves=a.generate_waves,
        spread=a.spread,
        unfused_batches=_ints(a.unfused_batches),
        plain_layer_batches=_ints(a.plain_layer_batches),
        eager_batches=None if a.eager_batches is None else _ints(a.eager_batches),
        pow2_groups=not a.any_group_size,
        min_refill=a.min_refill,
        spread_engine=a.spread_engine,
        again=a.again,
        packed=a.packed,
    )
    r["admit"] = admit
    if a.json_out:
        write_json(a.json_out, r)


if __name__ == "__main__":
    main()
