"""Where a bare extraction forward spends its GPU time, and what fla's short-convolution kernel changes.

Builds a random-weight target of a preset shape on the GPU, times the bare body forward on a log-uniform
length mix with Transformers' torch convolution fallback and then with fla's Triton causal conv (same batches,
one run; with --compare-layer-kernels also with Transformers' gated MLPs, then its RMSNorms too, instead of
target.fusion's kernels), and prints the top CUDA kernels of a profiled pass and its GPU time by kind of work
(matmul, attention, the Gated DeltaNet chunk kernels, convolution, element-wise) against the pass's wall time,
the rest being launch gaps and host work. A GPU tool: it reads what the benchmark alone does not say."""

from __future__ import annotations

import argparse
import re
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from draftsmith.config import default_taps
from draftsmith.dataset.plan import make_batches
from draftsmith.perf.extraction import (
    draw_lengths,
    matmul_ceiling,
    model_flops,
    random_samples,
    run_bare,
    stage_batches,
)
from draftsmith.perf.shapes import build_model, load_shape
from draftsmith.target.fusion import fused_modules, kernel_modules
from draftsmith.target.kernels import use_fla_conv
from draftsmith.target.norms import norm_form
from draftsmith.target.taps import forward_taps

# kernel names (CUDA, Triton) by the kind of work they do; the first pattern that matches wins
KINDS = (
    ("matmul", r"gemm|xmma|cutlass|nvjet|cublas|wgmma|matmul"),
    ("attention", r"flash|fmha|attention|attend|sdpa|softmax"),
    (
        "gated deltanet",
        r"chunk|kkt|solve_tril|inverse|recompute_w_u|fwd_h|fwd_o|l2norm|cumsum|gated_delta|gdn_step|recurrent",
    ),
    ("convolution", r"conv"),
    (
        "norms and element-wise",
        r"elementwise|vectorized|reduce|norm|silu|sigmoid|softplus|exp|mul|add|cat|copy|index|fill",
    ),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def time_by_kind(events, wall_s: float) -> list[tuple[str, float, float]]:
    """(kind, GPU seconds, share of wall time) per kind, then the wall time no kernel covered."""
    totals: dict[str, float] = {}
    for e in events:
        # a CPU op: the kernels it launched are counted as themselves
        if getattr(e, "device_type", None) == DeviceType.CPU:
            continue
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            totals[kind_of(e.key)] = totals.get(kind_of(e.key), 0.0) + us / 1e6
    rows = sorted(((k, s, s / wall_s) for k, s in totals.items()), key=lambda r: -r[1])
    idle = max(0.0, wall_s - sum(totals.values()))
    return rows + [("no kernel running (launch gaps, host)", idle, idle / wall_s)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="qwen3.6-27b")
    p.add_argument("--tokens", type=int, default=120_000)
    p.add_argument("--budget", type=int, default=65536)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--compare-conv", action="store_true", help="time the torch convolution fallback too")
    p.add_argument(
        "--compare-layer-kernels",
        action="store_true",
        help="time the forward with Transformers' RMSNorms and gated MLPs too (target.fusion's kernels "
        "otherwise)",
    )
    a = p.parse_args(argv)
    device = torch.device("cuda")
    fields, taps = load_shape(a.shape)
    model = build_model(fields, None, device, torch.bfloat16)
    cfg = model.config.get_text_config()
    taps = taps or default_taps(cfg.num_hidden_layers)
    lengths = draw_lengths("loguniform:64:8192", a.tokens, None, 0)
    samples = random_samples(lengths, cfg.vocab_size, 1)
    staged = stage_batches(samples, make_batches(lengths, a.budget), device, 0)
    flops = model_flops(model, lengths, taps)
    ceiling = matmul_ceiling(device)

    def timed(label: str, layer_kernels: bool = True) -> None:
        run_bare(model, staged, taps, device, layer_kernels=layer_kernels)  # warm-up, autotuning
        s = min(run_bare(model, staged, taps, device, layer_kernels=layer_kernels) for _ in range(2))
        print(
            f"{label}: {lengths.sum() / s:.0f} tok/s, {flops / s / ceiling:.3f} of the {ceiling / 1e12:.0f} "
            "TFLOP/s ceiling"
        )

    if a.compare_conv:
        timed("torch conv fallback")
    if use_fla_conv(model):
        timed("fla causal_conv1d")
    elif not a.compare_conv:
        timed("torch conv fallback")
    if a.compare_layer_kernels:
        every = kernel_modules(model)
        norms = [m for m in every if norm_form(m) is not None]
        with fused_modules(norms):  # the forward's own switch off: only the norms' kernels run
            timed(f"the same with Transformers' {len(every) - len(norms)} gated MLPs", layer_kernels=False)
        timed(f"the same with Transformers' {len(norms)} norms and gated MLPs too", layer_kernels=False)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for ids, _ in staged:
            forward_taps(model, ids, None, taps)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    print(events.table(sort_by="self_cuda_time_total", row_limit=a.top, max_name_column_width=70))
    print(f"GPU time by kind of work, profiled pass of {wall:.2f} s (profiling adds a little):")
    print("| kind | seconds | share of the pass |\n| --- | --- | --- |")
    for kind, secs, share in time_by_kind(events, wall):
        print(f"| {kind} | {secs:.2f} | {share:.3f} |")


if __name__ == "__main__":
    main()
