"""Probe: which GPUs there are, how big the target is, and how to place model copies on them.

Everything is read without loading weights: GPU facts from nvidia-smi, the target's size from its safetensors
index (or its config when there is no index).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

from draftsmith.core.gpu_memory import memory_cap
from draftsmith.core.gpu_pool import visible_gpus
from draftsmith.target.files import text_config

GIB = 1024**3


def gpu_info() -> list[dict]:
    ids = visible_gpus()
    if not ids or shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.free", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    cap = memory_cap()  # `gpu_memory`: what a job may use of a device, whatever is free
    gpus = []
    for line in out.strip().splitlines():
        idx, name, total, free = (x.strip() for x in line.split(","))
        if int(idx) in ids:
            free_gib = int(free) / 1024
            gpus.append(
                {
                    "index": int(idx),
                    "name": name,
                    "total_gib": int(total) / 1024,
                    "free_gib": free_gib if cap is None else min(free_gib, cap / GIB),
                    "cap_gib": None if cap is None else cap / GIB,
                    "slots": ids.count(int(idx)),  # jobs at once on it (DRAFTSMITH_GPUS lists it that often)
                }
            )
    return gpus


def estimate_params(cfg: dict) -> int:
    """Parameter count from the config alone (dense decoder; MoE experts counted; linear-attention layers
    approximated)."""
    h, v, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    inter = cfg.get("intermediate_size", 4 * h)
    heads = cfg.get("num_attention_heads", h // 128)
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    attn = h * hd * (heads + 2 * kv) + heads * hd * h
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    if experts:
        moe_inter = cfg.get("moe_intermediate_size", inter)
        mlp = 3 * h * moe_inter * (experts + (1 if cfg.get("shared_expert_intermediate_size") else 0))
    else:
        mlp = 3 * h * inter
    emb = v * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return int(n * (attn + mlp) + emb)


def target_bytes(target_dir: Path, dtype_bytes: int = 2) -> tuple[int, str]:
    """Weight bytes at the extraction dtype, and where the figure came from."""
    index = target_dir / "model.safetensors.index.json"
    if index.exists():
        meta = json.loads(index.read_text()).get("metadata", {})
        if "total_size" in meta:
            # the index counts stored bytes; rescale when stored at another width is unknowable, so trust it
            return int(meta["total_size"]), "safetensors index"
    single = target_dir / "model.safetensors"
    if single.exists():
        return single.stat().st_size, "safetensors file"
    return estimate_params(text_config(target_dir)) * dtype_bytes, "config estimate"


def activation_bytes_per_token(cfg: dict, taps: int, dtype_bytes: int = 2) -> int:
    """Peak extra memory per token in a body forward: a few hidden-size buffers, the MLP's wide ones, the
    taps."""
    h = cfg["hidden_size"]
    inter = cfg.get("intermediate_size", 4 * h)
    return int(dtype_bytes * (8 * h + 3 * inter + 2 * taps * h))


def decide(
    gpus: list[dict],
    weight_bytes: int,
    per_token: int,
    token_budget: int | None,
    max_length: int,
    cpu_slots: int,
    headroom: float = 0.9,
) -> dict:
    """GPUs per model copy: 1 when weights plus activations fit one GPU, else the smallest group that fits.
    A GPU shared by k slots gives each job a k-th of its memory, and a copy must fit there: a group of slots
    of one device would gain nothing."""
    if not gpus:
        budget = token_budget or max(4096, max_length)
        return {"device": "cpu", "gpus_per_copy": 0, "slots": cpu_slots, "token_budget": budget}
    shares = [int(g.get("slots", 1)) for g in gpus]
    mem = min(g["free_gib"] / k for g, k in zip(gpus, shares)) * GIB * headroom
    budget = token_budget or 65536
    budget = max(budget, max_length)
    shared = max(shares) > 1
    for group in [1] if shared else range(1, len(gpus) + 1):
        room = mem - weight_bytes / group
        if room <= 0:
            continue
        fit = int(room // per_token)
        if fit >= max_length:
            auto = min(budget, fit)
            # power-of-two-ish budgets keep batch shapes stable; never below one full-length sample
            auto = max(max_length, 2 ** int(math.log2(auto)))
            return {
                "device": "cuda",
                "gpus_per_copy": group,
                "slots": sum(shares) // group,
                "token_budget": token_budget or auto,
            }
    if shared:
        raise RuntimeError(
            f"the target ({weight_bytes / GIB:.1f} GiB) does not fit in 1/{max(shares)} of a GPU's free "
            f"memory with room for one {max_length}-token sample: DRAFTSMITH_GPUS lists a device "
            f"{max(shares)} times (one job, and one copy of the target, per listing); list it fewer times"
        )
    raise RuntimeError(
        f"the target ({weight_bytes / GIB:.1f} GiB) does not fit on all {len(gpus)} visible GPUs with room "
        f"for one {max_length}-token sample; use more or larger GPUs, or lower data.max_length"
    )
