"""Random-weight targets of real shapes for the performance tools, and the matmul ceiling they compare to."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from draftsmith.core.io import atomic
from draftsmith.core.runtime import sync_device
from draftsmith.demo import data as demo
from draftsmith.target.kernels import kernels_follow_device

SHAPES_DIR = Path(__file__).resolve().parents[2] / "configs" / "shapes"  # the checkout's configs/shapes

NON_CONFIG_KEYS = ("dflash", "note")

# Tiny shapes of both families for CPU smoke runs and tests (the real presets live in configs/shapes/).
TINY_SHAPES = {
    "tiny-hybrid": {
        "model_type": "qwen3_5_text",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "full_attention_interval": 4,
        "vocab_size": 1024,
    },
    "tiny-attention": {
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 1024,
    },
}


def load_shape(spec: str) -> tuple[dict, list[int] | None]:
    """Config fields of a target and its DFlash taps when known: a shape JSON, a preset name, or a model
    dir."""
    if spec in TINY_SHAPES:
        return dict(TINY_SHAPES[spec]), None
    path = Path(spec)
    if not path.exists() and (SHAPES_DIR / f"{spec}.json").exists():
        path = SHAPES_DIR / f"{spec}.json"
    if path.is_dir():
        path = path / "config.json"
    raw = json.loads(path.read_text())
    if "text_config" in raw:  # a multimodal checkpoint: the text model is what we extract from
        outer = raw.get("model_type", "")
        raw = {"model_type": outer + "_text", **raw["text_config"]}
    taps = (raw.get("dflash") or {}).get("target_layer_ids")
    fields = {k: v for k, v in raw.items() if k not in NON_CONFIG_KEYS}
    return fields, taps


def build_model(
    fields: dict, num_layers: int | None, device: torch.device, dtype: torch.dtype, seed: int = 0
):
    """Random weights of the real shape, allocated and initialised directly on the device in `dtype`.

    Building under a device context keeps a 27B model off the host (no fp32 CPU copy); the model's own init
    (normal 0.02 for linears, Gated DeltaNet decay/bias ranges, (1 + w) norms at zero) keeps activations
    realistic.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(fields)
    model_type = fields.pop("model_type")
    if num_layers:
        fields["num_hidden_layers"] = num_layers
        fields.pop("layer_types", None)  # rebuilt from full_attention_interval for the new depth
    cfg = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    kernels_follow_device(model)
    return model.eval()


def save_random_target(
    shape: str, tokenizer_dir: str, out_dir: str, num_layers: int | None = None, seed: int = 0
) -> Path:
    """A random-weight checkpoint of a real shape (with a borrowed tokenizer) that the workflow can load like
    a hub model: for measuring the whole DAG at real size without downloading weights."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)  # first: fail before minutes of building
    fields, _ = load_shape(shape)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(fields, num_layers, device, dtype, seed)
    out = Path(out_dir)
    with atomic(out) as tmp:
        model.save_pretrained(tmp, max_shard_size="10GB")
        tokenizer.save_pretrained(tmp)
    return out


def write_long_records(path: str, tokenizer_dir: str, samples: int, lengths_spec: str, seed: int = 0) -> None:
    """prompt/response records whose rendered lengths follow `lengths_spec` (text from the stdlib sources)."""
    import json

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = "".join(demo.read_text(p) for p in demo.split_files()[0][:300])
    ids = tok(text, add_special_tokens=False)["input_ids"]
    lo, hi = (int(x) for x in lengths_spec.split(":")[1:3])
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(math.log(lo), math.log(hi), size=samples)).round().astype(int)
    with open(path, "w") as f:
        for i, n in enumerate(lengths):
            start = int(rng.integers(0, max(1, len(ids) - int(n))))
            chunk = ids[start : start + int(n)]
            cut = max(1, len(chunk) // 8)
            f.write(
                json.dumps(
                    {"id": f"long{i}", "prompt": tok.decode(chunk[:cut]), "response": tok.decode(chunk[cut:])}
                )
                + "\n"
            )


def matmul_ceiling(device: torch.device, n: int = 8192, iters: int = 20) -> float:
    """Measured FLOP/s of a square bf16 matmul (fp32 on CPU): the ceiling the training step is compared to."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type != "cuda":
        n, iters = min(n, 1024), min(iters, 5)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync_device(device)
    return 2 * n**3 * iters / (time.perf_counter() - t0)
