"""Config helpers shared by the workflow and the scripts: the target's shape, tap layers and a content hash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .taps import default_taps


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


def resolve_taps(num_layers: int, taps_cfg: dict) -> list[int]:
    """`taps.layers: auto` gives the DFlash default; `include_last` adds the last decoder layer."""
    layers = taps_cfg.get("layers", "auto")
    if layers == "auto":
        taps = default_taps(num_layers, int(taps_cfg.get("count", 5)))
    else:
        taps = [int(x) for x in layers]
        bad = [t for t in taps if not 0 <= t < num_layers]
        if bad:
            raise ValueError(f"taps.layers {bad} out of range: the target has {num_layers} decoder layers (0..{num_layers - 1})")
    if taps_cfg.get("include_last") and num_layers - 1 not in taps:
        taps = taps + [num_layers - 1]
    return taps


def content_hash(*parts: object) -> str:
    """Hash of everything that determines the bytes of an output; shards of one dataset must agree on it."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
