"""DDTree: the best-first draft tree of a block's per-position distributions, and walking it."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Tree:
    tokens: list[int]  # token of node i (tokens[0] = anchor, filled in by the caller or -1)
    parents: list[int]  # parent of node i (parents[0] = -1)
    depths: list[int]  # depth of node i (depths[0] = 0)

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self) -> list[dict[int, int]]:
        """children()[i] maps a token to the child of node i carrying it (tokens are unique among
        siblings)."""
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
    prefix are its first child (append the best token of the next depth) and its next sibling (swap the last
    token for the next-ranked one); both score no higher, and every prefix has exactly one predecessor, so
    popping a heap N times yields the top N prefixes, each prefix's parent already in the tree. `per_depth`
    caps the width of a depth (per_depth=1 gives the argmax chain, i.e. DFlash).
    """
    depth_max, vocab = logits.shape
    k = min(budget, vocab)
    top_lp, top_tok = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    lp, tok = top_lp.tolist(), top_tok.tolist()
    tree = Tree([anchor], [-1], [0])
    width = [0] * depth_max
    # heap entries: (-score, tiebreak, parent node, depth index of the token, rank at that depth, parent
    # score)
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
