"""The drafter's FlexAttention kernels, forward and backward, at the Qwen3.6-27B drafter's shape (24 heads, 4
KV heads, head_dim 256, full and sliding layers), built on this GPU and each built again for another GPU
architecture (argv[1], e.g. 120 for sm_120) beside it. Prints one JSON line: every kernel's shared memory for
that architecture, and the milliseconds of a forward and backward here. test_flex_tiles.py runs it in a
process of its own, with fresh Inductor and Triton caches (so that every kernel is compiled)."""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    arch = int(sys.argv[1])
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from draftsmith.drafter.model import BlockLayout, attend, flex_tiles, tile_block_mask

    kernels: list[dict] = []
    compile_here = triton.compile

    def compile_both(src, target=None, options=None, **kw):  # Inductor calls triton.compile for each kernel
        binary = compile_here(src, target=target, options=options, **kw)
        name = getattr(src, "name", "?")
        try:
            other = compile_here(src, target=GPUTarget("cuda", arch, 32), options=options, **kw)
            kernels.append({"name": name, "shared": other.metadata.shared, "here": binary.metadata.shared})
        except Exception as e:  # a kernel that cannot be built there is a finding too
            kernels.append({"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        return binary

    triton.compile = compile_both
    dev, B, seqs, length, anchors = torch.device("cuda"), 16, 4, 1024, 64
    g = torch.Generator().manual_seed(0)
    picks = [torch.randperm(length - B - 1, generator=g)[:anchors].sort().values + 1 for _ in range(seqs)]
    layout = BlockLayout(
        torch.arange(seqs).repeat_interleave(length).to(dev),
        torch.arange(length).repeat(seqs).to(dev),
        torch.arange(seqs).repeat_interleave(anchors).to(dev),
        torch.cat(picks).to(dev),
        B,
    )
    Q, KV = layout.num_queries, layout.num_ctx + layout.num_queries
    q = torch.randn(1, 24, Q, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 4, KV, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 4, KV, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
    timings = {}
    for kind, window in (("full", None), ("sliding", 2048)):
        mask = tile_block_mask(layout, window)
        for _ in range(2):  # compile, then warm
            attend(q, k, v, mask).sum().backward()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            attend(q, k, v, mask).sum().backward()
        torch.cuda.synchronize()
        timings[kind] = (time.perf_counter() - t0) / 10 * 1e3
    print(json.dumps({"tiles": flex_tiles(256, dev), "kernels": kernels, "ms": timings}))


if __name__ == "__main__":
    main()
