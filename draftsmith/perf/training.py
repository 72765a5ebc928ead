"""Training throughput of a drafter shape against the matmul ceiling."""

from __future__ import annotations

import time

import torch

from draftsmith.core.distributed import setup_device, wrap_ddp
from draftsmith.core.runtime import sync_device
from draftsmith.dataset.shards import Sample
from draftsmith.drafter.batches import make_batch, pick_anchors
from draftsmith.drafter.config import DrafterConfig
from draftsmith.drafter.loss import auto_gamma, block_loss, position_weights
from draftsmith.drafter.model import BlockLayout, Drafter, build_masks, uses_flex
from draftsmith.perf.shapes import matmul_ceiling


def step_flops(cfg: DrafterConfig, layout: BlockLayout, num_labels: int) -> float:
    """Model FLOPs of one training step (forward + backward), counting only work the model must do: matmuls at
    2 FLOPs/MAC, attention only over unmasked keys, no recomputation; backward = 2x forward except where no
    gradient is needed (fc and the LM head get no input gradient; layer 0's block q/k/v get no input
    gradient)."""
    H, nh, nkv, d, inter, B = (
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.block_size,
    )
    Q, T = layout.num_queries, layout.num_ctx
    q_o = 2 * (2 * H * nh * d)  # q_proj + o_proj per query
    kv = 2 * (2 * H * nkv * d)  # k_proj + v_proj per token
    mlp = 3 * (2 * H * inter)
    anchors = layout.anchor.double().cpu()  # the count is host arithmetic: no device tensors, no syncs
    k = torch.arange(B, dtype=torch.float64)
    total = 0.0
    for i, t in enumerate(cfg.layer_types):
        per_query_linear = q_o + kv + mlp
        total += 3 * Q * per_query_linear - (Q * (2 * H * nh * d + kv) if i == 0 else 0)
        total += 3 * T * kv  # context keys/values (their gradient flows back to fc)
        if t == "sliding_attention":
            ctx_keys = torch.minimum(anchors[:, None], (cfg.sliding_window - k)[None, :].clamp_min(0)).sum()
        else:
            ctx_keys = anchors.sum() * B
        keys = float(ctx_keys) + Q * B  # every query also sees its whole block
        total += 3 * 4 * nh * d * keys  # QK^T and PV, forward + 2x backward
    total += 2 * T * 2 * (cfg.num_taps * H) * H  # fc: forward + weight gradient
    total += 2 * num_labels * 2 * H * cfg.vocab_size  # LM head: forward + input gradient
    return total


def benchmark(
    cfg: DrafterConfig,
    seq_len: int,
    seqs_per_step: int,
    anchors_per_seq: int,
    steps: int,
    warmup: int,
    seed: int = 0,
) -> dict:
    """The real training step (block-sparse forward, chunked loss, backward, clip, AdamW) on random weights
    and data of the given shape; under torchrun each rank runs it on its own GPU with DDP."""
    rank, world, device = setup_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(seed + rank)
    with torch.device(device):  # initialised on the device: a 1.8B-parameter CPU init takes minutes
        model = Drafter(cfg)
    ddp = wrap_ddp(model, device) if world > 1 else model
    embed = (torch.randn(cfg.vocab_size, cfg.hidden_size, device=device) * 0.02).to(dtype)
    head = (torch.randn(cfg.vocab_size, cfg.hidden_size, device=device) * 0.02).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    g = torch.Generator().manual_seed(seed + rank)
    samples, anchors = [], []
    for _ in range(seqs_per_step):
        ids = torch.randint(0, cfg.vocab_size, (seq_len,), generator=g)
        mask = torch.ones(seq_len, dtype=torch.bool)
        samples.append(
            Sample(
                torch.randn(seq_len, cfg.num_taps * cfg.hidden_size, generator=g).to(torch.bfloat16),
                ids,
                mask,
            )
        )
        anchors.append(pick_anchors(mask, anchors_per_seq, [seed, rank, len(samples)]))
    batch = make_batch(samples, anchors, cfg.block_size, cfg.mask_token_id).to(device, dtype)
    pos_w = position_weights(cfg.block_size, auto_gamma(cfg.block_size))
    masks = build_masks(batch.layout, cfg, uses_flex(cfg, device))
    flops = step_flops(cfg, batch.layout, int((batch.labels >= 0).sum()))
    ceiling = matmul_ceiling(device)

    def one_step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss, _, _ = block_loss(ddp, embed, head, batch, masks, pos_w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(warmup):
        one_step()
    sync_device(device)
    if world > 1:
        torch.distributed.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    sync_device(device)
    if world > 1:
        torch.distributed.barrier()
    dt = (time.perf_counter() - t0) / steps
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "world_size": world,
        "params": sum(p.numel() for p in model.parameters()),
        "context_tokens_per_step": batch.num_tokens * world,
        "block_positions_per_step": batch.layout.num_queries * world,
        "step_s": dt,
        "tokens_per_s": batch.num_tokens * world / dt,
        "model_flops_per_token": flops / batch.num_tokens,
        "achieved_tflops_per_gpu": flops / dt / 1e12,
        "matmul_ceiling_tflops": ceiling / 1e12,
        "fraction_of_ceiling": flops / dt / ceiling,
        "peak_mem_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    if world > 1:
        torch.distributed.destroy_process_group()
    return result
