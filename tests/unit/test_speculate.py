"""Speculation against tiny real targets (attention-only Qwen3, hybrid Qwen3.5) with drafters of known
behaviour."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import sliding_model, tiny_model

from draftsmith.config import with_defaults
from draftsmith.speculative import replay as replay_
from draftsmith.speculative.bench import bench_prompt
from draftsmith.speculative.loop import speculative_generate
from draftsmith.speculative.replay import acceptance_by_position, ar_generate, histogram, replay, tau
from draftsmith.speculative.trees import Tree, ancestor_mask, build_tree, chain_tree

VOCAB = 96
TAPS = [0, 2]
BLOCK = 5
MAX_NEW = 40


def _attention_target():
    return tiny_model("attention", VOCAB, layers=4, max_position_embeddings=256, initializer_range=0.2)


def _hybrid_target():
    return tiny_model(
        "hybrid",
        VOCAB,
        layers=4,
        linear_conv_kernel_dim=4,
        max_position_embeddings=256,
        initializer_range=0.2,
    )


def _sliding_target():
    """Sliding layers with a window shorter than prompt plus answer: a rolled-back position must stay
    hidden."""
    return tiny_model(
        "attention",
        VOCAB,
        layers=3,
        max_position_embeddings=256,
        initializer_range=0.2,
        use_sliding_window=True,
        sliding_window=6,
        max_window_layers=0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )


@pytest.fixture(scope="module", params=["attention", "hybrid", "sliding"])
def case(request):
    """A target, a prompt, the target's greedy continuation and the tap states of the whole sequence."""
    target = {"attention": _attention_target, "hybrid": _hybrid_target, "sliding": _sliding_target}[
        request.param
    ]()
    prompt = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    gen = ar_generate(target, prompt, MAX_NEW)
    tokens = prompt + gen.tokens
    hidden = replay_.target_hidden(target, tokens, TAPS)
    return request.param, target, prompt, tokens, hidden


class ScriptedDrafter:
    """Knows the target's continuation; at absolute position p it proposes the true token when good(p), else a
    wrong token ranked first with the true one second (so a tree can still find it). It checks the round
    protocol: the anchor is the token at position context_length, and extended rows equal the target's tap
    states."""

    def __init__(self, tokens, hidden, good, block_size: int = BLOCK):
        self.tokens, self.hidden, self.good = tokens, hidden, good
        self.block_size, self.mask_token_id = block_size, VOCAB - 1
        self.n = 0

    def reset(self) -> None:
        self.n = 0

    @property
    def context_length(self) -> int:
        return self.n

    def extend(self, target_hidden: torch.Tensor) -> None:
        t = target_hidden.shape[0]
        torch.testing.assert_close(
            target_hidden.float(), self.hidden[self.n : self.n + t].float(), atol=1e-2, rtol=1e-3
        )
        self.n += t

    def crop(self, length: int) -> None:
        self.n = length

    def propose(self, anchor_token: int) -> torch.Tensor:
        assert anchor_token == self.tokens[self.n], "anchor must be the token at position context_length"
        logits = torch.zeros(self.block_size - 1, VOCAB)
        for i in range(1, self.block_size):
            p = self.n + i
            true = self.tokens[p] if p < len(self.tokens) else 0
            if self.good(p):
                logits[i - 1, true] = 8.0
            else:
                logits[i - 1, (true + 1) % VOCAB] = 8.0
                logits[i - 1, true] = 7.0
        return logits


def _sometimes(p: int) -> bool:
    return (p * 7919) % 5 not in (0, 3)


def test_ar_matches_generate():
    target = _attention_target()
    prompt = torch.tensor([[3, 14, 15, 9, 26, 5]])
    ref = target.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert ar_generate(target, prompt[0].tolist(), 20).tokens == ref[0, 6:].tolist()


