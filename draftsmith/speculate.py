"""Speculative decoding with a block drafter: acceptance replay, DDTree, and real loops against the target.

Round semantics (one target forward per round). After n committed tokens the target's tap states are known for
positions 0..n-2 (the drafter's context, length n-1) and the anchor is token n-1, the bonus of the last
verification. The drafter proposes a block d_1..d_{B-1} (DFlash) or a tree of continuations (DDTree); the target
verifies [anchor, drafts]; the longest drafted path that matches the target's own next tokens is accepted plus one
bonus token from the target. So a round commits k+1 tokens, k accepted drafts. tau = mean tokens committed per
verification round; the prefill forward (which commits the first bonus, token P after a P-token prompt) is not a
round. The last round may commit fewer tokens when the output hits max_new_tokens or a stop token.

Two ways to measure tau:
  replay   run the target once (greedy, or sampled at temperature > 0), then per round run only the drafter on the
           target's tap states of the committed prefix and walk the block or tree against the known continuation.
           Exact at temperature 0 for every architecture, and cheap: no target forward per round.
  real     an actual speculative loop with a KV cache, for wall-clock speedup and the losslessness check (its output
           must equal greedy decoding). Hybrid targets (Gated DeltaNet + attention) need their linear-attention
           conv/recurrent states rolled back: `Cache.crop` cannot undo a recurrence, so we snapshot those states
           before each verification and, when a draft is rejected, restore them and replay the accepted prefix.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

from draftsmith.regenerate import eos_ids_of
from draftsmith.store import tmp_path
from draftsmith.taps import body, cache_kwarg, capture, forward_taps, names_sliding_layers, sliding_window
from draftsmith.train import sync_device


class BlockDrafter(Protocol):
    """What the loops need from a drafter (implemented in `draftsmith.drafter`)."""

    block_size: int
    mask_token_id: int

    def reset(self) -> None: ...

    @property
    def context_length(self) -> int: ...

    def extend(self, target_hidden: torch.Tensor) -> None: ...

    def crop(self, length: int) -> None: ...

    def propose(self, anchor_token: int) -> torch.Tensor: ...


# ----------------------------------------------------------------------------------------------------------------
# Trees. A DFlash block is a chain; DDTree is a tree of the most probable prefixes. Node 0 is the root (the anchor).


@dataclass
class Tree:
    tokens: list[int]  # token of node i (tokens[0] = anchor, filled in by the caller or -1)
    parents: list[int]  # parent of node i (parents[0] = -1)
    depths: list[int]  # depth of node i (depths[0] = 0)

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self) -> list[dict[int, int]]:
        """children()[i] maps a token to the child of node i carrying it (tokens are unique among siblings)."""
        out: list[dict[int, int]] = [{} for _ in self.tokens]
        for i in range(1, len(self.tokens)):
            out[self.parents[i]][self.tokens[i]] = i
        return out

    def prefix(self, i: int) -> tuple[int, ...]:
        path = []
        while i > 0:
            path.append(self.tokens[i])
            i = self.parents[i]
        return tuple(reversed(path))


def chain_tree(draft_tokens: Sequence[int], anchor: int = -1) -> Tree:
    n = len(draft_tokens)
    return Tree([anchor, *draft_tokens], list(range(-1, n)), list(range(n + 1)))


def build_tree(logits: torch.Tensor, budget: int, per_depth: int | None = None, anchor: int = -1) -> Tree:
    """The `budget` most probable prefixes under per-position distributions [D, V], best-first in O(N log N).

    A prefix's score is the sum of its tokens' log-probs. With each depth's tokens sorted, the successors of a
    prefix are its first child (append the best token of the next depth) and its next sibling (swap the last token
    for the next-ranked one); both score no higher, and every prefix has exactly one predecessor, so popping a heap
    N times yields the top N prefixes, each prefix's parent already in the tree. `per_depth` caps the width of a
    depth (per_depth=1 gives the argmax chain, i.e. DFlash).
    """
    depth_max, vocab = logits.shape
    k = min(budget, vocab)
    top_lp, top_tok = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    lp, tok = top_lp.tolist(), top_tok.tolist()
    tree = Tree([anchor], [-1], [0])
    width = [0] * depth_max
    # heap entries: (-score, tiebreak, parent node, depth index of the token, rank at that depth, parent score)
    heap = [(-lp[0][0], 0, 0, 0, 0, 0.0)]
    count = 1
    while heap and len(tree) - 1 < budget:
        neg, _, parent, d, r, pscore = heapq.heappop(heap)
        if per_depth is not None and width[d] >= per_depth:
            continue
        width[d] += 1
        node = len(tree)
        tree.tokens.append(tok[d][r])
        tree.parents.append(parent)
        tree.depths.append(d + 1)
        if r + 1 < k:
            heapq.heappush(heap, (-(pscore + lp[d][r + 1]), count, parent, d, r + 1, pscore))
            count += 1
        if d + 1 < depth_max:
            heapq.heappush(heap, (neg - lp[d + 1][0], count, node, d + 1, 0, -neg))
            count += 1
    return tree


def walk(tree: Tree, next_tokens: Sequence[int]) -> tuple[list[int], int]:
    """Follows the target from the root: at each node i, go to the child carrying next_tokens[i] (the target's
    token after node i's prefix).

    Returns the accepted path (node ids, root first) and the bonus token (the target's token after the path).
    """
    children = tree.children()
    path = [0]
    while True:
        t = next_tokens[path[-1]]
        child = children[path[-1]].get(t)
        if child is None:
            return path, t
        path.append(child)


def ancestor_mask(tree: Tree) -> torch.Tensor:
    """[N, N] bool, True where column j is an ancestor of row i or i itself (parents precede children)."""
    n = len(tree)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        if i > 0:
            anc[i] = anc[tree.parents[i]]
        anc[i, i] = True
    return anc


# ----------------------------------------------------------------------------------------------------------------
# The target's own continuation (the autoregressive baseline) and replay.


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


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
    cache = DynamicCache(config=target.config)
    ids = torch.tensor([list(prompt_ids)], device=device)
    out: list[int] = []
    pos = 0
    while len(out) < max_new_tokens:
        positions = torch.arange(pos, pos + ids.shape[1], device=device)[None]
        logits = target(input_ids=ids, position_ids=positions, use_cache=True, **{cache_kwarg(target): cache}).logits
        pos += ids.shape[1]
        t = _pick(logits[0, -1], temperature, generator)
        out.append(t)
        if t in stops:
            break
        ids = torch.tensor([[t]], device=device)
    sync_device(device)
    return Generation(out, time.perf_counter() - start)


def target_hidden(target: nn.Module, token_ids: Sequence[int], taps: list[int]) -> torch.Tensor:
    """Tap states [T, n_taps*H] of a whole sequence in one causal forward (what the drafter saw in training)."""
    device = next(target.parameters()).device
    ids = torch.tensor([list(token_ids)], device=device)
    return forward_taps(target, ids, None, taps)[0]


@torch.inference_mode()
def replay(
    drafter: BlockDrafter,
    tokens: Sequence[int],
    hidden: torch.Tensor,
    prompt_len: int,
    budget: int | None = None,
    per_depth: int | None = None,
) -> list[int]:
    """Tokens committed per round when the drafter runs against a known target continuation.

    tokens = prompt + the target's continuation (ending at max_new_tokens or a stop token); hidden = the target's
    tap states for (at least) tokens[:-1]. budget None walks the DFlash block, an int walks the DDTree of that
    many nodes. At temperature 0 this is exactly what the real loop commits; with a sampled continuation it is
    match-based verification.
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


# ----------------------------------------------------------------------------------------------------------------
# Real loops. The cache holds the target's keys/values (and linear-attention states) for positions 0..n-2, the
# drafter's context; the anchor at n-1 enters the cache with the next verification.


def _linear_layers(cache: DynamicCache) -> list[LinearAttentionCacheLayerMixin]:
    return [layer for layer in cache.layers if isinstance(layer, LinearAttentionCacheLayerMixin)]


def _attention_layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]
    if any(isinstance(layer, DynamicSlidingWindowLayer) for layer in layers):
        raise NotImplementedError("sliding-window cache layers cannot be rolled back by slicing")
    return layers


def rollback_cache(target: nn.Module) -> DynamicCache:
    """The target's cache with its sliding-window layers made full ones: a verification adds positions that a
    rejection takes back, and a sliding layer would already have dropped what left its window. The model's own
    sliding masks still hide those positions, so nothing it computes changes."""
    cache = DynamicCache(config=target.config)
    cache.layers = [DynamicLayer() if isinstance(layer, DynamicSlidingWindowLayer) else layer for layer in cache.layers]
    return cache


def is_hybrid(target: nn.Module) -> bool:
    return "linear_attention" in (getattr(target.config, "layer_types", None) or [])


def snapshot_linear(cache: DynamicCache) -> list[list[tuple[torch.Tensor | None, torch.Tensor | None]]]:
    """Copies of every linear-attention layer's conv and recurrent states (the verify forward updates them in place)."""
    snap = []
    for layer in _linear_layers(cache):
        snap.append(
            [
                (
                    layer.conv_states[i].clone() if layer.is_conv_states_initialized[i] else None,
                    layer.recurrent_states[i].clone() if layer.is_recurrent_states_initialized[i] else None,
                )
                for i in range(layer.number_of_states)
            ]
        )
    return snap


def restore_linear(
    cache: DynamicCache, snap: list[list[tuple[torch.Tensor | None, torch.Tensor | None]]]
) -> None:
    """Copies the states back into the same tensors (kept in place, so static addresses stay valid)."""
    for layer, states in zip(_linear_layers(cache), snap, strict=True):
        for i, (conv, rec) in enumerate(states):
            if conv is not None:
                layer.conv_states[i].copy_(conv)
            if rec is not None:
                layer.recurrent_states[i].copy_(rec)


def keep_kv(cache: DynamicCache, prefix: int, rows: torch.Tensor | None = None) -> None:
    """Attention layers keep the first `prefix` positions, then (optionally) the given rows after them."""
    for layer in _attention_layers(cache):
        if rows is None:
            layer.keys, layer.values = layer.keys[..., :prefix, :], layer.values[..., :prefix, :]
        else:
            idx = torch.cat([torch.arange(prefix, device=rows.device), prefix + rows])
            layer.keys, layer.values = layer.keys.index_select(-2, idx), layer.values.index_select(-2, idx)


def _forward(
    target: nn.Module,
    token_ids: Sequence[int],
    positions: Sequence[int],
    cache: DynamicCache,
    taps: list[int],
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target forward with the cache; returns logits [T, V] and tap states [T, n_taps*H]."""
    device = next(target.parameters()).device
    ids = torch.tensor([list(token_ids)], device=device)
    pos = torch.tensor([list(positions)], device=device)
    with capture(target, taps, stop_early=False) as store:
        out = target(
            input_ids=ids,
            position_ids=pos,
            **{cache_kwarg(target): cache},
            attention_mask=attention_mask,
            use_cache=True,
        )
    return out.logits[0], torch.cat([store[t][0] for t in taps], dim=-1)


def tree_attention_mask(tree: Tree, prefix: int, dtype: torch.dtype, device: torch.device,
                        window: int | None = None) -> torch.Tensor:
    """[1, 1, N, prefix+N] additive mask: every node sees the cached prefix and its own ancestors only (with a
    `window`, only those fewer than `window` positions behind it: a sliding layer; a node sits at prefix+depth)."""
    n = len(tree)
    allowed = torch.ones(n, prefix + n, dtype=torch.bool)
    allowed[:, prefix:] = ancestor_mask(tree)
    if window:
        q = prefix + torch.as_tensor(tree.depths)
        k = torch.cat([torch.arange(prefix), q])
        allowed &= (q[:, None] - k[None, :]) < window
    mask = torch.zeros(n, prefix + n, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


@torch.inference_mode()
def speculative_generate(
    target: nn.Module,
    drafter: BlockDrafter,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    taps: list[int],
    budget: int | None = None,
    stop_ids: Sequence[int] = (),
    timing: bool = False,
) -> tuple[Generation, list[int]]:
    """Greedy speculative decoding: DFlash (budget None) or DDTree (budget nodes, attention-only targets).

    Returns the generation (split: seconds in prefill / draft / verify / restore, synchronised when `timing`) and
    the tokens committed per round. Lossless by construction: every committed token is the target's argmax.
    """
    device = next(target.parameters()).device
    dtype = next(target.parameters()).dtype
    hybrid = is_hybrid(target)
    if hybrid and budget is not None:
        raise NotImplementedError(
            "DDTree verification needs tree attention; Gated DeltaNet layers run a recurrence over a sequence, "
            "so a hybrid target gets DDTree tau from replay only"
        )
    stops = set(stop_ids)
    split = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "restore": 0.0}
    clock = [time.perf_counter()]

    def lap(key: str) -> None:
        if timing:
            sync_device(device)
        now = time.perf_counter()
        split[key] += now - clock[0]
        clock[0] = now

    sync_device(device)
    start = clock[0] = time.perf_counter()
    prompt = list(prompt_ids)
    p = len(prompt)
    cache = rollback_cache(target)
    window = sliding_window(target)
    by_kind = names_sliding_layers(target)  # else, with a window, every layer slides and takes one mask
    logits, hidden = _forward(target, prompt, range(p), cache, taps)
    tokens = prompt + [int(logits[-1].argmax())]
    drafter.reset()
    drafter.extend(hidden)
    committed: list[int] = []
    lap("prefill")
    while len(tokens) - p < max_new_tokens and tokens[-1] not in stops:
        n = len(tokens)
        anchor = tokens[-1]
        draft_logits = drafter.propose(anchor)
        if budget is None:
            tree = chain_tree(draft_logits.argmax(-1).tolist(), anchor)
        else:
            tree = build_tree(draft_logits, budget, anchor=anchor)
        tree.tokens[0] = anchor
        lap("draft")
        snap = snapshot_linear(cache) if hybrid else None
        mask = None
        if budget is not None:
            mask = tree_attention_mask(tree, n - 1, dtype, device)
            if window:
                slide = tree_attention_mask(tree, n - 1, dtype, device, window)
                mask = {"full_attention": mask, "sliding_attention": slide} if by_kind else slide
        logits, hidden = _forward(target, tree.tokens, [n - 1 + d for d in tree.depths], cache, taps, mask)
        path, bonus = walk(tree, logits.argmax(-1).tolist())
        lap("verify")
        k = len(path) - 1
        if budget is not None:
            keep_kv(cache, n - 1, torch.tensor(path, device=device))
        elif not hybrid:
            keep_kv(cache, n + k)
        elif k < len(tree) - 1:
            # hybrid with a rejection: roll the recurrence back, then replay the accepted prefix
            restore_linear(cache, snap)
            keep_kv(cache, n - 1)
            pos = torch.arange(n - 1, n + k, device=device)[None]
            ids = torch.tensor([tree.tokens[: k + 1]], device=device)
            inner = body(target)
            inner(input_ids=ids, position_ids=pos, use_cache=True, **{cache_kwarg(inner): cache})
        lap("restore")
        new = [tree.tokens[i] for i in path[1:]] + [bonus]
        new = new[: max_new_tokens - (len(tokens) - p)]
        for j, t in enumerate(new):
            if t in stops:
                new = new[: j + 1]
                break
        drafter.extend(hidden[path[: len(new)]])
        tokens += new
        committed.append(len(new))
        lap("draft")
    sync_device(device)
    return Generation(tokens[p:], time.perf_counter() - start, split), committed


# ----------------------------------------------------------------------------------------------------------------
# Summaries.


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


# ----------------------------------------------------------------------------------------------------------------
# Benchmark of one prompt: every method against the same target run, so speedups compare like with like.

HYBRID_DDTREE_NOTE = (
    "no wall-clock: hybrid target (Gated DeltaNet layers run a recurrence along the sequence, so a tree cannot be "
    "verified in one forward with an ancestor mask); tau from exact replay"
)


class Wrapped:
    """A drafter around another: context handling is the inner drafter's, only `propose` changes."""

    def __init__(self, drafter: BlockDrafter, block_size: int | None = None):
        self.inner, self.mask_token_id = drafter, drafter.mask_token_id
        self.block_size = block_size or drafter.block_size

    def reset(self) -> None:
        self.inner.reset()

    @property
    def context_length(self) -> int:
        return self.inner.context_length

    def extend(self, target_hidden: torch.Tensor) -> None:
        self.inner.extend(target_hidden)

    def crop(self, length: int) -> None:
        self.inner.crop(length)

    def propose(self, anchor_token: int) -> torch.Tensor:
        return self.inner.propose(anchor_token)


class ShorterBlock(Wrapped):
    """Runs a drafter with a smaller block than it was trained with (keeps the first B-1 positions)."""

    def propose(self, anchor_token: int) -> torch.Tensor:
        return self.inner.propose(anchor_token)[: self.block_size - 1]


def bench_prompt(
    target: nn.Module,
    drafter: BlockDrafter,
    prompt_ids: Sequence[int],
    taps: list[int],
    bench: dict,
    stop_ids: Sequence[int] = (),
    seed: int = 0,
) -> list[dict]:
    """One record per method (and DDTree budget) for one prompt; `bench` is the config's bench section."""
    methods = bench.get("methods", ["ar", "dflash", "ddtree"])
    max_new = int(bench.get("max_new_tokens", 128))
    temperature = float(bench.get("temperature", 0.0))
    real = bool(bench.get("real_loop", True)) and temperature <= 0
    block = drafter.block_size
    hybrid = is_hybrid(target)
    greedy = ar_generate(target, prompt_ids, max_new, stop_ids)
    if temperature > 0:
        gen = torch.Generator().manual_seed(seed)
        continuation = ar_generate(target, prompt_ids, max_new, stop_ids, temperature, gen).tokens
    else:
        continuation = greedy.tokens
    tokens = list(prompt_ids) + continuation
    hidden = target_hidden(target, tokens, taps)
    base = {
        "prompt_tokens": len(prompt_ids),
        "new_tokens": len(continuation),
        "block_size": block,
        "temperature": temperature,
        "hybrid": hybrid,
        "ar_seconds": greedy.seconds,
        "ar_tokens": len(greedy.tokens),
    }
    records = []
    if "ar" in methods:
        records.append(
            {
                **base,
                "method": "ar",
                "budget": None,
                "committed": [1] * len(greedy.tokens),
                "seconds": greedy.seconds,
                "out_tokens": len(greedy.tokens),
                "lossless": True,
            }
        )
    runs: list[tuple[str, int | None]] = []
    if "dflash" in methods:
        runs.append(("dflash", None))
    if "ddtree" in methods:
        runs += [("ddtree", int(b)) for b in bench.get("ddtree_budgets", [16, 64, 256])]
    for method, budget in runs:
        rec = {**base, "method": method, "budget": budget}
        rec["committed"] = replay(drafter, tokens, hidden, len(prompt_ids), budget)
        rec["tau"] = tau(rec["committed"])
        rec.update(seconds=None, out_tokens=None, lossless=None, split=None, real_committed=None, note=None)
        if real and hybrid and budget is not None:
            rec["note"] = HYBRID_DDTREE_NOTE
        elif real:
            out, committed = speculative_generate(
                target, drafter, prompt_ids, max_new, taps, budget, stop_ids, timing=True
            )
            rec.update(
                seconds=out.seconds, out_tokens=len(out.tokens), split=out.split, real_committed=committed
            )
            rec["exact"] = out.tokens == greedy.tokens
            rec["divergence"] = None if rec["exact"] else divergence(target, prompt_ids, greedy.tokens, out.tokens)
            rec["lossless"] = rec["exact"] or rec["divergence"]["tie"]
        records.append(rec)
    return records


@torch.inference_mode()
def divergence(target: nn.Module, prompt_ids: Sequence[int], greedy: list[int], spec: list[int]) -> dict:
    """Where the speculative output first leaves greedy decoding, and whether that was a numerical tie.

    In bf16 a block verification and a one-token decode round differently, so two tokens whose logits differ by
    less than the rounding of the logits can swap. That is a tie of the arithmetic, not a bug of the loop; a margin
    above the rounding is a real loss and is reported as one.
    """
    i = next((k for k, (a, b) in enumerate(zip(greedy, spec)) if a != b), min(len(greedy), len(spec)))
    if i >= min(len(greedy), len(spec)):
        return {"index": i, "margin": None, "tolerance": None, "tie": False}  # one stopped early: a real loss
    device = next(target.parameters()).device
    ids = torch.tensor([list(prompt_ids) + greedy[:i]], device=device)
    logits = target(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1].float()
    margin = float(logits[greedy[i]] - logits[spec[i]])
    tol = float(4 * torch.finfo(next(target.parameters()).dtype).eps * logits.abs().max())
    return {"index": i, "margin": margin, "tolerance": tol, "tie": abs(margin) <= tol}


def prompt_ids_of(record: dict, tokenizer, thinking: bool) -> list[int]:
    """A chat record (trailing assistant turns dropped) through the chat template, or a plain `prompt` string."""
    from draftsmith.data import render

    if record.get("messages") is not None:
        msgs = list(
            record["messages"].tolist() if hasattr(record["messages"], "tolist") else record["messages"]
        )
        msgs = [{"role": m["role"], "content": m["content"]} for m in msgs]
        while msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
    else:
        msgs = [{"role": "user", "content": record["prompt"]}]
    if tokenizer.chat_template is None:
        return tokenizer(render(tokenizer, msgs, thinking), add_special_tokens=True)["input_ids"]
    text = render(tokenizer, msgs, thinking, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def drafter_taps(drafter_dir: str) -> list[int]:
    from pathlib import Path

    cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
    return [int(t) for t in cfg["dflash_config"]["target_layer_ids"]]


def _bench_key(target_dir: str, drafter_dir: str, prompts_path: str, part: int, parts: int, bench: dict,
               taps: list[int] | None, dataset: str, target_cfg: dict) -> str:
    """What a partial benchmark file must have been made with to be resumed (a retrained drafter starts afresh)."""
    from pathlib import Path

    from draftsmith.config import content_hash

    def stamp(p: Path) -> tuple:
        st = p.stat() if p.exists() else None
        return (str(p), st.st_size, st.st_mtime_ns) if st else (str(p),)

    d = Path(drafter_dir)
    return content_hash(target_dir, stamp(d / "config.json"), stamp(d / "model.safetensors"),
                        stamp(Path(prompts_path)), part, parts, bench, taps, dataset, target_cfg)


def read_partial(path, key: str) -> dict[int, list[dict]]:
    """Finished prompts of a killed run: index -> records. A torn last line (killed mid-write) is dropped."""
    done: dict[int, list[dict]] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return done
    if not lines or lines[0] != json.dumps({"key": key}):
        return done  # made with another drafter, config or prompt file: start afresh
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        done[int(row["index"])] = row["records"]
    return done


def run_bench(
    target_dir: str,
    drafter_dir: str,
    prompts_path: str,
    part: int,
    parts: int,
    out_path: str,
    bench: dict,
    taps: list[int] | None = None,
    dataset: str | None = None,
    gpus: int = 1,
    target_cfg: dict | None = None,
) -> int:
    """Benchmarks prompts part::parts of a prompt file on one model copy (`gpus` devices from the pool); writes
    one JSON line per record.

    Each finished prompt is appended (and fsynced) to `<out>.partial`, so a killed job's rerun skips the prompts
    it already did; the output appears, complete, by rename at the end.
    """
    import logging
    import os
    from pathlib import Path

    from tqdm import tqdm

    from draftsmith import faults
    from draftsmith.data import iter_records
    from draftsmith.drafter import load_block_drafter
    from draftsmith.extract import load_configured_target
    from draftsmith.gpu_pool import acquire

    dataset = dataset or Path(prompts_path).stem
    records = [rec for _, _, rec in iter_records(prompts_path) if not isinstance(rec, Exception)]
    if bench.get("max_prompts"):
        records = records[: int(bench["max_prompts"])]
    mine = records[part::parts]
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = tmp_path(out)
    target_cfg = target_cfg or {}
    key = _bench_key(target_dir, drafter_dir, prompts_path, part, parts, bench, taps, dataset, target_cfg)
    done = {i: r for i, r in read_partial(partial, key).items() if i < len(mine)}
    if done:
        logging.getLogger(__name__).info("resuming: %d of %d prompts already benchmarked in %s", len(done),
                                         len(mine), partial)
    tmp = partial.with_name(partial.name + ".tmp")  # the partial file rewritten without a torn line
    tmp.write_text("".join(json.dumps(x) + "\n" for x in
                           [{"key": key}] + [{"index": i, "records": r} for i, r in sorted(done.items())]))
    os.replace(tmp, partial)
    todo = [i for i in range(len(mine)) if i not in done]
    with acquire(gpus if todo else 0) as devices, partial.open("a") as log_f:
        if todo:
            target, tokenizer, device = load_configured_target(target_dir, devices, target_cfg)
            drafter = load_block_drafter(drafter_dir, target_dir, device, next(target.parameters()).dtype)
            if bench.get("block_size"):
                drafter = ShorterBlock(drafter, int(bench["block_size"]))
            taps = taps or drafter_taps(drafter_dir)
            stop_ids = eos_ids_of(target, tokenizer)
            thinking = bool(bench.get("thinking", False))
            for w in range(int(bench.get("warmup", 1))):  # compile kernels, warm allocators
                bench_prompt(
                    target, drafter, prompt_ids_of(mine[todo[0]], tokenizer, thinking), taps, bench, stop_ids, w
                )
        for n, i in enumerate(tqdm(todo, desc=f"bench {dataset} part {part}", unit="prompt"), 1):
            rec = mine[i]
            ids = prompt_ids_of(rec, tokenizer, thinking)
            rows = [{"dataset": dataset, "id": str(rec.get("id", part + i * parts)), **r}
                    for r in bench_prompt(target, drafter, ids, taps, bench, stop_ids, seed=part + i * parts)]
            done[i] = rows
            log_f.write(json.dumps({"index": i, "records": rows}) + "\n")
            log_f.flush()
            os.fsync(log_f.fileno())
            faults.pause(f"bench:{n}")  # a drill: killed here, the rerun starts at the next prompt
    rows = [r for i in sorted(done) for r in done[i]]
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, out)
    partial.unlink()
    return len(rows)
