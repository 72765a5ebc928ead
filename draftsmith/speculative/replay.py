"""The autoregressive baseline and the replay that measures tau from the target's known continuation."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache

from draftsmith.core.runtime import sync_device
from draftsmith.speculative.proposers import Proposer
from draftsmith.speculative.trees import build_tree, chain_tree, walk
from draftsmith.target.layers import cache_kwarg
from draftsmith.target.sampling import pick
from draftsmith.target.taps import forward_taps


@dataclass
class Generation:
    tokens: list[int]  # new tokens only
    seconds: float  # wall-clock, prefill included
    split: dict[str, float] = field(default_factory=dict)


@torch.inference_mode()
def ar_generate(
    target: nn.Module,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> Generation:
    """One token per forward with a KV cache: the baseline, and at temperature 0 the reference output."""
    device = next(target.parameters()).device
    stops = set(stop_ids)
    sync_device(device)
    start = time.perf_counter()
    cache = DynamicCache(config=target.config)  # type: ignore[arg-type]  # nn.Module attributes are untyped
    ids = torch.tensor([list(prompt_ids)], device=device)
    out: list[int] = []
    pos = 0
    while len(out) < max_new_tokens:
        positions = torch.arange(pos, pos + ids.shape[1], device=device)[None]
        logits = target(
            input_ids=ids, position_ids=positions, use_cache=True, **{cache_kwarg(target): cache}
        ).logits
        pos += ids.shape[1]
        t = int(pick(logits[0, -1], temperature, 1.0, generator))
        out.append(t)
        if t in stops:
            break
        ids = torch.tensor([[t]], device=device)
    sync_device(device)
    return Generation(out, time.perf_counter() - start)


def target_hidden(target: nn.Module, token_ids: Sequence[int], taps: list[int]) -> torch.Tensor:
    """Tap states [T, n_taps*H] of a whole sequence in one causal forward (what the drafter saw in
    training)."""
    device = next(target.parameters()).device
    ids = torch.tensor([list(token_ids)], device=device)
    return forward_taps(target, ids, None, taps)[0]


@torch.inference_mode()
def replay(
    drafter: Proposer,
    tokens: Sequence[int],
    hidden: torch.Tensor,
    prompt_len: int,
    budget: int | None = None,
    per_depth: int | None = None,
) -> list[int]:
    """Tokens committed per round when the drafter runs against a known target continuation.

    tokens = prompt + the target's continuation (ending at max_new_tokens or a stop token); hidden = the
    target's tap states for (at least) tokens[:-1]. budget None walks the DFlash block, an int walks the
    DDTree of that many nodes. At temperature 0 this is exactly what the real loop commits; with a sampled
    continuation it is match-based verification.
    """
    end = len(tokens)
    drafter.reset()
    drafter.extend(hidden[:prompt_len])
    n = prompt_len + 1
    committed: list[int] = []
    while n < end:
        logits = drafter.propose(int(tokens[n - 1]))
        tree = (
            chain_tree(logits.argmax(-1).tolist())
            if budget is None
            else build_tree(logits, budget, per_depth)
        )
        path, _ = walk(tree, [int(tokens[n + d]) if n + d < end else -1 for d in tree.depths])
        c = min(len(path), end - n)  # accepted + bonus, cut at the end of the continuation
        drafter.extend(hidden[n - 1 : n - 1 + c])
        committed.append(c)
        n += c
    return committed


def tau(committed: Sequence[int]) -> float:
    return sum(committed) / len(committed) if committed else float("nan")


def acceptance_by_position(committed: Sequence[int], block_size: int) -> list[float]:
    """Fraction of rounds whose draft position i (1..B-1) was accepted, i.e. committed >= i + 1."""
    if not committed:
        return [float("nan")] * (block_size - 1)
    return [sum(c > i for c in committed) / len(committed) for i in range(1, block_size)]


def histogram(committed: Sequence[int], size: int) -> list[int]:
    """Counts of rounds by accepted drafts (committed - 1), 0..size-1."""
    counts = [0] * size
    for c in committed:
        counts[min(c - 1, size - 1)] += 1
    return counts
