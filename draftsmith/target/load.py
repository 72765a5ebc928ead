"""Loading the target model for a job: where its files are, dtype, devices (one GPU or a device_map across a
group), the tokenizer with the configured chat template, stop ids."""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.core.gpu_memory import hold_to_cap, max_memory_map
from draftsmith.core.runtime import resolve_dtype
from draftsmith.target.files import resolve_target
from draftsmith.target.kernels import kernels_follow_device, use_fla_conv
from draftsmith.target.templates import chat_template_text


def load_tokenizer(target_dir: str | Path, target_cfg: dict):
    """The target's tokenizer, its chat template replaced when `target.chat_template` names one."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        str(target_dir), trust_remote_code=bool(target_cfg["trust_remote_code"])
    )
    if target_cfg.get("chat_template") is not None:
        tok.chat_template = chat_template_text(target_cfg["chat_template"])
    return tok


def load_target(
    path: str | Path,
    devices: list[int],
    dtype: str = "auto",
    trust_remote_code: bool = False,
    *,
    exact: bool = False,
):
    """The model on its devices: one GPU, a group through `device_map` (layers split across it), or the
    CPU."""
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda:0" if devices else "cpu")
    for i in range(len(devices)):  # the job's GPU memory cap (`gpu_memory`), before any weight lands
        hold_to_cap(torch.device("cuda", i))
    torch_dtype = resolve_dtype(dtype, device, exact=exact)
    kwargs: dict = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if len(devices) > 1:
        kwargs["device_map"] = "auto"
        if (limits := max_memory_map(len(devices))) is not None:
            kwargs["max_memory"] = limits
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if len(devices) <= 1:
        model.to(device)  # type: ignore[arg-type]  # transformers' decorated `to` confuses mypy
    model.eval()
    kernels_follow_device(model)
    use_fla_conv(model)
    return model, device


def load_configured_target(spec: str | Path, devices: list[int], target_cfg: dict, *, exact: bool = False):
    """The target as every job loads it: found by `resolve_target`, with the config's `target` options
    (`exact`: see `resolve_dtype`). Returns (model, tokenizer, device)."""
    target_dir = resolve_target(spec)
    model, device = load_target(
        target_dir, devices, target_cfg["dtype"], bool(target_cfg["trust_remote_code"]), exact=exact
    )
    return model, load_tokenizer(target_dir, target_cfg), device


def eos_ids_of(model, tokenizer) -> list[int]:
    """Every id that ends an answer: the generation config's (often several, e.g. Llama 3's end-of-turn and
    end-of-text) and the tokenizer's. Regeneration and the benchmark stop on the same set."""
    gen = getattr(model, "generation_config", None)
    return stop_ids(gen.eos_token_id if gen is not None else None, tokenizer)


def stop_ids(generation_eos, tokenizer) -> list[int]:
    """The generation config's end ids (an id, a list or None) and the tokenizer's, as one sorted set."""
    ids: list[int] = []
    for eos in (generation_eos, tokenizer.eos_token_id):
        ids += [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
    return sorted(set(ids))
