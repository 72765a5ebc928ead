"""DFlash above temperature 0, as z-lab's reference runs it: drafts sampled from the drafter are kept by
rejection sampling, so the committed tokens are distributed as the target's own samples, whatever the
drafter."""

import pytest
import torch
from conftest import tiny_model

from draftsmith.config import with_defaults
from draftsmith.drafter.config import drafter_config
from draftsmith.drafter.model import Drafter
from draftsmith.speculative.bench import NODE_SAMPLES, REJECTION, bench_prompt
from draftsmith.speculative.loop import rejection_walk, speculative_generate
from draftsmith.speculative.proposers import BlockDrafter
from draftsmith.speculative.replay import tau

V = 4
VOCAB, TAPS = 96, [0, 2]


@pytest.fixture(scope="module", params=["attention", "hybrid"])
def tiny_target(request):
    """A tiny target of each layer family, a random drafter on its embedding and head, a prompt."""
    target = tiny_model(request.param, VOCAB, layers=4, max_position_embeddings=256, initializer_range=0.2)
    torch.manual_seed(0)
    cfg = drafter_config(
        {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "intermediate_size": 128, "vocab_size": VOCAB},
        TAPS, num_layers=1, num_target_layers=4, mask_token_id=VOCAB - 1, block_size=5,
    )  # fmt: skip
    embed, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    return target, BlockDrafter(Drafter(cfg), embed, head), [5, 6, 7, 8, 9]


def test_rejection_walk_commits_the_targets_distribution():
    """Two draft positions against a target whose second distribution depends on the first token: the
    committed pair (first two tokens, from drafts or bonus) is distributed as P(x1) P(x2 | x1)."""
    g = torch.Generator().manual_seed(0)
    p1 = torch.tensor([0.5, 0.3, 0.15, 0.05])
    p2 = torch.softmax(torch.randn(V, V, generator=g) * 2, dim=-1)  # P(x2 | x1) per row
    p3 = torch.full((V,), 1 / V)
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])  # a poor drafter, far from p
    counts = torch.zeros(V, V)
    trials = 20000
    for _ in range(trials):
        d = [int(torch.multinomial(q[0], 1, generator=g)), int(torch.multinomial(q[1], 1, generator=g))]
        p = torch.stack([p1, p2[d[0]], p3])  # the target after [anchor], [anchor, d1], [anchor, d1, d2]
        path, bonus = rejection_walk(d, p, q, generator=g)
        new = [d[i - 1] for i in path[1:]] + [bonus]
        if len(new) < 2:  # rejected at the first position: the second token comes from the next round
            new.append(int(torch.multinomial(p2[new[0]], 1, generator=g)))
        counts[new[0], new[1]] += 1
    want = p1[:, None] * p2
    assert (counts / trials - want).abs().sum() / 2 < 0.02  # total variation, ~0.01 expected from noise


def test_sampled_loop_runs_and_is_seeded(tiny_target):
    target, drafter, prompt = tiny_target
    a, ca = speculative_generate(target, drafter, prompt, 12, TAPS, temperature=1.0,
                                 generator=torch.Generator().manual_seed(5))  # fmt: skip
    b, cb = speculative_generate(target, drafter, prompt, 12, TAPS, temperature=1.0,
                                 generator=torch.Generator().manual_seed(5))  # fmt: skip
    assert a.tokens == b.tokens and ca == cb and len(a.tokens) == 12 == sum(ca) + 1


def test_sampled_ddtree_walks_one_target_sample_per_node(tiny_target):
    """DDTree's reference at temperature > 0: the tree as at 0, then the target samples at every node."""
    target, drafter, prompt = tiny_target
    if any(t == "linear_attention" for t in target.config.layer_types):
        return  # hybrid targets verify no trees (the bench replays them)
    runs = [
        speculative_generate(
            target, drafter, prompt, 12, TAPS, 8, temperature=1.0, generator=torch.Generator().manual_seed(s)
        )  # fmt: skip
        for s in (1, 1, 2)
    ]
    assert runs[0][0].tokens == runs[1][0].tokens and len(runs[0][0].tokens) == 12 == sum(runs[0][1]) + 1
    assert runs[0][0].tokens != runs[2][0].tokens  # the seed matters: it is sampling


def test_bench_labels_how_tau_was_measured(tiny_target):
    target, drafter, prompt = tiny_target
    bench = with_defaults("bench", {"max_new_tokens": 10, "ddtree_budgets": [4], "temperature": 1.0})
    records = {r["method"]: r for r in bench_prompt(target, drafter, prompt, TAPS, bench)}
    assert records["dflash"]["acceptance"] == REJECTION and records["dflash"]["seconds"] is not None
    assert records["dflash"]["tau"] == tau(records["dflash"]["committed"])
    hybrid = records["ddtree"]["hybrid"]  # a recurrence cannot verify a tree: replay, as DDTree's own rule
    assert records["ddtree"]["acceptance"] == ("one sampled continuation" if hybrid else NODE_SAMPLES)
    assert (records["ddtree"]["seconds"] is None) == hybrid
    greedy = {
        r["method"]: r for r in bench_prompt(target, drafter, prompt, TAPS, {**bench, "temperature": 0})
    }
    assert greedy["dflash"]["acceptance"] == "exact replay" and greedy["dflash"]["exact"]
