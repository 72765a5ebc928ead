"""The target's files without loading the model: config.json fields (local directory or hub), and the
embedding and LM head tensors the drafter borrows frozen."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def model_file(model: str, name: str, revision: str | None = None) -> Path | None:
    """A small file of the target (config, safetensors index) from a local dir or the hub cache / hub."""
    local = Path(model) / name
    if Path(model).is_dir():
        return local if local.exists() else None
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None
    try:
        return Path(hf_hub_download(model, name, revision=revision))
    except Exception:  # offline, gated, or simply absent (e.g. single-file checkpoints have no index)
        return None


def text_config(model: str, revision: str | None = None) -> dict:
    """The text model's config.json fields (multimodal checkpoints keep them under `text_config`)."""
    path = model_file(model, "config.json", revision)
    if path is None:
        raise FileNotFoundError(
            f"target.model {model!r}: no config.json found (not a local model directory, and the hub is not "
            "reachable or the id is wrong); download it first or fix target.model in config.yaml"
        )
    cfg = json.loads(path.read_text())
    return cfg.get("text_config", cfg)


def text_fields(target_config: dict) -> dict:
    """Multimodal Qwen3.5 checkpoints nest the language model's config under `text_config`."""
    return target_config.get("text_config", target_config)


_EMBED_NAMES = (
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "embed_tokens.weight",
)

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
    """Only the embedding and LM head of the target (never the whole model): tied checkpoints reuse the
    embedding."""
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
        if not cfg.get("tie_word_embeddings", text_fields(cfg).get("tie_word_embeddings", False)):
            raise KeyError(f"{target_dir}: no lm_head among {_HEAD_NAMES} and embeddings are not tied")
        head = embed
    return embed, head
