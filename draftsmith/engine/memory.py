"""Memory plan of the engine: how many slots fit the free GPU memory, and the error when one cannot."""

from __future__ import annotations

import logging

from draftsmith.engine.engine import Engine

log = logging.getLogger(__name__)


def fit_slots(
    wanted: int, max_len: int, per_position: int, fixed: int, free_bytes: int, reserve_bytes: int
) -> int:
    """How many slots fit in `free_bytes` after `reserve_bytes` (prefill activations, logits, allocator
    slack).

    A slot holds `max_len` positions of keys and values plus its linear-attention states; the states count
    1.25 times, because a prefill group (at most a quarter of the slots, see `Engine.group_rows`) holds a copy
    of its rows' states until they are loaded into the slots.
    """
    return max(
        0, min(wanted, (free_bytes - reserve_bytes) // max(slot_need(per_position, fixed, max_len), 1))
    )


def slot_need(per_position: int, fixed: int, max_len: int) -> int:
    """Bytes one slot of `max_len` positions takes, its prefill copy of the states included (see
    `fit_slots`)."""
    return per_position * max_len + fixed + fixed // 4


def prefill_reserve(model, prefill_tokens: int) -> int:
    """Memory a prefill group's activations need: the widest of them (the MLP's) a few times over, plus 2
    GiB."""
    cfg = model.config.get_text_config()
    width = getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size
    itemsize = next(model.parameters()).element_size()
    return 4 * prefill_tokens * width * itemsize + (2 << 30)


class NoRoomForAnswers(RuntimeError):
    """Not even one answer's slot fits beside the weights: a setting must change, a retry cannot help."""


def plan_slots(
    model, wanted: int, max_len: int, pad_id: int, free_bytes: int, prefill_tokens: int = 16384
) -> int:
    """The slots to decode with: `wanted`, or fewer (with a warning) when they do not fit in `free_bytes`."""
    per_position, fixed = Engine(model, slots=1, max_len=2, eos_ids=[], pad_id=pad_id).slot_bytes()
    reserve = prefill_reserve(model, prefill_tokens)
    fit = fit_slots(wanted, max_len, per_position, fixed, free_bytes, reserve)
    if fit < 1:
        need = (slot_need(per_position, fixed, max_len) + reserve) / 2**30
        raise NoRoomForAnswers(
            f"regeneration needs {need:.2f} GiB for one answer of up to {max_len} tokens, and "
            f"{free_bytes / 2**30:.2f} GiB is free beside the weights: lower data.max_length or "
            "data.regenerate.max_new_tokens, or give the model more GPUs (a larger group)"
        )
    if fit < wanted:
        log.warning(
            "regeneration: %d slots of %d tokens do not fit in %.1f GiB free; using %d "
            "(data.regenerate.batch_size)",
            wanted,
            max_len,
            free_bytes / 2**30,
            fit,
        )
    return fit
