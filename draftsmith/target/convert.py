"""A GGUF checkpoint turned into a plain Hugging Face model directory (safetensors weights, config, generation
config, tokenizer with its chat template), so every job loads it like any other target.

Transformers reads GGUF files (dequantizing them on load) but will not save a model loaded that way, since its
config still says it is quantized. So the weights are copied into a fresh model built from the same config
without its `quantization_config`, and that model is saved."""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path

import torch

from draftsmith.core.io import atomic

log = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file

QUANTIZATION_KEY = "quantization_config"


def check_gguf(path: Path) -> Path:
    """The file, if it is a GGUF checkpoint; otherwise an error that says which file and what to pass."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; pass the path of a .gguf checkpoint")
    if path.suffix.lower() != GGUF_SUFFIX:
        raise ValueError(
            f"{path}: not a {GGUF_SUFFIX} file; pass a GGUF checkpoint (model directories need no conversion)"
        )
    with path.open("rb") as f:
        if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise ValueError(
                f"{path}: does not start with the GGUF magic bytes, so it is damaged or not GGUF; "
                "download it again"
            )
    return path


def load_gguf(gguf_path: Path, *, dtype: torch.dtype = torch.float32):
    """The model and tokenizer Transformers builds from a GGUF file (weights dequantized to `dtype`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    return model.eval(), tokenizer


def plain_copy(model, *, dtype: torch.dtype):
    """A model of the same architecture that is not marked quantized, holding `model`'s weights in `dtype`."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, QUANTIZATION_KEY):
        delattr(config, QUANTIZATION_KEY)
    fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = fresh.load_state_dict(model.state_dict(), strict=False)
    if missing or unexpected:  # a strict load, but naming what differs
        raise RuntimeError(
            f"GGUF weights do not fit the rebuilt model: missing {missing}, extra {unexpected}"
        )
    fresh.generation_config = model.generation_config
    return fresh.eval()


def _check_written(out_dir: Path, *, chat_template: bool, eos: object) -> None:
    """What a later job relies on, read back from the files: no quantization entry, the chat template, the
    stop ids."""
    from transformers import AutoTokenizer, GenerationConfig

    config = json.loads((out_dir / "config.json").read_text())
    if QUANTIZATION_KEY in config:
        raise RuntimeError(f"{out_dir}/config.json still has {QUANTIZATION_KEY}")
    if chat_template and not AutoTokenizer.from_pretrained(str(out_dir)).chat_template:
        raise RuntimeError(f"{out_dir}: the saved tokenizer lost the GGUF file's chat template")
    if eos is not None and GenerationConfig.from_pretrained(str(out_dir)).eos_token_id != eos:
        raise RuntimeError(f"{out_dir}: generation_config.json lost the eos ids {eos}")


def saved_tensors(model_dir: Path) -> int:
    """How many tensors the safetensors files hold (tied weights are stored once)."""
    from safetensors import safe_open

    count = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            count += len(list(f.keys()))
    return count


def convert_gguf(gguf_path: Path, out_dir: Path, *, dtype: torch.dtype = torch.float32) -> Path:
    """Writes `out_dir`: the GGUF model dequantized to `dtype`, as a safetensors model directory with its
    tokenizer. Written under a temporary name and renamed when complete, so a killed job leaves no half
    directory behind."""
    gguf_path, out_dir = check_gguf(gguf_path), Path(out_dir)
    start = time.perf_counter()
    source, tokenizer = load_gguf(gguf_path)  # dequantized to fp32 first: any cast happens once, below
    model = plain_copy(source, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    eos = model.generation_config.eos_token_id
    del source
    with atomic(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _check_written(tmp, chat_template=bool(tokenizer.chat_template), eos=eos)
        tensors = saved_tensors(tmp)
    log.info(
        "%s -> %s: %d tensors, %.1fM parameters, %s, eos %s, chat template %s (%.1f s)",
        gguf_path,
        out_dir,
        tensors,
        params / 1e6,
        str(dtype).removeprefix("torch."),
        eos,
        "kept" if tokenizer.chat_template else "none in the file",
        time.perf_counter() - start,
    )
    return out_dir