def test_tree_is_top_n_prefixes():
    g = torch.Generator().manual_seed(0)
    depth, vocab = 3, 5
    logits = torch.randn(depth, vocab, generator=g) * 2
    lp = torch.log_softmax(logits, -1)
    prefixes = [p for d in range(1, depth + 1) for p in itertools.product(range(vocab), repeat=d)]
    score = {p: sum(lp[i, t].item() for i, t in enumerate(p)) for p in prefixes}
    ranked = sorted(prefixes, key=lambda p: -score[p])
    for budget in (1, 2, 5, 12, 40, len(prefixes)):
        tree = build_tree(logits, budget)
        got = [tree.prefix(i) for i in range(1, len(tree))]
        assert len(got) == budget
        assert set(got) == set(ranked[:budget])
        assert all(tree.parents[i] < i and tree.depths[i] == len(got[i - 1]) for i in range(1, len(tree)))


def test_one_node_per_depth_is_dflash():
    logits = torch.randn(BLOCK - 1, VOCAB, generator=torch.Generator().manual_seed(2))
    tree = build_tree(logits, BLOCK - 1, per_depth=1)
    chain = chain_tree(logits.argmax(-1).tolist())
    assert (tree.tokens, tree.parents, tree.depths) == (chain.tokens, chain.parents, chain.depths)


def test_ancestor_mask():
    tree = Tree([0, 1, 2, 3, 4], [-1, 0, 0, 1, 3], [0, 1, 1, 2, 3])
    m = ancestor_mask(tree)
    assert m[4].tolist() == [True, True, False, True, True]
    assert m[2].tolist() == [True, False, True, False, False]


def _rounds_ok(committed, n_new):
    assert sum(committed) == n_new - 1  # the prefill commits the first token
    assert all(1 <= c <= BLOCK for c in committed)


def test_oracle_gives_tau_b(case):
    _, target, prompt, tokens, hidden = case
    drafter = ScriptedDrafter(tokens, hidden, lambda p: True)
    committed = replay(drafter, tokens, hidden, len(prompt))
    _rounds_ok(committed, MAX_NEW)
    assert all(c == BLOCK for c in committed[:-1])
    gen, real = speculative_generate(target, drafter, prompt, MAX_NEW, TAPS)
    assert gen.tokens == tokens[len(prompt) :]
    assert real == committed


def test_always_wrong_gives_tau_1(case):
    _, target, prompt, tokens, hidden = case
    drafter = ScriptedDrafter(tokens, hidden, lambda p: False)
    committed = replay(drafter, tokens, hidden, len(prompt))
    assert committed == [1] * (MAX_NEW - 1)
    gen, real = speculative_generate(target, drafter, prompt, MAX_NEW, TAPS)
    assert gen.tokens == tokens[len(prompt) :]
    assert real == committed


def test_replay_equals_real_loop_dflash(case):
    kind, target, prompt, tokens, hidden = case
    drafter = ScriptedDrafter(tokens, hidden, _sometimes)
    committed = replay(drafter, tokens, hidden, len(prompt))
    _rounds_ok(committed, MAX_NEW)
    assert 1 < tau(committed) < BLOCK and min(committed) < BLOCK  # rejections happened (hybrid: restore path)
    gen, real = speculative_generate(target, drafter, prompt, MAX_NEW, TAPS, timing=True)
    assert gen.tokens == tokens[len(prompt) :], f"{kind}: speculative output differs from greedy decoding"
    assert real == committed
    assert gen.split["verify"] > 0 and gen.split["draft"] > 0
    if kind == "hybrid":
        assert gen.split["restore"] > 0


def test_ddtree_replay_and_real_loop(case):
    kind, target, prompt, tokens, hidden = case
    drafter = ScriptedDrafter(tokens, hidden, _sometimes)
    dflash = replay(drafter, tokens, hidden, len(prompt))
    tree = replay(drafter, tokens, hidden, len(prompt), budget=16)
    _rounds_ok(tree, MAX_NEW)
    assert tau(tree) > tau(dflash)
    assert replay(drafter, tokens, hidden, len(prompt), budget=BLOCK - 1, per_depth=1) == dflash
    if kind == "hybrid":
        with pytest.raises(NotImplementedError):
            speculative_generate(target, drafter, prompt, MAX_NEW, TAPS, budget=16)
        return
    gen, real = speculative_generate(target, drafter, prompt, MAX_NEW, TAPS, budget=16)
    assert gen.tokens == tokens[len(prompt) :]
    assert real == tree


