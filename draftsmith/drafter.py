"""The DFlash drafter: a few Qwen3 decoder layers that fill a block of masked tokens in one forward.

Read top to bottom: config -> target head (embedding + LM head, borrowed frozen from the target) -> layers ->
the drafter -> attention masks for training -> the inference-time block drafter.

A block is [anchor token, MASK x (B-1)] at positions a..a+B-1. Its queries attend, bidirectionally, to the block
itself and to the target's context: tap states of positions < a, concatenated, projected by `fc` + `hidden_norm`
and fed to every layer's k_proj/v_proj as extra keys/values. The drafter has no embedding or LM head of its own.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

FULL, SLIDING = "full_attention", "sliding_attention"

# ---------------------------------------------------------------------------------------------------- config


@dataclass
class DrafterConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_layer_ids: list[int]
    num_target_layers: int
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 40960
    layer_types: list[str] = field(default_factory=list)  # filled with FULL when empty
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            self.layer_types = [FULL] * self.num_layers
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        bad = set(self.layer_types) - {FULL, SLIDING}
        if bad:
            raise ValueError(f"unknown layer types {sorted(bad)}; use {FULL!r} or {SLIDING!r}")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ValueError("sliding_attention layers need drafter.sliding_window")

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> DrafterConfig:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def text_config(target_config: dict) -> dict:
    """Multimodal Qwen3.5 checkpoints nest the language model's config under `text_config`."""
    return target_config.get("text_config", target_config)


def rope_theta_of(cfg: dict) -> float:
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta")
    return float(theta or 1e6)


def padded_vocab_gap(target_dir: str | Path | None, vocab_size: int) -> int | None:
    """First id of the embedding table that the tokenizer never produces (the padding rows), if any."""
    if target_dir is None:
        return None
    try:
        from transformers import AutoTokenizer

        n = len(AutoTokenizer.from_pretrained(str(target_dir)))
    except Exception:  # no tokenizer saved with the target
        return None
    return n if n < vocab_size else None


def resolve_mask_token_id(setting: object, preset: int | None, vocab_size: int, target_dir=None) -> int:
    """Config value, else the preset's (the id z-lab's drafters use), else an unused row of the padded vocab."""
    if setting not in (None, "auto"):
        mid = int(setting)  # type: ignore[arg-type]
    elif preset is not None:
        mid = int(preset)
    else:
        gap = padded_vocab_gap(target_dir, vocab_size)
        if gap is None:
            raise ValueError(
                "no mask token: set drafter.mask_token_id, use a preset that defines one, or use a target whose "
                f"vocabulary ({vocab_size} rows) has padding rows the tokenizer never emits"
            )
        mid = gap
    if not 0 <= mid < vocab_size:
        raise ValueError(f"mask_token_id {mid} outside the target's vocabulary of {vocab_size}")
    return mid


