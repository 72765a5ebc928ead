"""The z-lab DFlash directory format (what vLLM and SGLang load) and draftsmith's reader of it.

config.json: a Qwen3 config plus `block_size`, `num_target_layers` and `dflash_config {mask_token_id,
target_layer_ids}`; z-lab's target_layer_ids are our tap ids (layer outputs, HF hidden_states[id + 1]).
model.safetensors: fc.weight, hidden_norm.weight, layers.*, norm.weight; no embedding, no LM head (the
server borrows the target's).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.core.io import atomic
from draftsmith.drafter.config import SLIDING, DrafterConfig, drafter_config
from draftsmith.drafter.model import Drafter

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def zlab_config(cfg: DrafterConfig, dtype: torch.dtype, mask_token: str | None = None) -> dict:
    """z-lab's fields, plus what other readers look for: vLLM reads `eagle_aux_hidden_state_layer_ids` (HF
    hidden_states indices, tap id + 1) before `dflash_config.target_layer_ids` and sizes `fc` from
    `target_hidden_size`; SGLang reads `dflash_config.block_size` (else 16) and, in some versions,
    `dflash_config.mask_token` (the token's string); Transformers 5 reads `rope_parameters`, older readers
    `rope_theta`."""
    sliding = SLIDING in cfg.layer_types
    dflash = {
        "mask_token_id": cfg.mask_token_id,
        "target_layer_ids": list(cfg.target_layer_ids),
        "block_size": cfg.block_size,
    }
    if mask_token is not None:
        dflash["mask_token"] = mask_token
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": sliding,
        "sliding_window": cfg.sliding_window if sliding else None,
        "max_window_layers": cfg.num_layers,
        "layer_types": list(cfg.layer_types),
        "block_size": cfg.block_size,
        "num_target_layers": cfg.num_target_layers,
        "target_hidden_size": cfg.hidden_size,
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
        "dflash_config": dflash,
        "torch_dtype": _DTYPE_NAMES[dtype],
    }


def config_from_zlab(c: dict) -> DrafterConfig:
    """Everything the drafter needs is in the z-lab fields, so a z-lab checkpoint loads the same way."""
    d = c["dflash_config"]
    return drafter_config(
        c,
        d["target_layer_ids"],
        num_layers=c["num_hidden_layers"],
        num_target_layers=c["num_target_layers"],
        mask_token_id=d["mask_token_id"],
        block_size=c["block_size"],
        layer_types=c.get("layer_types"),
        sliding_window=c.get("sliding_window") if c.get("use_sliding_window", True) else None,
    )


def save_zlab(
    model: Drafter, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16, *, mask_token: str | None = None
) -> Path:
    """Writes into a temporary directory beside out_dir, then renames: a killed export leaves no half
    drafter."""
    out_dir = Path(out_dir)
    with atomic(out_dir) as tmp:
        tmp.mkdir()
        tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = zlab_config(model.cfg, dtype, mask_token)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def load_drafter(drafter_dir: str | Path) -> Drafter:
    """A z-lab directory -> Drafter with the stored weights, in the stored dtype (bit-exact)."""
    drafter_dir = Path(drafter_dir)
    cfg = config_from_zlab(json.loads((drafter_dir / "config.json").read_text()))
    state = load_file(str(drafter_dir / "model.safetensors"))
    model = Drafter(cfg)
    dtypes = {v.dtype for v in state.values()}
    if len(dtypes) == 1:
        model = model.to(dtypes.pop())
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise KeyError(f"{drafter_dir}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model


def export(
    train_dir: str | Path, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16, *, tokenizer=None
) -> Path:
    """The trained drafter under train_dir/final (fp32) -> a servable z-lab directory (bf16 by default); with
    the target's tokenizer, the mask token's string is written too (where the id is one of its tokens)."""
    model = load_drafter(Path(train_dir) / "final")
    mid = model.cfg.mask_token_id
    mask_token = (
        tokenizer.convert_ids_to_tokens(mid) if tokenizer is not None and mid < len(tokenizer) else None
    )
    return save_zlab(model, out_dir, dtype, mask_token=mask_token)