def test_sampled_replay_is_match_based():
    target = _attention_target()
    prompt = [5, 6, 7, 8]
    gen = ar_generate(target, prompt, 24, temperature=1.0, generator=torch.Generator().manual_seed(3))
    tokens = prompt + gen.tokens
    hidden = replay_.target_hidden(target, tokens, TAPS)
    committed = replay(ScriptedDrafter(tokens, hidden, lambda p: True), tokens, hidden, len(prompt))
    assert all(c == BLOCK for c in committed[:-1]) and sum(committed) == 23


def test_summaries():
    assert tau([1, 3, 5]) == 3
    assert math.isnan(tau([]))
    assert acceptance_by_position([1, 3, 5], 5) == [2 / 3, 2 / 3, 1 / 3, 1 / 3]
    assert histogram([1, 3, 5, 5], 5) == [1, 0, 1, 0, 2]


def test_bench_records_and_report(case, tmp_path):
    import json

    from draftsmith.report import write_report

    kind, target, prompt, tokens, hidden = case
    drafter = ScriptedDrafter(tokens, hidden, _sometimes)
    bench = with_defaults(
        "bench", {"max_new_tokens": MAX_NEW, "ddtree_budgets": [4, 16], "methods": ["ar", "dflash", "ddtree"]}
    )
    records = bench_prompt(target, drafter, prompt, TAPS, bench)
    assert [(r["method"], r["budget"]) for r in records] == [
        ("ar", None),
        ("dflash", None),
        ("ddtree", 4),
        ("ddtree", 16),
    ]
    assert records[1]["lossless"] and records[1]["real_committed"] == records[1]["committed"]
    if kind == "hybrid":
        assert records[3]["seconds"] is None and "hybrid" in records[3]["note"]
    else:
        assert records[3]["lossless"]
    part = tmp_path / "0.jsonl"
    part.write_text("".join(json.dumps({"dataset": "d", "id": "0", **r}) + "\n" for r in records))
    df = write_report([str(part)], tmp_path / "out")
    assert df["method"].tolist() == ["ar", "dflash", "ddtree", "ddtree"]
    assert df["tau"].iloc[1] == pytest.approx(tau(records[1]["committed"]))
    assert df["speedup"].iloc[0] == pytest.approx(1.0)
    for name in ("summary.csv", "summary.md", "records.jsonl", "tau_by_method.png", "tau_vs_budget.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert (tmp_path / "out" / "position_acceptance.png").stat().st_size > 0


def test_real_block_drafter_is_lossless(case):
    """The project's BlockDrafter (random weights, target's embedding and head) inside the real loops."""
    from draftsmith.drafter.config import DrafterConfig
    from draftsmith.drafter.model import Drafter
    from draftsmith.speculative.proposers import BlockDrafter

    kind, target, prompt, tokens, hidden = case
    torch.manual_seed(0)
    cfg = DrafterConfig(
        hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
        vocab_size=VOCAB, target_layer_ids=TAPS, num_target_layers=4, mask_token_id=VOCAB - 1,
        block_size=BLOCK,
    )  # fmt: skip
    drafter = BlockDrafter(
        Drafter(cfg), target.get_input_embeddings().weight, target.get_output_embeddings().weight
    )
    for budget in (None,) if kind == "hybrid" else (None, 8):
        gen, committed = speculative_generate(target, drafter, prompt, MAX_NEW, TAPS, budget)
        assert gen.tokens == tokens[len(prompt) :]
        assert sum(committed) == MAX_NEW - 1


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gpt-oss"])
def test_real_loops_on_sliding_families(family):
    """Every layer sliding (Mistral), soft-capping (Gemma 2), sinks and experts (gpt-oss): DFlash and DDTree
    real loops stay lossless and commit what replay computes."""
    target = sliding_model(family, VOCAB, window=6)
    prompt = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    tokens = prompt + ar_generate(target, prompt, MAX_NEW).tokens
    hidden = replay_.target_hidden(target, tokens, [0, 1])
    drafter = ScriptedDrafter(tokens, hidden, _sometimes)
    for budget in (None, 16):
        committed = replay(drafter, tokens, hidden, len(prompt), budget=budget)
        gen, real = speculative_generate(target, drafter, prompt, MAX_NEW, [0, 1], budget=budget)
        assert gen.tokens == tokens[len(prompt) :] and real == committed
