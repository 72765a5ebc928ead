"""The block loss: cross-entropy on block positions 1..B-1 with DFlash's decaying position weights."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from draftsmith.drafter.batches import Batch

FUSED_LOSS_ENV = "DRAFTSMITH_FUSED_LOSS"  # "1": the loss's chunk terms compiled on a GPU (docs/drafter.md)


def auto_gamma(block_size: int) -> float:
    """Loss decay of the DFlash paper: 7 for B=16, 5 for B=10, 4 for B=8; scaled with B otherwise."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, 7.0 * block_size / 16))


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Weight of block positions 0..B-1: 0 for the anchor, exp(-(k-1)/gamma) for k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def chunk_terms(
    logits: torch.Tensor, labels: torch.Tensor, row_w: torch.Tensor, dtype: torch.dtype, *, grad: bool = True
):
    """One chunk's weighted CE sum, argmax and dL/dlogits (None without `grad`), from its logits [n, V] (the
    head's dtype).

    One function so that Inductor can fuse it on a GPU. Eager PyTorch makes about eight passes over a chunk's
    fp32 logits (the upcast, log-sum-exp, argmax, softmax, the label's minus one, the row weights, the
    downcast); for a small drafter's large vocabulary those passes can cost more than the head's matmuls.
    """
    x = logits.float()  # [n, V]
    del logits  # the caller keeps no reference: the head's-dtype logits are freed before the fp32 passes
    lse = torch.logsumexp(x, dim=-1)  # [n]
    loss = (row_w * (lse - x.gather(1, labels[:, None]).squeeze(1))).sum()
    pred = x.argmax(-1)  # [n]
    if not grad:
        return loss, pred, None
    # eagerly, the arithmetic and memory of the loss before it was one function
    g = torch.softmax(x, dim=-1)  # [n, V]
    g[torch.arange(labels.shape[0], device=x.device), labels] -= 1.0
    return loss, pred, (g * row_w[:, None]).to(dtype)


_fused_terms = None  # chunk_terms compiled, built at the first GPU step


def terms_for(device: torch.device):
    """chunk_terms eagerly, or compiled on a GPU with DRAFTSMITH_FUSED_LOSS=1. Opt-in until an sm_120 card
    has compiled and timed it (docs/drafter.md). Never on the CPU, where Inductor would need a C++
    compiler and the tests' chunks are small."""
    global _fused_terms
    if device.type != "cuda" or os.environ.get(FUSED_LOSS_ENV) != "1":
        return chunk_terms
    if _fused_terms is None:
        _fused_terms = torch.compile(chunk_terms, dynamic=True)
    return _fused_terms


class ChunkedCrossEntropy(torch.autograd.Function):
    """Weighted cross-entropy through a frozen LM head, in row chunks: logits never exist for all rows at
    once.

    The gradient w.r.t. the hidden states is computed chunk by chunk in the forward pass (the head is frozen,
    so that is all backward needs): memory is rows x H plus one chunk x V, whatever the vocabulary.
    """

    @staticmethod
    def forward(ctx, h, weight, labels, row_w, chunk: int):
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        pred = torch.empty_like(labels)
        grad = torch.empty_like(h) if h.requires_grad else None
        terms = terms_for(h.device)
        for i in range(0, h.shape[0], chunk):
            hc = h[i : i + chunk]
            lab, w = labels[i : i + chunk], row_w[i : i + chunk]
            # the logits [n, V] passed without a name here, so that chunk_terms can free them once upcast
            part, pred[i : i + chunk], g = terms(
                hc.to(weight.dtype) @ weight.T, lab, w, weight.dtype, grad=grad is not None
            )
            loss += part
            if grad is not None and g is not None:
                grad[i : i + chunk] = (g @ weight).to(h.dtype)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(pred)
        return loss, pred

    @staticmethod
    def backward(ctx, grad_loss, _grad_pred):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None


def chunk_rows(vocab_size: int, budget_elems: int = 1 << 27) -> int:
    """Rows per loss chunk so one chunk of fp32 logits stays ~512 MB (248k vocab: 540 rows)."""
    return max(1, budget_elems // vocab_size)


def block_loss(
    model: torch.nn.Module,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    batch: Batch,
    masks: dict,
    pos_w: torch.Tensor,
    runs: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean weighted CE over trained block positions; also per-position (correct, count) over [B]. With `runs`
    given, appends each block's run of correct predictions from position 1 (what the real loop would accept
    there) for the blocks that have a position-1 label."""
    B = batch.layout.block_size
    x = F.embedding(batch.block_tokens, embed)
    h = model(batch.taps, batch.layout.ctx_pos, x, batch.query_positions(), masks)
    slot = torch.arange(batch.labels.shape[0], device=h.device) % B
    keep = batch.labels >= 0
    rows, lab, slot = h[keep], batch.labels[keep], slot[keep]
    w = pos_w.to(h.device)[slot]
    total, pred = ChunkedCrossEntropy.apply(rows, lm_head, lab, w, chunk_rows(lm_head.shape[0]))
    denom = w.sum().clamp_min(1e-9)
    loss = total / denom if rows.shape[0] else h.sum() * 0.0  # keeps DDP's graph whole on an empty batch
    correct = torch.zeros(B, device=h.device).index_add_(0, slot, (pred == lab).float())
    count = torch.zeros(B, device=h.device).index_add_(0, slot, torch.ones_like(w))
    if runs is not None:
        hit = torch.zeros(batch.labels.shape[0], dtype=torch.long, device=h.device)
        hit[keep] = (pred == lab).long()
        hit = hit.view(-1, B)[:, 1:]  # [blocks, B-1]; a missing label ends the run, as an answer's end does
        scored = batch.labels.view(-1, B)[:, 1] >= 0
        runs.append(hit.cumprod(dim=1).sum(dim=1)[scored])
    return loss, correct, count
