"""Loading the target model for a job: dtype, devices (one GPU or a device_map across a group), stop ids."""

from __future__ import annotations

import torch

from draftsmith.core.runtime import resolve_dtype
from draftsmith.target.kernels import kernels_follow_device, use_fla_conv


def load_target(
    path: str,
    devices: list[int],
    dtype: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
):
    """The target on its devices: one GPU, a group through `device_map` (layers split across it), or the
    CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device("cuda:0" if devices else "cpu")
    torch_dtype = resolve_dtype(dtype, device)
    kwargs: dict = {"dtype": torch_dtype, "revision": revision, "trust_remote_code": trust_remote_code}
    if len(devices) > 1:
        kwargs["device_map"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if len(devices) <= 1:
        model.to(device)  # type: ignore[arg-type]  # transformers' decorated `to` confuses mypy
    model.eval()
    kernels_follow_device(model)
    use_fla_conv(model)
    tok = AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    return model, tok, device


def load_configured_target(path: str, devices: list[int], target_cfg: dict):
    """`load_target` with the config's `target` options, so every job loads the target the same way."""
    return load_target(
        path,
        devices,
        target_cfg["dtype"],
        target_cfg["revision"],
        bool(target_cfg["trust_remote_code"]),
    )


def eos_ids_of(model, tokenizer) -> list[int]:
    """Every id that ends an answer: the generation config's (often several, e.g. Llama 3's end-of-turn and
    end-of-text) and the tokenizer's. Regeneration and the benchmark stop on the same set."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for eos in (gen.eos_token_id if gen is not None else None, tokenizer.eos_token_id):
        ids += [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
    return sorted(set(ids))
