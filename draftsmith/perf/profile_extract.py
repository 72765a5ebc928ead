"""Where a bare extraction forward spends its GPU time, and what fla's short-convolution kernel changes.

Builds a random-weight target of a preset shape on the GPU, times the bare body forward on a log-uniform
length mix with Transformers' torch convolution fallback and then with fla's Triton causal conv (same batches,
one run), and prints the top CUDA kernels of a profiled pass. A GPU tool: it reads what the benchmark alone
does not say."""

from __future__ import annotations

import argparse

import torch
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
from draftsmith.target.kernels import use_fla_conv
from draftsmith.target.taps import forward_taps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="qwen3.6-27b")
    p.add_argument("--tokens", type=int, default=120_000)
    p.add_argument("--budget", type=int, default=65536)
    p.add_argument("--top", type=int, default=25)
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

    def timed(label: str) -> None:
        run_bare(model, staged, taps, device)  # warm-up, autotuning
        s = min(run_bare(model, staged, taps, device) for _ in range(2))
        print(
            f"{label}: {lengths.sum() / s:.0f} tok/s, {flops / s / ceiling:.3f} of the {ceiling / 1e12:.0f} "
            "TFLOP/s ceiling"
        )

    timed("torch conv fallback")
    if use_fla_conv(model):
        timed("fla causal_conv1d")
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for ids, _ in staged:
            forward_taps(model, ids, None, taps)
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=a.top, max_name_column_width=70)
    )


if __name__ == "__main__":
    main()
