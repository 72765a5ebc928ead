"""Training batches: anchors drawn from response tokens, packed sequences, the epoch plan."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from draftsmith.dataset.merge import MergedDataset
from draftsmith.dataset.shards import Sample, decode
from draftsmith.drafter.config import DrafterConfig
from draftsmith.drafter.model import BlockLayout
from draftsmith.plan.rounds import heldout_rows


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a >= 1 whose next token is trained on: the block's first prediction is a real label."""
    t = loss_mask.shape[0]
    if t < 3:
        return torch.zeros(0, dtype=torch.long)
    return torch.nonzero(loss_mask[2:]).flatten() + 1


def pick_anchors(loss_mask: torch.Tensor, n: int, seed: list[int]) -> torch.Tensor:
    """Up to n distinct anchors, sorted; seeded by [seed, epoch, sample] so every epoch draws afresh."""
    cand = anchor_candidates(loss_mask).numpy()
    if len(cand) > n:
        cand = np.sort(np.random.default_rng(seed).choice(cand, size=n, replace=False))
    return torch.from_numpy(cand).long()


@dataclass
class Batch:
    taps: torch.Tensor  # [T, n_taps*H] context tap states, sequences packed
    layout: BlockLayout  # positions / sequence ids of context tokens and blocks
    block_tokens: torch.Tensor  # [Q] anchor then MASK tokens, per block
    labels: torch.Tensor  # [Q] target token at each block position, -100 where not trained on
    num_tokens: int  # context tokens (target tokens) in the batch
    taps_scale: torch.Tensor | None = None  # [T] fp32: `taps` holds stored fp8 rows, decoded by `to`

    def query_positions(self) -> torch.Tensor:
        """RoPE positions of the block tokens: anchor .. anchor + B - 1."""
        lay = self.layout
        return (
            lay.anchor[:, None] + torch.arange(lay.block_size, device=lay.anchor.device)[None, :]
        ).flatten()

    def to(self, device: torch.device, dtype: torch.dtype) -> Batch:
        """The batch on `device`, its states decoded there in `dtype` (the same arithmetic as on the host)."""
        lay = self.layout
        scale = None if self.taps_scale is None else self.taps_scale.to(device, non_blocking=True)
        return Batch(
            decode(self.taps.to(device, non_blocking=True), scale, dtype),
            BlockLayout(
                lay.ctx_doc.to(device),
                lay.ctx_pos.to(device),
                lay.block_doc.to(device),
                lay.anchor.to(device),
                lay.block_size,
            ),
            self.block_tokens.to(device),
            self.labels.to(device),
            self.num_tokens,
        )


def make_batch(
    samples: list[Sample], anchors: list[torch.Tensor], block_size: int, mask_token_id: int
) -> Batch:
    """Packs sequences into one flat context and all their blocks into one flat query set."""
    B = block_size
    ctx_doc, ctx_pos, block_doc, anchor, tokens, labels = [], [], [], [], [], []
    k = torch.arange(B)
    for s, (smp, a) in enumerate(zip(samples, anchors)):
        t = smp.input_ids.shape[0]
        ctx_doc.append(torch.full((t,), s, dtype=torch.long))
        ctx_pos.append(torch.arange(t))
        block_doc.append(torch.full((a.shape[0],), s, dtype=torch.long))
        anchor.append(a)
        p = a[:, None] + k[None, :]  # [n, B] position of each block slot
        inside = p < t
        pc = p.clamp(max=t - 1)
        lab = torch.where(inside & smp.loss_mask[pc], smp.input_ids[pc], -100)
        lab[:, 0] = -100  # the anchor is given, not predicted
        tok = torch.full_like(p, mask_token_id)
        tok[:, 0] = smp.input_ids[a]
        tokens.append(tok.flatten())
        labels.append(lab.flatten())
    layout = BlockLayout(torch.cat(ctx_doc), torch.cat(ctx_pos), torch.cat(block_doc), torch.cat(anchor), B)
    taps = torch.cat([smp.hidden for smp in samples])
    stored = [smp.scale for smp in samples if smp.scale is not None]
    if stored and len(stored) != len(samples):
        raise ValueError("a batch mixes stored fp8 samples with decoded ones")
    scale = torch.cat(stored) if stored else None
    return Batch(taps, layout, torch.cat(tokens), torch.cat(labels), int(taps.shape[0]), scale)


