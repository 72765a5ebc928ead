"""The target's files without loading the model: where they are (a local directory, or a snapshot in the
Hugging Face cache), config.json fields, and the embedding and LM head tensors the drafter borrows frozen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # read at every parse of the workflow, where importing torch costs more than the rest
    import torch

# What a Transformers load reads from a hub snapshot: configs, tokenizer files, safetensors weights, remote
# code. Not pickled .bin copies, GGUF files or a repository's `original/` checkpoint (often as large again).
SNAPSHOT_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.py", "*.tiktoken")
SNAPSHOT_IGNORE = ("original/*", "*.bin", "*.gguf", "*.pth", "*.pt")


def is_hub_id(model: str) -> bool:
    """A hub id is `org/name` that is not a path on this machine; "demo" and `.gguf` files are local."""
    if model == "demo" or model.startswith(("/", ".", "~")) or model.count("/") != 1:
        return False
    return not Path(model).exists()


def hub_snapshot(repo_id: str, *, revision: str | None = None, download: bool = False) -> Path:
    """The snapshot directory of `repo_id` at `revision` in this machine's Hugging Face cache (HF_HOME,
    HF_HUB_CACHE). Only `download` may reach the hub, and not under HF_HUB_OFFLINE=1."""
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                repo_id,
                revision=revision,
                allow_patterns=list(SNAPSHOT_PATTERNS),
                ignore_patterns=list(SNAPSHOT_IGNORE),
                local_files_only=not download,
            )
        )
    except Exception as e:  # not cached, offline, gated, or no such repository / revision
        where = "the hub" if download else "the local Hugging Face cache"
        raise FileNotFoundError(
            f"target.model {repo_id!r} (revision {revision or 'main'}) is not available from {where} "
            f"({type(e).__name__}: {e}). Check the id and target.revision; offline, download it first "
            "(`hf download REPO`) into the cache HF_HOME / HF_HUB_CACHE point to"
        ) from None


def resolve_target(spec: str | Path) -> Path:
    """The target's model directory, found the same way by every job.

    `spec` is a local model directory, a hub id (its cached snapshot, downloaded if need be), or the lock file
    the fetch_target job writes (`target.json`): the hub id and the commit it fetched, so every job reads the
    same files even when the branch moves, each from its own machine's cache."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.suffix == ".json" and path.is_file():
        lock = json.loads(path.read_text())
        return hub_snapshot(lock["model"], revision=lock["commit"])
    if is_hub_id(str(spec)):
        return hub_snapshot(str(spec), download=True)
    raise FileNotFoundError(
        f"target {str(spec)!r}: not a model directory, a hub id or a fetched target's lock file"
    )


def text_config(target_dir: str | Path) -> dict:
    """The text model's config.json fields (multimodal checkpoints keep them under `text_config`)."""
    path = Path(target_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{target_dir}: no config.json, so it is not a Hugging Face model directory")
    return text_fields(json.loads(path.read_text()))


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
