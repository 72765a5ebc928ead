"""Proposers of draft blocks for the speculative loops: the trained drafter and wrappers."""

from __future__ import annotations

from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.drafter.config import SLIDING
from draftsmith.drafter.model import DecoderLayer, Drafter
from draftsmith.drafter.zlab import load_drafter
from draftsmith.target.files import load_target_head


class BlockDrafter:
    """One sequence at inference: context K/V cached per layer, one block proposed per call."""

    def __init__(self, model: Drafter, embed: torch.Tensor, lm_head: torch.Tensor):
        self.model = model.eval()
        self.cfg = model.cfg
        self.block_size = self.cfg.block_size
        self.mask_token_id = self.cfg.mask_token_id
        self.embed = embed
        self.lm_head = lm_head
        self.reset()

    def reset(self) -> None:
        self._k: list[torch.Tensor | None] = [None] * len(self.model.layers)
        self._v: list[torch.Tensor | None] = [None] * len(self.model.layers)
        self._len = 0

    @property
    def context_length(self) -> int:
        return self._len

    @torch.inference_mode()
    def extend(self, target_hidden: torch.Tensor) -> None:
        dev, dtype = self.embed.device, next(self.model.parameters()).dtype
        h = target_hidden.to(dev, dtype)
        pos = torch.arange(self._len, self._len + h.shape[0], device=dev)
        ctx = self.model.context(h)
        for i, layer in enumerate(self._layers()):
            k, v = layer.self_attn.kv(ctx, pos)
            old_k, old_v = self._k[i], self._v[i]
            self._k[i] = k if old_k is None else torch.cat([old_k, k], dim=2)
            self._v[i] = v if old_v is None else torch.cat([old_v, v], dim=2)
        self._len += h.shape[0]

    def crop(self, length: int) -> None:
        if length < 0 or length > self._len:
            raise ValueError(f"crop to {length}: only {self._len} context positions cached")
        for i, (k, v) in enumerate(zip(self._k, self._v, strict=True)):
            if k is not None and v is not None:
                self._k[i], self._v[i] = k[:, :, :length], v[:, :, :length]
        self._len = length

    def _layers(self) -> list[DecoderLayer]:
        return cast(list[DecoderLayer], self.model.layers)

    @torch.inference_mode()
    def propose(self, anchor_token: int) -> torch.Tensor:
        dev, dtype, B, L = self.embed.device, next(self.model.parameters()).dtype, self.block_size, self._len
        tokens = torch.full((B,), self.mask_token_id, device=dev, dtype=torch.long)
        tokens[0] = anchor_token
        x = F.embedding(tokens, self.embed).to(dtype)
        pos = torch.arange(L, L + B, device=dev)
        for i, layer in enumerate(self._layers()):
            nkv, d = layer.self_attn.nkv, layer.self_attn.d
            ck, cv = self._k[i], self._v[i]
            if ck is None or cv is None:
                ck, cv = x.new_zeros(1, nkv, 0, d), x.new_zeros(1, nkv, 0, d)
            mask = None
            if layer.layer_type == SLIDING:  # causal inside the block, context within the window
                ctx_ok = pos[:, None] - torch.arange(L, device=dev)[None, :] < self.cfg.sliding_window
                back = torch.arange(B, device=dev)[:, None] - torch.arange(B, device=dev)[None, :]
                mask = torch.cat([ctx_ok, (back >= 0) & (back < self.cfg.sliding_window)], dim=1)
            x = layer(x, pos, ck, cv, mask)
        h = self.model.norm(x)[1:]
        return (h.to(self.lm_head.dtype) @ self.lm_head.T).float()


def load_block_drafter(
    drafter_dir: str, target_dir: str, device: str | torch.device, dtype: torch.dtype
) -> BlockDrafter:
    """An exported z-lab directory + the target's embedding and LM head -> a ready BlockDrafter."""

    model = load_drafter(drafter_dir).to(device=device, dtype=dtype)
    embed, head = load_target_head(target_dir)
    return BlockDrafter(model, embed.to(device=device, dtype=dtype), head.to(device=device, dtype=dtype))


class Proposer(Protocol):
    """What the loops need from a drafter (implemented by BlockDrafter above, and by the wrappers below)."""

    block_size: int
    mask_token_id: int

    def reset(self) -> None: ...

    @property
    def context_length(self) -> int: ...

    def extend(self, target_hidden: torch.Tensor) -> None: ...

    def crop(self, length: int) -> None: ...

    def propose(self, anchor_token: int) -> torch.Tensor: ...


class Wrapped:
    """A drafter around another: context handling is the inner drafter's, only `propose` changes."""

    def __init__(self, drafter: Proposer, block_size: int | None = None):
        self.inner, self.mask_token_id = drafter, drafter.mask_token_id
        self.block_size = block_size or drafter.block_size

    def reset(self) -> None:
        self.inner.reset()

    @property
    def context_length(self) -> int:
        return self.inner.context_length

    def extend(self, target_hidden: torch.Tensor) -> None:
        self.inner.extend(target_hidden)

    def crop(self, length: int) -> None:
        self.inner.crop(length)

    def propose(self, anchor_token: int) -> torch.Tensor:
        return self.inner.propose(anchor_token)


class ShorterBlock(Wrapped):
    """Runs a drafter with a smaller block than it was trained with (keeps the first B-1 positions)."""

    def propose(self, anchor_token: int) -> torch.Tensor:
        return self.inner.propose(anchor_token)[: self.block_size - 1]


def fp32_drafter(drafter: Proposer, bench: dict, *, target: nn.Module | None = None) -> Proposer:
    """The bench's drafter in fp32: its body cast in place (7 GB at the 27B width), its embedding and head
    the target's own where `target` holds them in fp32 with the same values (`fp32_by_layer` keeps them so;
    10 GB saved), else fp32 copies."""
    block = drafter
    while isinstance(block, Wrapped):
        block = block.inner
    if not isinstance(block, BlockDrafter):
        raise TypeError(f"the fp32 check needs the trained BlockDrafter, not {type(block).__name__}")
    theirs = (
        [None, None] if target is None else [target.get_input_embeddings(), getattr(target, "lm_head", None)]
    )
    embed, head = (
        _same_in_fp32(mine, getattr(module, "weight", None))
        for mine, module in zip((block.embed, block.lm_head), theirs, strict=True)
    )
    cast: Proposer = BlockDrafter(block.model.float(), embed, head)
    return ShorterBlock(cast, int(bench["block_size"])) if bench["block_size"] else cast


def _same_in_fp32(mine: torch.Tensor, theirs: torch.Tensor | None) -> torch.Tensor:
    """`theirs` where it is an fp32 tensor beside `mine` holding the same values, else `mine` in fp32."""
    if (
        theirs is not None
        and theirs.dtype == torch.float32
        and theirs.shape == mine.shape
        and theirs.device == mine.device
        and torch.equal(theirs.to(mine.dtype), mine)
    ):
        return theirs.detach()
    return mine.float()