def split_indices(ids: list[str], heldout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Training and held-out indices, held out by a hash of (seed, sample id) as rounds hold them out: a grown
    data set keeps its held-out samples held out, so a drafter trained further on it (train.init_from) is not
    measured on samples it trained on. Rounds draw per base shard, so only their one-sample floor for a shard
    that draws none can differ."""
    held = heldout_rows(ids, fraction=heldout_fraction, seed=seed)
    return np.flatnonzero(~held), np.flatnonzero(held)


def subset_indices(train_idx: np.ndarray, max_samples: int | None, seed: int) -> np.ndarray:
    """The first `max_samples` of a seeded shuffle of the training split: a smaller size's samples are all in
    every larger one (a data-scaling study adds data, it does not swap it), and the held-out set is the
    same for all. Raises when the split has fewer samples than asked for."""
    if max_samples is None:
        return train_idx
    if max_samples > len(train_idx):
        raise ValueError(
            f"train.max_samples={max_samples} but the training split has {len(train_idx)} samples (lower "
            "it, or the study's train_samples, or give more data)"
        )
    order = np.random.default_rng([seed, 54321]).permutation(len(train_idx))
    return np.sort(train_idx[order[:max_samples]])


def sample_cost(length: int, anchors_per_seq: int, block_size: int) -> int:
    """Tokens a sample puts through the drafter: its context plus (at most) all its block positions."""
    return int(length) + block_size * min(anchors_per_seq, max(0, int(length) - 2))


def plan_epoch(
    lengths: np.ndarray, indices: np.ndarray, budget: int, anchors: int, block: int, seed: int, epoch: int
) -> list[list[int]]:
    """Shuffled indices packed greedily into batches under the token budget (an oversize sample goes
    alone)."""
    order = np.random.default_rng([seed, epoch]).permutation(indices)
    batches: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i in order.tolist():
        c = sample_cost(lengths[i], anchors, block)
        if cur and used + c > budget:
            batches.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += c
    if cur:
        batches.append(cur)
    return batches


def fit_plan(batches: list[list[int]], count: int) -> list[list[int]]:
    """An epoch's plan with exactly `count` batches, the step count fixed from the first epoch's plan. Greedy
    packing of a new shuffle can give fewer batches when samples are long against the budget: the fullest
    batches are then split in two (each half stays under the budget). More batches than `count` leave the
    tail out, as a partial epoch."""
    plan = [list(b) for b in batches]
    while len(plan) < count:
        k = max(range(len(plan)), key=lambda j: len(plan[j]))
        if len(plan[k]) < 2:  # only single samples left: repeat from the start of the shuffle
            plan += plan[: count - len(plan)]
            break
        half = len(plan[k]) // 2
        plan[k : k + 1] = [plan[k][:half], plan[k][half:]]
    return plan[:count]


def load_batch(
    ds: MergedDataset, idx: list[int], epoch: int, tcfg: dict, cfg: DrafterConfig, *, pin: bool = False
) -> Batch:
    """Samples `idx` packed with their epoch's anchors, the states as stored (`Batch.to` decodes them);
    `pin` puts them in page-locked memory, so that the copy to a GPU runs beside the GPU's work."""
    samples = [ds.stored(i) for i in idx]
    anchors = [
        pick_anchors(s.loss_mask, tcfg["anchors_per_seq"], [tcfg["seed"], epoch, i])
        for s, i in zip(samples, idx)
    ]
    batch = make_batch(samples, anchors, cfg.block_size, cfg.mask_token_id)
    if pin:
        batch.taps = batch.taps.pin_memory()
        batch.taps_scale = None if batch.taps_scale is None else batch.taps_scale.pin_memory()
    return batch
