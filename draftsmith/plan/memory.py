"""The plan's GPU memory: what a GPU job may use (the card, or `gpu_memory`), what the target's weights and
the bench take of it, and how the bench's fp32 check will run.

Estimates from the target's shape: weights in bf16, the bench's drafter beside them, and for the fp32 check
the embeddings and head in fp32, one decoder layer in fp32 at a time (`draftsmith.target.upcast`) and the
drafter's body in fp32. The jobs measure the rest themselves (regeneration's slots, extraction's budget).
"""

from __future__ import annotations

from draftsmith.core.gpu_memory import cap_setting, memory_cap
from draftsmith.core.units import human

WORKSPACE = 2 * 10**9  # activations, caches and allocator slack of one bench prompt, as a round figure


def memory_plan(
    config: dict, shape: dict, *, card_bytes: int, params: float, drafter_params: int, gpus: int
) -> dict:
    """Limit a job, the bench's and the fp32 check's peaks, and what the check will do (see `check_mode`)."""
    setting = config.get("gpu_memory")
    cap = int(cap_setting(setting) or 0) or memory_cap()  # as the workflow hands it to the jobs
    limit = min(x for x in (cap, card_bytes) if x) if (cap or card_bytes) else 0
    if setting is not None:
        source = f"gpu_memory {setting}"
    elif cap:
        source = "DRAFTSMITH_GPU_MEMORY"
    else:
        source = "the card" if card_bytes else "none (no GPU)"
    hidden, layers = int(shape["hidden_size"]), int(shape["num_hidden_layers"])
    vocab = int(shape.get("vocab_size") or 32000)
    tables = vocab * hidden * (1 if shape.get("tie_word_embeddings") else 2)  # embedding and head
    weights = 2 * params
    drafter = 2 * drafter_params + 2 * 2 * vocab * hidden  # its body, and its own embedding and head in bf16
    layer_fp32 = 4 * (params - tables) / layers
    out = {
        "limit_bytes": int(limit),
        "limit_source": source,
        "weights_bytes": int(weights),
        "bench_bytes": int(weights + drafter + WORKSPACE),
        # fp32 check: the tables cast up (2 more bytes each), one layer in fp32, the drafter's body in fp32
        "check_bytes": int(weights + 2 * tables + layer_fp32 + drafter + 2 * drafter_params + WORKSPACE),
    }
    out["check_runs"], out["check"] = check_mode(config)
    out["notes"] = memory_notes(out, gpus=gpus)
    return out


def check_mode(config: dict) -> tuple[bool, str]:
    """Whether the bench's fp32 check runs on the GPU, and what it will do in words: never a silent skip."""
    bench = config["bench"]
    count = int(bench["fp32_check_prompts"])
    if count == 0:
        return (
            False,
            "off (bench.fp32_check_prompts: 0): no prompt is checked against greedy decoding in fp32",
        )
    if not bench["real_loop"]:
        return False, "none: bench.real_loop is off, so there is no real DFlash loop to check"
    if float(bench["temperature"]) > 0:
        return (
            False,
            f"none: sampling at bench.temperature {bench['temperature']} has no exact answer to check",
        )
    if config["target"]["dtype"] == "fp32":
        return False, "none needed: the bench itself runs in fp32 (target.dtype), and every prompt is checked"
    return True, (
        f"{count} prompts of each bench part, the target computing in fp32 a layer at a time from its own "
        "weights (on a CPU without native bf16 the bench runs in fp32 and is its own check)"
    )


def memory_notes(mem: dict, *, gpus: int) -> list[str]:
    """Warnings where the bench or its check would not fit one GPU's limit."""
    limit = mem["limit_bytes"]
    if not limit or not gpus:
        return []
    notes = []
    if mem["bench_bytes"] > limit:
        notes.append(
            f"warning: the bench needs about {human(mem['bench_bytes'])} and a job may use {human(limit)} of "
            "a GPU: the probe will place each copy of the target on a group of GPUs"
        )
    elif mem["check_runs"] and mem["check_bytes"] > limit:
        notes.append(
            f"warning: the fp32 check needs about {human(mem['check_bytes'])} and a job may use "
            f"{human(limit)}: it will run out of memory after the bench; set bench.fp32_check_prompts: 0 "
            "(the report then says no check ran) or raise gpu_memory"
        )
    return notes


def memory_rows(mem: dict) -> list[tuple[str, str, str]]:
    """The plan table's rows for GPU memory."""
    limit = human(mem["limit_bytes"]) if mem["limit_bytes"] else "no GPU"
    return [
        ("GPU memory a job may use", limit, mem["limit_source"]),
        ("target weights, bf16", human(mem["weights_bytes"]), "2 bytes a parameter"),
        ("bench, one copy", human(mem["bench_bytes"]), "weights, drafter, a prompt's caches"),
        ("fp32 check", human(mem["check_bytes"]), mem["check"]),
    ]