def config_from_target(
    target_config: dict,
    taps: list[int],
    section: dict | None = None,
    preset_mask_token_id: int | None = None,
    target_dir: str | Path | None = None,
) -> DrafterConfig:
    """Drafter shapes follow the target (hidden, heads, head_dim, intermediate) unless the `drafter` section says."""
    s = dict(section or {})
    t = text_config(target_config)
    hidden = int(t["hidden_size"])
    heads = int(t["num_attention_heads"])

    def pick(key: str, default: object) -> object:
        v = s.get(key)
        return default if v in (None, "auto") else v

    num_layers = int(pick("num_layers", 5))
    return DrafterConfig(
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=int(pick("num_heads", heads)),
        num_kv_heads=int(pick("num_kv_heads", t.get("num_key_value_heads", heads))),
        head_dim=int(pick("head_dim", t.get("head_dim") or hidden // heads)),
        intermediate_size=int(pick("intermediate_size", t["intermediate_size"])),
        vocab_size=int(t["vocab_size"]),
        target_layer_ids=[int(x) for x in taps],
        num_target_layers=int(t["num_hidden_layers"]),
        mask_token_id=resolve_mask_token_id(s.get("mask_token_id"), preset_mask_token_id, int(t["vocab_size"]), target_dir),
        block_size=int(pick("block_size", 16)),
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta_of(t),
        max_position_embeddings=int(t.get("max_position_embeddings", 40960)),
        layer_types=list(s.get("layer_types") or []) or [FULL] * num_layers,
        sliding_window=s.get("sliding_window"),
    )


# ---------------------------------------------------------------------------------------------- target head

_EMBED_NAMES = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight")
_HEAD_NAMES = ("lm_head.weight", "model.language_model.lm_head.weight")


def _tensor_files(target_dir: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file, from the shard index when there is one."""
    index = target_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: target_dir / v for k, v in weight_map.items()}
    from safetensors import safe_open

    out: dict[str, Path] = {}
    for f in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({k: f for k in h.keys()})
    return out


def load_target_head(target_dir: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Only the embedding and LM head of the target (never the whole model): tied checkpoints reuse the embedding."""
    from safetensors import safe_open

    target_dir = Path(target_dir)
    files = _tensor_files(target_dir)

    def read(names: tuple[str, ...]) -> torch.Tensor | None:
        for n in names:
            if n in files:
                with safe_open(str(files[n]), framework="pt") as h:
                    return h.get_tensor(n)
        return None

    embed = read(_EMBED_NAMES)
    if embed is None:
        raise KeyError(f"{target_dir}: no input embedding among {_EMBED_NAMES}")
    head = read(_HEAD_NAMES)
    if head is None:
        cfg = json.loads((target_dir / "config.json").read_text())
        if not cfg.get("tie_word_embeddings", text_config(cfg).get("tie_word_embeddings", False)):
            raise KeyError(f"{target_dir}: no lm_head among {_HEAD_NAMES} and embeddings are not tied")
        head = embed
    return embed, head


# ---------------------------------------------------------------------------------------------------- layers


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
    return flex(q, k, v, block_mask=mask, enable_gqa=True)


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


# ---------------------------------------------------------------------------------------------------- drafter


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


# ------------------------------------------------------------------------------------------ training masks


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
    strictly before its anchor (and within the window on sliding layers) plus its own block, never another block."""
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
        return ctx_ok | own_block

    return mask_mod


def dense_mask(layout: BlockLayout, window: int | None) -> torch.Tensor:
    """The same mask materialised as a bool [Q, T + Q] tensor (CPU path and tests)."""
    dev = layout.anchor.device
    q = torch.arange(layout.num_queries, device=dev)[:, None]
    kv = torch.arange(layout.num_ctx + layout.num_queries, device=dev)[None, :]
    return mask_mod_for(layout, window)(0, 0, q, kv)


def build_masks(layout: BlockLayout, cfg: DrafterConfig, use_flex: bool) -> dict:
    """One mask per layer type present: FlexAttention block-sparse masks on GPU, dense bool tensors otherwise."""
    masks: dict = {}
    for t in set(cfg.layer_types):
        window = cfg.sliding_window if t == SLIDING else None
        if use_flex:
            from torch.nn.attention.flex_attention import create_block_mask

            Q, KV = layout.num_queries, layout.num_ctx + layout.num_queries
            masks[t] = create_block_mask(
                mask_mod_for(layout, window), None, None, Q, KV, device=layout.anchor.device, _compile=True
            )
        else:
            masks[t] = dense_mask(layout, window)
    return masks


# ------------------------------------------------------------------------------------ inference-time drafter


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
        for i, layer in enumerate(self.model.layers):
            k, v = layer.self_attn.kv(ctx, pos)
            self._k[i] = k if self._k[i] is None else torch.cat([self._k[i], k], dim=2)
            self._v[i] = v if self._v[i] is None else torch.cat([self._v[i], v], dim=2)
        self._len += h.shape[0]

    def crop(self, length: int) -> None:
        if length < 0 or length > self._len:
            raise ValueError(f"crop to {length}: only {self._len} context positions cached")
        for i in range(len(self._k)):
            if self._k[i] is not None:
                self._k[i] = self._k[i][:, :, :length]
                self._v[i] = self._v[i][:, :, :length]
        self._len = length

    @torch.inference_mode()
    def propose(self, anchor_token: int) -> torch.Tensor:
        dev, dtype, B, L = self.embed.device, next(self.model.parameters()).dtype, self.block_size, self._len
        tokens = torch.full((B,), self.mask_token_id, device=dev, dtype=torch.long)
        tokens[0] = anchor_token
        x = F.embedding(tokens, self.embed).to(dtype)
        pos = torch.arange(L, L + B, device=dev)
        for i, layer in enumerate(self.model.layers):
            nkv, d = layer.self_attn.nkv, layer.self_attn.d
            ck = self._k[i] if self._k[i] is not None else x.new_zeros(1, nkv, 0, d)
            cv = self._v[i] if self._v[i] is not None else x.new_zeros(1, nkv, 0, d)
            mask = None
            if layer.layer_type == SLIDING and L > 0:
                ctx_ok = pos[:, None] - torch.arange(L, device=dev)[None, :] < self.cfg.sliding_window
                mask = torch.cat([ctx_ok, torch.ones(B, B, dtype=torch.bool, device=dev)], dim=1)
            x = layer(x, pos, ck, cv, mask)
        h = self.model.norm(x)[1:]
        return (h.to(self.lm_head.dtype) @ self.lm_head.T).float()


def load_block_drafter(
    drafter_dir: str, target_dir: str, device: str | torch.device, dtype: torch.dtype
) -> BlockDrafter:
    """An exported z-lab directory + the target's embedding and LM head -> a ready BlockDrafter."""
    from draftsmith.export import load_drafter

    model = load_drafter(drafter_dir).to(device=device, dtype=dtype)
    embed, head = load_target_head(target_dir)
    return BlockDrafter(model, embed.to(device=device, dtype=dtype), head.to(device=device, dtype=dtype))


def auto_gamma(block_size: int) -> float:
    """Loss decay of the DFlash paper: 7 for B=16, 5 for B=10, 4 for B=8; scaled with B otherwise."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, 7.0 * block_size / 16))


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Weight of block positions 0..B-1: 0 for the anchor, exp(-(k-1)/gamma) for k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w

