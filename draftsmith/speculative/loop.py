"""Speculative decoding with a block drafter: acceptance replay, DDTree, and real loops against the target.

Round semantics (one target forward per round). After n committed tokens the target's tap states are known for
positions 0..n-2 (the drafter's context, length n-1) and the anchor is token n-1, the bonus of the last
verification. The drafter proposes a block d_1..d_{B-1} (DFlash) or a tree of continuations (DDTree); the
target verifies [anchor, drafts]; the longest drafted path that matches the target's own next tokens is
accepted plus one bonus token from the target. So a round commits k+1 tokens, k accepted drafts. tau = mean
tokens committed per verification round; the prefill forward (which commits the first bonus, token P after a
P-token prompt) is not a round. The last round may commit fewer tokens when the output hits max_new_tokens or
a stop token.

Two ways to measure tau:
  replay   run the target once (greedy, or sampled at temperature > 0), then per round run only the drafter on
           the target's tap states of the committed prefix and walk the block or tree against the known
           continuation. Exact at temperature 0 for every architecture, and cheap: no target forward per
           round.
  real     an actual speculative loop with a KV cache, for wall-clock speedup and the losslessness check (its
           output must equal greedy decoding). Hybrid targets (Gated DeltaNet + attention) need their
           linear-attention conv/recurrent states rolled back: `Cache.crop` cannot undo a recurrence, so we
           snapshot those states before each verification and, when a draft is rejected, restore them and
           replay the accepted prefix.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

from draftsmith.core.runtime import sync_device
from draftsmith.speculative.proposers import Proposer
from draftsmith.speculative.replay import Generation
from draftsmith.speculative.trees import Tree, ancestor_mask, build_tree, chain_tree, walk
from draftsmith.target.layers import body, cache_kwarg, names_sliding_layers, sliding_window
from draftsmith.target.sampling import pick
from draftsmith.target.taps import capture


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
    cache = DynamicCache(config=target.config)  # type: ignore[arg-type]  # nn.Module attributes are untyped
    cache.layers = [
        DynamicLayer() if isinstance(layer, DynamicSlidingWindowLayer) else layer for layer in cache.layers
    ]
    return cache


def is_hybrid(target: nn.Module) -> bool:
    return "linear_attention" in (getattr(target.config, "layer_types", None) or [])


def snapshot_linear(cache: DynamicCache) -> list[list[tuple[torch.Tensor | None, torch.Tensor | None]]]:
    """Copies of every linear-attention layer's conv and recurrent states (the verify forward updates them in
    place)."""
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
        assert layer.keys is not None and layer.values is not None  # attention layers hold the prefix
        if rows is None:
            layer.keys, layer.values = layer.keys[..., :prefix, :], layer.values[..., :prefix, :]
        else:
            idx = torch.cat([torch.arange(prefix, device=rows.device), prefix + rows])
            layer.keys, layer.values = layer.keys.index_select(-2, idx), layer.values.index_select(-2, idx)


def _forward(
    target: nn.Module,
    token_ids: Sequence[int],
    *,
    positions: Sequence[int],
    cache: DynamicCache,
    taps: list[int],
    attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
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


def tree_attention_mask(
    tree: Tree, prefix: int, dtype: torch.dtype, device: torch.device, window: int | None = None
) -> torch.Tensor:
    """[1, 1, N, prefix+N] additive mask: every node sees the cached prefix and its own ancestors only (with a
    `window`, only those fewer than `window` positions behind it: a sliding layer; a node sits at
    prefix+depth)."""
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
    drafter: Proposer,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    taps: list[int],
    budget: int | None = None,
    stop_ids: Sequence[int] = (),
    timing: bool = False,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[Generation, list[int]]:
    """Speculative decoding: DFlash (budget None) or DDTree (budget nodes, attention-only targets).

    Returns the generation (split: seconds in prefill / draft / verify / restore, synchronised when `timing`)
    and the tokens committed per round. Lossless by construction: at temperature 0 every committed token is
    the target's argmax. Above it, as the references do, DFlash samples its drafts and keeps them by rejection
    sampling, and DDTree walks its tree down one target sample per node: either way the output is distributed
    as the target's own samples.
    """
    device = next(target.parameters()).device
    dtype = next(target.parameters()).dtype
    hybrid = is_hybrid(target)
    if hybrid and budget is not None:
        raise NotImplementedError(
            "DDTree verification needs tree attention; Gated DeltaNet layers run a recurrence over a "
            "sequence, so a hybrid target gets DDTree tau from replay only"
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
    logits, hidden = _forward(target, prompt, positions=range(p), cache=cache, taps=taps)
    tokens = prompt + [int(pick(logits[-1], temperature, 1.0, generator))]
    drafter.reset()
    drafter.extend(hidden)
    committed: list[int] = []
    lap("prefill")
    while len(tokens) - p < max_new_tokens and tokens[-1] not in stops:
        n = len(tokens)
        tree, draft_probs = _propose(
            drafter, tokens[-1], budget=budget, temperature=temperature, gen=generator
        )
        lap("draft")
        snap = snapshot_linear(cache) if hybrid else None
        mask = None
        if budget is not None:
            mask = _tree_masks(tree, n - 1, dtype=dtype, device=device, window=window, by_kind=by_kind)
        positions = [n - 1 + d for d in tree.depths]
        logits, hidden = _forward(
            target, tree.tokens, positions=positions, cache=cache, taps=taps, attention_mask=mask
        )
        path, bonus = _accept(tree, logits, draft_probs, temperature=temperature, gen=generator)
        lap("verify")
        _drop_rejected(target, cache, tree=tree, path=path, n=n, budget=budget, snap=snap, device=device)
        lap("restore")
        new = _accepted_tokens(tree, path, bonus=bonus, room=max_new_tokens - (len(tokens) - p), stops=stops)
        drafter.extend(hidden[path[: len(new)]])
        tokens += new
        committed.append(len(new))
        lap("draft")
    sync_device(device)
    return Generation(tokens[p:], time.perf_counter() - start, split), committed


def _propose(
    drafter: Proposer, anchor: int, *, budget: int | None, temperature: float, gen: torch.Generator | None
) -> tuple[Tree, torch.Tensor | None]:
    """The round's drafts: the argmax chain (DFlash) or the tree (DDTree, at any temperature, as its reference
    builds it); above temperature 0 DFlash samples its chain and returns its q for the acceptance test."""
    if temperature > 0 and budget is None:
        return _sampled_chain(drafter, anchor, temperature=temperature, generator=gen)
    return _draft_tree(drafter, anchor, budget=budget), None


def _accept(
    tree: Tree,
    logits: torch.Tensor,
    q: torch.Tensor | None,
    *,
    temperature: float,
    gen: torch.Generator | None,
) -> tuple[list[int], int]:
    """The accepted path and the bonus: the walk down the target's argmax at temperature 0; above it,
    rejection sampling against q (DFlash), or the walk down one target sample per node (DDTree's reference
    rule)."""
    if q is None:
        nxt = logits.argmax(-1) if temperature <= 0 else pick(logits.float().cpu(), temperature, 1.0, gen)
        return walk(tree, nxt.tolist())
    p = torch.softmax(logits.float().cpu() / temperature, dim=-1)
    return rejection_walk(tree.tokens[1:], p, q, generator=gen)


def _sampled_chain(
    drafter: Proposer, anchor: int, *, temperature: float, generator: torch.Generator | None
) -> tuple[Tree, torch.Tensor]:
    """The round's block sampled position by position from the drafter's distributions q [B-1, V] (on the
    CPU, where the generator draws), and q itself for the acceptance test."""
    logits = drafter.propose(anchor).float().cpu()
    drafts = pick(logits, temperature, 1.0, generator)
    return chain_tree(drafts.tolist(), anchor), torch.softmax(logits / temperature, dim=-1)


def rejection_walk(
    drafts: Sequence[int], p: torch.Tensor, q: torch.Tensor, *, generator: torch.Generator | None
) -> tuple[list[int], int]:
    """Speculative sampling's acceptance: draft i (drawn from q[i]) is kept with probability
    min(1, p[i](d) / q[i](d)), where p[i] is the target's distribution after the prefix through node i; the
    first rejected position draws its token from max(p[i] - q[i], 0), renormalised; with every draft kept the
    bonus comes from p[len(drafts)]. The committed tokens are then distributed as the target's own samples.

    Returns the accepted path of chain nodes (root first) and the bonus token, as `walk` does."""
    path = [0]
    for i, d in enumerate(drafts):
        u = float(torch.rand((), generator=generator))
        if u * float(q[i, d]) < float(p[i, d]):
            path.append(i + 1)
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        row = residual if float(residual.sum()) > 0 else p[i]  # p == q leaves no residual: nothing to correct
        return path, int(torch.multinomial(row, 1, generator=generator))
    return path, int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def _draft_tree(drafter: Proposer, anchor: int, *, budget: int | None) -> Tree:
    """The round's proposal rooted at the anchor: a chain of the block's argmaxes (DFlash), or the `budget`
    most likely continuations (DDTree)."""
    draft_logits = drafter.propose(anchor)
    if budget is None:
        tree = chain_tree(draft_logits.argmax(-1).tolist(), anchor)
    else:
        tree = build_tree(draft_logits, budget, anchor=anchor)
    tree.tokens[0] = anchor
    return tree


def _tree_masks(
    tree: Tree,
    prefix: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
    window: int | None,
    by_kind: bool,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The verification's tree attention mask; with a sliding window, the windowed one too, keyed by layer
    kind where the model names its sliding layers (else every layer slides and takes the windowed mask
    alone)."""
    full = tree_attention_mask(tree, prefix, dtype, device)
    if not window:
        return full
    slide = tree_attention_mask(tree, prefix, dtype, device, window)
    return {"full_attention": full, "sliding_attention": slide} if by_kind else slide


