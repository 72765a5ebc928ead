"""Regeneration throughput: the slot engine against Transformers' `generate`, in one run, on a random-weight target.

Builds a preset shape (configs/shapes/, or tiny-hybrid / tiny-attention) from its config alone, directly on the GPU
in bf16, draws random prompts, and prints new tokens/s of the engine at each batch size (prompts = batch x waves,
so finished answers are refilled) and of `generate` against the engine on the same prompts at the given batch sizes,
end to end and decoding alone. EOS is off: every answer is `--new-tokens` long, or with `--spread` the comparison's
answers get lengths from 1/8 to all of `--generate-new-tokens` (generate then runs each batch to its longest one).
A greedy check compares the first tokens with `generate` at batch 1; on a GPU the in-place decode kernels are
checked against the functions they replace.
Without a GPU it runs the tiny shape on the CPU (a smoke run, not a measurement).
"""

import argparse

import torch

from draftsmith import benchmark, decode_kernels, extract, regenerate, store

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="qwen3.6-27b")
    p.add_argument("--batch-sizes", default="16,32,64,128,256")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--waves", type=int, default=2, help="prompts per slot: refills happen from the second on")
    p.add_argument("--generate-batches", default="64", help="batch sizes at which to time generate")
    p.add_argument("--generate-new-tokens", type=int, default=64)
    p.add_argument("--generate-waves", type=int, default=1, help="prompts per batch slot in the comparison")
    p.add_argument("--spread", action="store_true", help="comparison answers of different lengths (see above)")
    p.add_argument("--unfused-batches", default="", help="also time these batches without the Triton decode kernels")
    p.add_argument("--eager-batches", default=None, help="with --cuda-graph, the batches also timed eagerly (all)")
    p.add_argument("--check-prompts", type=int, default=4)
    p.add_argument("--check-tokens", type=int, default=32)
    p.add_argument("--cuda-graph", action="store_true", help="also time the engine with its step as a CUDA graph")
    p.add_argument("--profile-batch", type=int, default=0, help="first print the top kernels of decode steps at this batch")
    p.add_argument("--kernel-times", action="store_true", help="first time the in-place decode kernels alone")
    p.add_argument("--admit-sizes", default="", help="first time admitting prompt groups of these sizes, cold and warm")
    p.add_argument("--any-group-size", action="store_true",
                   help="prefill refill groups of any size, not only powers of two (the A/B of Engine.pow2_groups)")
    p.add_argument("--spread-engine", action="store_true", help="engine rows with answers of 1/8 to all of --new-tokens")
    p.add_argument("--again", action="store_true", help="rerun each engine row warm (every group size compiled)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on a GPU), bf16 or fp32: fp32 tells rounding from bugs")
    p.add_argument("--json-out", default=None)
    a = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and a.shape not in benchmark.TINY_SHAPES:
        a.shape, a.batch_sizes, a.generate_batches, a.prompt_len, a.new_tokens = "tiny-hybrid", "4,8", "8", 32, 16
        a.generate_new_tokens, a.check_prompts, a.check_tokens = 16, 2, 8
    fields, _ = benchmark.load_shape(a.shape)
    model = benchmark.build_model(fields, None, device, extract.resolve_dtype(a.dtype, device))
    extract.use_fla_conv(model)
    print(f"target {a.shape}: {sum(x.numel() for x in model.parameters()) / 1e9:.2f}B params on {device}; "
          f"{extract.report_kernels(model)}")
    if a.kernel_times and device.type == "cuda":
        for slots in (64, 128):
            times = decode_kernels.time_kernels(device, slots)
            print(f"decode kernels, one layer at {slots} slots, ms per call:", times)
    if a.profile_batch:
        for fused in (True, False) if device.type == "cuda" else (True,):
            print(f"profile at batch {a.profile_batch}, in-place kernels {fused}:")
            print(regenerate.profile_steps(model, model.config.get_text_config().vocab_size, a.profile_batch,
                                           a.prompt_len, new_tokens=a.new_tokens, fused=fused))
    admit = []
    if a.admit_sizes:
        admit = regenerate.admit_times(model, model.config.get_text_config().vocab_size, a.prompt_len,
                                       [int(x) for x in a.admit_sizes.split(",")])
    sizes = [int(x) for x in a.batch_sizes.split(",") if x]
    gen = [int(x) for x in a.generate_batches.split(",") if x]
    r = regenerate.bench(model, model.config.get_text_config().vocab_size, sizes, a.prompt_len, a.new_tokens,
                         a.waves, gen, a.generate_new_tokens, a.check_prompts, a.check_tokens,
                         (False, True) if a.cuda_graph else (False,), a.generate_waves, a.spread,
                         tuple(int(x) for x in a.unfused_batches.split(",") if x),
                         None if a.eager_batches is None else tuple(int(x) for x in a.eager_batches.split(",") if x),
                         pow2_groups=not a.any_group_size, spread_engine=a.spread_engine, again=a.again)
    r["admit"] = admit
    if a.json_out:
        store.write_json(a.json_out, r)
