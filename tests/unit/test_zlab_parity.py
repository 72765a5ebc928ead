"""Served as trained: a drafter exported by draftsmith, loaded by z-lab's own class (PyPI `dflash` 0.1.0, the
reference the serving engines follow), takes every weight and gives the same block logits as draftsmith's
inference forward (BlockDrafter) and its training forward (Drafter with the training masks), in fp32."""

import pytest
import torch
from dflash import DFlashDraftModel

from draftsmith.drafter.config import FULL, SLIDING, drafter_config
from draftsmith.drafter.model import BlockLayout, Drafter, build_masks
from draftsmith.drafter.zlab import save_zlab
from draftsmith.perf.zlab_parity import TOLERANCE, zlab_block_logits
from draftsmith.speculative.proposers import BlockDrafter

V, H, TAPS, CTX = 96, 64, [0, 2, 3], 13  # a context longer than the window, so the window matters
SHAPE = {"hidden_size": H, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
CASES = {
    "full": {"layer_types": [FULL, FULL], "window": None, "block": 8},
    "sliding_and_full": {"layer_types": [SLIDING, SLIDING, FULL], "window": 6, "block": 8},
    "block_4": {"layer_types": [SLIDING, FULL], "window": 5, "block": 4},
}


def _drafter(case: dict) -> Drafter:
    cfg = drafter_config(
        {**SHAPE, "intermediate_size": 128, "vocab_size": V, "rope_theta": 10000.0},
        TAPS,
        num_layers=len(case["layer_types"]),
        num_target_layers=6,
        mask_token_id=V - 1,
        block_size=case["block"],
        layer_types=case["layer_types"],
        sliding_window=case["window"],
    )
    torch.manual_seed(0)
    model = Drafter(cfg).float()
    with torch.no_grad():  # norms away from 1 and larger weights, so that every parameter shows in the logits
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(params=sorted(CASES))
def pair(request, tmp_path):
    case = CASES[request.param]
    model = _drafter(case)
    save_zlab(model, tmp_path / "drafter", torch.float32)
    ref, info = DFlashDraftModel.from_pretrained(
        tmp_path / "drafter", output_loading_info=True, dtype=torch.float32
    )
    return model, ref.eval(), info


def _inputs(model: Drafter):
    g = torch.Generator().manual_seed(1)
    ctx = torch.randn(CTX, len(TAPS) * H, generator=g)
    embed, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g) / H**0.5
    block = torch.tensor([7] + [model.cfg.mask_token_id] * (model.cfg.block_size - 1))
    return ctx, embed, head, block


def test_zlab_class_loads_every_weight(pair):
    model, ref, info = pair
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    theirs = {k: v for k, v in ref.state_dict().items() if "rotary" not in k}
    assert set(theirs) == set(model.state_dict())
    assert all(torch.equal(theirs[k], v) for k, v in model.state_dict().items())
    assert ref.block_size == model.cfg.block_size and ref.mask_token_id == model.cfg.mask_token_id
    assert list(ref.target_layer_ids) == TAPS


def test_inference_forward_equals_zlab(pair):
    model, ref, _ = pair
    ctx, embed, head, block = _inputs(model)
    ours = BlockDrafter(model, embed, head)
    ours.extend(ctx)
    got = ours.propose(int(block[0]))
    want = zlab_block_logits(ref, ctx, block, embed=embed, head=head)
    assert (got - want).abs().max().item() <= TOLERANCE


def test_training_forward_equals_zlab(pair):
    """The loss is computed on what training sees: its masks must give z-lab's attention too."""
    model, ref, _ = pair
    ctx, embed, head, block = _inputs(model)
    B = model.cfg.block_size
    layout = BlockLayout(
        ctx_doc=torch.zeros(CTX, dtype=torch.long),
        ctx_pos=torch.arange(CTX),
        block_doc=torch.zeros(1, dtype=torch.long),
        anchor=torch.tensor([CTX]),
        block_size=B,
    )
    with torch.no_grad():
        hidden = model(
            ctx, layout.ctx_pos, embed[block], CTX + torch.arange(B), build_masks(layout, model.cfg, False)
        )
    got = hidden[1:] @ head.T
    want = zlab_block_logits(ref, ctx, block, embed=embed, head=head)
    assert (got - want).abs().max().item() <= TOLERANCE
