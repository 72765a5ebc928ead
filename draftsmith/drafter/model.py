"""The DFlash drafter: a few Qwen3 decoder layers that fill a block of masked tokens in one forward.

Read top to bottom: norm and RoPE -> attention -> MLP -> decoder layer -> the drafter -> the attention masks
of a training batch (every block at once). The shape lives in drafter/config.py, the inference-time wrapper in
speculative/proposers.py.

A block is [anchor token, MASK x (B-1)] at positions a..a+B-1. Its queries attend, bidirectionally, to the
block itself and to the target's context: tap states of positions < a, concatenated, projected by `fc` +
`hidden_norm` and fed to every layer's k_proj/v_proj as extra keys/values. The drafter has no embedding or LM
head of its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.drafter.config import SLIDING, DrafterConfig


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm (x * w, computed in fp32)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x.to(dtype)).to(dtype)  # fp32 weights under bf16 autocast must not promote


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, rotate-half layout as in HF Qwen3; x [1, heads, n, D], pos [n]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * inv_freq[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """Dense boolean mask (CPU, inference) or a FlexAttention BlockMask (GPU training)."""
    if mask is None or isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    tiles = flex_tiles(q.shape[-1], q.device)
    if tiles is None:
        return flex(q, k, v, block_mask=mask, enable_gqa=True)
    return flex(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=tiles)


# FlexAttention's kernel tiles where Inductor's defaults do not fit a block's shared memory: above head_dim
# 128 they ask for more than sm_12x GPUs (RTX PRO 6000 Blackwell: 101,376 bytes) have
# (pytorch/pytorch#198224). The blocks must divide FLEX_TILE, the block mask's tile.
SMALL_FLEX_TILES = {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1, "BLOCK_M1": 16, "BLOCK_N1": 32,
                    "BLOCK_M2": 32, "BLOCK_N2": 16}  # fmt: skip
DEFAULT_TILES_SHARED = 200 * 1024  # shared memory a block that the default tiles need above head_dim 128
SMALL_TILES_ABOVE_HEAD_DIM = 128


def flex_tiles(head_dim: int, device: torch.device) -> dict | None:
    """SMALL_FLEX_TILES where the device's shared memory a block cannot hold the default tiles, else None
    (Inductor's own choice, the fastest on a Hopper). DRAFTSMITH_SHARED_MEMORY stands in for the device's
    figure (bytes), to build another GPU's kernels; DRAFTSMITH_FLEX_TILES=default keeps Inductor's."""
    if head_dim <= SMALL_TILES_ABOVE_HEAD_DIM or os.environ.get("DRAFTSMITH_FLEX_TILES") == "default":
        return None
    limit = os.environ.get("DRAFTSMITH_SHARED_MEMORY")
    props = torch.cuda.get_device_properties(device) if not limit else None
    shared = int(limit) if limit else int(getattr(props, "shared_memory_per_block_optin", 0))
    return dict(SMALL_FLEX_TILES) if shared < DEFAULT_TILES_SHARED else None


_flex_compiled = None


def flex(q, k, v, **kw):
    global _flex_compiled
    if _flex_compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        _flex_compiled = torch.compile(flex_attention, dynamic=True)
    return _flex_compiled(q, k, v, **kw)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.nh, self.nkv, self.d, self.theta = cfg.num_heads, cfg.num_kv_heads, d, cfg.rope_theta
        self.q_proj = nn.Linear(h, self.nh * d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nh * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values [1, kv heads, n, D] of x [n, H]; used for the context and for the block alike."""
        n = x.shape[0]
        k = self.k_norm(self.k_proj(x).view(1, n, self.nkv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(1, n, self.nkv, self.d).transpose(1, 2)
        return rope(k, pos, self.theta), v

    def forward(self, x, pos, ctx_k, ctx_v, mask) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(1, n, self.nh, self.d)).transpose(1, 2)
        q = rope(q, pos, self.theta)
        k, v = self.kv(x, pos)
        k, v = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)  # context first, then the block
        y = attend(q, k.to(q.dtype), v.to(q.dtype), mask)
        return self.o_proj(y.transpose(1, 2).reshape(n, self.nh * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, pos, ctx_k, ctx_v, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), pos, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Drafter(nn.Module):
    """Parameter names match z-lab's checkpoints: fc, hidden_norm, layers.*, norm."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.num_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t) for t in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)

    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """Target tap states [t, n_taps*H] -> one context state per position [t, H]."""
        return self.hidden_norm(self.fc(taps))

    def forward(
        self,
        taps: torch.Tensor,  # [T, n_taps*H] context tap states (all sequences of a batch, packed)
        ctx_pos: torch.Tensor,  # [T] position of each context token in its sequence
        x: torch.Tensor,  # [Q, H] embedded block tokens (all blocks, packed)
        q_pos: torch.Tensor,  # [Q] positions of the block tokens
        masks: dict,  # layer type -> mask over [Q, T + Q] (bool tensor or BlockMask)
    ) -> torch.Tensor:
        """Training forward: every block of the batch at once; returns the final-normed states [Q, H]."""
        ctx = self.context(taps)
        for layer in self.layers:
            ck, cv = layer.self_attn.kv(ctx, ctx_pos)
            x = layer(x, q_pos, ck, cv, masks[layer.layer_type])
        return self.norm(x)


@dataclass
class BlockLayout:
    """Where every key and query of a packed batch sits; the mask is a pure function of this."""

    ctx_doc: torch.Tensor  # [T] sequence id of each context token
    ctx_pos: torch.Tensor  # [T] position in its sequence
    block_doc: torch.Tensor  # [N] sequence id of each block
    anchor: torch.Tensor  # [N] anchor position of each block
    block_size: int

    @property
    def num_ctx(self) -> int:
        return int(self.ctx_doc.shape[0])

    @property
    def num_queries(self) -> int:
        return int(self.anchor.shape[0]) * self.block_size


def mask_mod_for(layout: BlockLayout, window: int | None):
    """FlexAttention-style mask_mod over keys [context T | blocks Q]: a block sees its own sequence's context
    strictly before its anchor plus its own block, never another block. Full layers see the whole block
    (bidirectional); sliding layers (`window` set) see context within the window and only the block positions
    up to their own (causal), the attention z-lab's reference and SGLang give a `sliding_attention` layer
    (vLLM 0.22 runs every DFlash layer as a full one: docs/serving.md)."""
    T, B = layout.num_ctx, layout.block_size
    ctx_doc, ctx_pos, block_doc, anchor = layout.ctx_doc, layout.ctx_pos, layout.block_doc, layout.anchor

    def mask_mod(b, h, q_idx, kv_idx):
        blk = q_idx // B
        qpos = anchor[blk] + q_idx % B
        j = kv_idx.clamp(max=T - 1)
        ctx_ok = (kv_idx < T) & (ctx_doc[j] == block_doc[blk]) & (ctx_pos[j] < anchor[blk])
        if window is not None:
            ctx_ok = ctx_ok & (qpos - ctx_pos[j] < window)
        own_block = (kv_idx >= T) & ((kv_idx - T) // B == blk)
        if window is not None:  # sliding layers: causal inside the block too, and within the window
            back = q_idx % B - (kv_idx - T) % B
            own_block = own_block & (back >= 0) & (back < window)
        return ctx_ok | own_block

    return mask_mod


def dense_mask(layout: BlockLayout, window: int | None) -> torch.Tensor:
    """The same mask materialised as a bool [Q, T + Q] tensor (CPU path and tests)."""
    dev = layout.anchor.device
    q = torch.arange(layout.num_queries, device=dev)[:, None]
    kv = torch.arange(layout.num_ctx + layout.num_queries, device=dev)[None, :]
    return mask_mod_for(layout, window)(0, 0, q, kv)


FLEX_MIN_HEAD_DIM = 16  # FlexAttention's Triton kernels refuse smaller heads


def uses_flex(cfg: DrafterConfig, device: torch.device) -> bool:
    """Block-sparse FlexAttention masks on a GPU; dense masks on the CPU and for heads too small for flex."""
    return device.type == "cuda" and cfg.head_dim >= FLEX_MIN_HEAD_DIM


FLEX_TILE = 128  # FlexAttention's block (tile) of queries and of keys


def tile_block_mask(layout: BlockLayout, window: int | None):
    """The FlexAttention BlockMask of mask_mod_for(layout, window), built from the layout's intervals rather
    than by evaluating the mask over every (query, key) pair.

    A block of sequence s with anchor a sees the context indices [start_s + lo, start_s + a) (lo = 0; on
    sliding layers a - window + 1 for its first query, a + B - window for all of them) and its own B
    positions in the block region. So which 128 x 128 tiles hold any visible pair (computed, with the
    mask_mod) and which hold only visible pairs (computed without it) follows from [blocks, key tiles]
    interval tests: millions of comparisons where `create_block_mask` makes Q x KV (billions on a training
    batch). Compiling `create_block_mask` instead sat for minutes in Inductor on the 27B width's first
    batch. Returns None where the layout is not the packed one `make_batch` builds or the drafter block does
    not divide a tile; build_masks then falls back to `create_block_mask`."""
    from torch.nn.attention.flex_attention import BlockMask

    B, T, n = layout.block_size, layout.num_ctx, int(layout.anchor.shape[0])
    if FLEX_TILE % B or n == 0 or T == 0:
        return None
    per_tile = FLEX_TILE // B
    ctx_doc, anchor, dev = layout.ctx_doc, layout.anchor, layout.anchor.device
    first = torch.searchsorted(ctx_doc, ctx_doc)  # [T] first context index of each token's sequence
    positions_in_a_row = (layout.ctx_pos == torch.arange(T, device=dev) - first).all()
    in_order = (ctx_doc[1:] >= ctx_doc[:-1]).all() & positions_in_a_row
    if not bool(in_order):  # sequences in order, each one's positions 0, 1, ... in a row (one device sync)
        return None
    start = torch.searchsorted(ctx_doc, layout.block_doc)  # [n] first context index of each block's sequence
    Q, KV = n * B, T + n * B
    n_q, n_kv = -(-Q // FLEX_TILE), -(-KV // FLEX_TILE)
    hi = start + anchor  # [n] context seen: indices below the anchor's, in the block's own sequence
    lo_any = start + ((anchor - window + 1).clamp_min(0) if window else 0)  # by the block's first query
    lo_all = start + ((anchor + B - window).clamp_min(0) if window else 0)  # by all of its queries
    own = T + torch.arange(n, device=dev) * B  # [n] the block's own positions: own .. own + B - 1
    tile_lo = torch.arange(n_kv, device=dev) * FLEX_TILE  # [n_kv] a key tile's indices: lo .. lo + 127
    tile_hi = tile_lo + FLEX_TILE

    def overlaps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # [n, n_kv]: the tile meets [a, b)
        return (tile_lo[None] < b[:, None]) & (tile_hi[None] > a[:, None]) & (b > a)[:, None]

    any_pair = overlaps(lo_any, hi) | overlaps(own, own + B)  # [n, n_kv]
    all_pairs = (tile_lo[None] >= lo_all[:, None]) & (tile_hi[None] <= hi[:, None])  # inside [lo_all, hi)
    pad = n_q * per_tile - n  # the last query tile's missing blocks: nothing seen, so never a full tile
    any_pair = F.pad(any_pair, (0, 0, 0, pad)).view(n_q, per_tile, n_kv).any(1)
    all_pairs = F.pad(all_pairs, (0, 0, 0, pad)).view(n_q, per_tile, n_kv).all(1)

    def as_indices(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [1,1,n_q], [1,1,n_q,n_kv]
        counts = tiles.sum(-1, dtype=torch.int32)
        order = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return counts[None, None], order[None, None]

    kv_num, kv_idx = as_indices(any_pair & ~all_pairs)
    full_num, full_idx = as_indices(all_pairs)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=FLEX_TILE, mask_mod=mask_mod_for(layout, window),
        seq_lengths=(Q, KV),
    )  # fmt: skip


def build_masks(layout: BlockLayout, cfg: DrafterConfig, use_flex: bool) -> dict:
    """One mask per layer type present: FlexAttention block-sparse masks on GPU (from the layout's intervals
    where it can, else `create_block_mask`), dense bool tensors otherwise."""
    masks: dict = {}
    for t in set(cfg.layer_types):
        window = cfg.sliding_window if t == SLIDING else None
        if not use_flex:
            masks[t] = dense_mask(layout, window)
            continue
        masks[t] = tile_block_mask(layout, window)
        if masks[t] is None:
            from torch.nn.attention.flex_attention import create_block_mask

            Q, KV = layout.num_queries, layout.num_ctx + layout.num_queries
            masks[t] = create_block_mask(
                mask_mod_for(layout, window), None, None, Q, KV, device=layout.anchor.device, _compile=True
            )
    return masks