def _drop_rejected(
    target: nn.Module,
    cache: DynamicCache,
    *,
    tree: Tree,
    path: list[int],
    n: int,
    budget: int | None,
    snap: list | None,
    device: torch.device,
) -> None:
    """Takes the rejected drafts back out of the cache after a verification of the round at `n` committed
    tokens.

    Attention layers keep the accepted path's rows (DDTree) or the accepted prefix (DFlash). A hybrid target
    (`snap`: its linear-attention states before the verification) cannot undo a recurrence, so after a
    rejection its states are restored and the accepted prefix replayed.
    """
    k = len(path) - 1
    if budget is not None:
        keep_kv(cache, n - 1, torch.tensor(path, device=device))
    elif snap is None:
        keep_kv(cache, n + k)
    elif k < len(tree) - 1:
        restore_linear(cache, snap)
        keep_kv(cache, n - 1)
        pos = torch.arange(n - 1, n + k, device=device)[None]
        ids = torch.tensor([tree.tokens[: k + 1]], device=device)
        inner = body(target)
        inner(input_ids=ids, position_ids=pos, use_cache=True, **{cache_kwarg(inner): cache})


def _accepted_tokens(tree: Tree, path: list[int], *, bonus: int, room: int, stops: set[int]) -> list[int]:
    """The round's committed tokens: the accepted drafts and the bonus, cut to the `room` left under
    max_new_tokens and after the first stop token."""
    new = [tree.tokens[i] for i in path[1:]] + [bonus]
    new = new[:room]
    for j, t in enumerate(new):
        if t in stops:
            return new[: j + 1]
    return new
