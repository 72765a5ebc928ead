"""The drafter: masks as the paper describes, training forward == inference forward, export round-trip."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from draftsmith.config import with_defaults
from draftsmith.dataset.shards import Sample
from draftsmith.drafter.batches import make_batch
from draftsmith.drafter.config import FULL, SLIDING, DrafterConfig, config_from_target, resolve_mask_token_id
from draftsmith.drafter.loss import block_loss, position_weights
from draftsmith.drafter.model import (
    BlockLayout,
    Drafter,
    build_masks,
    dense_mask,
    mask_mod_for,
    tile_block_mask,
)
from draftsmith.drafter.zlab import load_drafter, save_zlab
from draftsmith.speculative.proposers import BlockDrafter, load_block_drafter
from draftsmith.target.files import load_target_head

H, V = 32, 96


def tiny_cfg(**kw) -> DrafterConfig:
    base = dict(
        hidden_size=H,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=64,
        vocab_size=V,
        target_layer_ids=[0, 2],
        num_target_layers=4,
        mask_token_id=V - 1,
        block_size=4,
    )
    base.update(kw)
    return DrafterConfig(**base)


def brute_force_mask(doc, pos, block_doc, anchor, B, window):
    """Straight from the paper: block n's query k sees context j of its sequence iff pos_j < anchor_n (and, on
    a sliding layer, anchor_n + k - pos_j < window), and every token of its own block (on a sliding layer only
    k2 <= k within the window, as z-lab's reference runs sliding layers); nothing else."""
    T, N = len(doc), len(anchor)
    m = torch.zeros(N * B, T + N * B, dtype=torch.bool)
    for n in range(N):
        for k in range(B):
            q = n * B + k
            for j in range(T):
                if doc[j] == block_doc[n] and pos[j] < anchor[n]:
                    if window is None or anchor[n] + k - pos[j] < window:
                        m[q, j] = True
            for k2 in range(B):
                if window is None or 0 <= k - k2 < window:
                    m[q, T + n * B + k2] = True
    return m


@pytest.mark.parametrize("window", [None, 3])
def test_block_mask_matches_brute_force(window):
    lens, anchors = [7, 5], [[1, 3, 5], [2, 4]]
    doc = [s for s, t in enumerate(lens) for _ in range(t)]
    pos = [p for t in lens for p in range(t)]
    block_doc = [s for s, a in enumerate(anchors) for _ in a]
    anchor = [x for a in anchors for x in a]
    B = 4
    lay = BlockLayout(torch.tensor(doc), torch.tensor(pos), torch.tensor(block_doc), torch.tensor(anchor), B)
    got = dense_mask(lay, window)
    want = brute_force_mask(doc, pos, block_doc, anchor, B, window)
    assert torch.equal(got, want)
    # the anchor itself is never in its own block's context (the target has not seen it yet)
    assert not got[0, anchor[0]] and got[0, anchor[0] - 1]


def _toy_samples(n_seq: int, t: int, width: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_seq):
        ids = torch.randint(0, V - 1, (t,), generator=g)
        mask = torch.ones(t, dtype=torch.bool)
        mask[:2] = False
        out.append(Sample(torch.randn(t, width, generator=g), ids, mask))
    return out


@pytest.mark.parametrize("layer_types,window", [(None, None), ([SLIDING, FULL], 4)])
def test_training_forward_equals_inference_forward(layer_types, window):
    torch.manual_seed(0)
    cfg = tiny_cfg(layer_types=layer_types or [], sliding_window=window)
    model = Drafter(cfg).double()
    embed, head = torch.randn(V, H, dtype=torch.float64), torch.randn(V, H, dtype=torch.float64)
    samples = [Sample(s.hidden.double(), s.input_ids, s.loss_mask) for s in _toy_samples(2, 11, 2 * H, 1)]
    anchors = [torch.tensor([1, 4, 8]), torch.tensor([3, 6])]
    batch = make_batch(samples, anchors, cfg.block_size, cfg.mask_token_id)
    x = torch.nn.functional.embedding(batch.block_tokens, embed)
    masks = build_masks(batch.layout, cfg, use_flex=False)
    h = model(batch.taps, batch.layout.ctx_pos, x, batch.query_positions(), masks)
    train_logits = (h @ head.T).view(-1, cfg.block_size, V)[:, 1:]

    drafter = BlockDrafter(model, embed, head)
    n = 0
    for smp, anc in zip(samples, anchors):
        drafter.reset()
        drafter.extend(smp.hidden[:2])  # extend in pieces, then crop back: the cache must not care
        drafter.extend(smp.hidden[2:])
        for a in anc.tolist():
            drafter.crop(a)
            assert drafter.context_length == a
            got = drafter.propose(int(smp.input_ids[a]))
            assert got.shape == (cfg.block_size - 1, V) and got.dtype == torch.float32
            torch.testing.assert_close(got, train_logits[n].float(), rtol=1e-5, atol=1e-5)
            drafter.extend(smp.hidden[a:])  # rejected drafts: crop, then the target's new states come back
            n += 1
    assert n == len(train_logits)


def test_blocks_do_not_see_each_other():
    """Changing one block's anchor token changes that block's logits only."""
    torch.manual_seed(0)
    cfg = tiny_cfg()
    model = Drafter(cfg)
    embed = torch.randn(V, H)
    samples = _toy_samples(1, 12, 2 * H, 2)
    batch = make_batch(samples, [torch.tensor([2, 5, 9])], cfg.block_size, cfg.mask_token_id)
    masks = build_masks(batch.layout, cfg, use_flex=False)

    def run(tokens):
        x = torch.nn.functional.embedding(tokens, embed)
        return model(batch.taps, batch.layout.ctx_pos, x, batch.query_positions(), masks).view(
            3, cfg.block_size, H
        )

    a = run(batch.block_tokens)
    t2 = batch.block_tokens.clone()
    t2[cfg.block_size] = (t2[cfg.block_size] + 1) % (V - 1)
    b = run(t2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    assert not torch.allclose(a[1], b[1])


def test_chunked_loss_matches_plain_cross_entropy():
    torch.manual_seed(0)
    cfg = tiny_cfg()
    model = Drafter(cfg)
    embed, head = torch.randn(V, H), torch.randn(V, H)
    samples = _toy_samples(2, 10, 2 * H, 3)
    batch = make_batch(
        samples, [torch.tensor([1, 5]), torch.tensor([2, 7])], cfg.block_size, cfg.mask_token_id
    )
    masks = build_masks(batch.layout, cfg, use_flex=False)
    w = position_weights(cfg.block_size, 7.0)
    loss, correct, count = block_loss(model, embed, head, batch, masks, w)
    loss.backward()
    g1 = model.fc.weight.grad.clone()
    model.zero_grad()

    x = torch.nn.functional.embedding(batch.block_tokens, embed)
    h = model(batch.taps, batch.layout.ctx_pos, x, batch.query_positions(), masks)
    logits = h @ head.T
    keep = batch.labels >= 0
    rw = w[torch.arange(len(keep)) % cfg.block_size][keep]
    ce = torch.nn.functional.cross_entropy(logits[keep], batch.labels[keep], reduction="none")
    ref = (ce * rw).sum() / rw.sum()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(model.fc.weight.grad, g1)
    assert count[0] == 0 and count[1] == 4  # the anchor is never a label; every block has a position-1 label
    pred = logits.argmax(-1)[keep]
    assert correct.sum() == (pred == batch.labels[keep]).sum()


def test_block_runs_count_the_correct_predictions_from_position_one():
    """The held-out acceptance length: a block whose first k labels are what the drafter predicts and whose
    next one is not scores a run of k, whatever follows."""
    torch.manual_seed(0)
    cfg = tiny_cfg(block_size=5)
    model, embed, head = Drafter(cfg), torch.randn(V, H), torch.randn(V, H)
    samples = _toy_samples(2, 16, 2 * H, 3)
    batch = make_batch(
        samples, [torch.tensor([1, 6, 9]), torch.tensor([2, 8])], cfg.block_size, cfg.mask_token_id
    )
    masks = build_masks(batch.layout, cfg, use_flex=False)
    x = torch.nn.functional.embedding(batch.block_tokens, embed)
    pred = (model(batch.taps, batch.layout.ctx_pos, x, batch.query_positions(), masks) @ head.T).argmax(-1)
    B, want = cfg.block_size, [0, 1, 4, 2, 3]  # per block: how many leading labels to make right
    labels = batch.labels.view(-1, B)
    assert (labels[:, 1:] >= 0).all()  # every block lies inside its sequence
    for b, k in enumerate(want):
        row = pred.view(-1, B)[b]
        labels[b, 1 : 1 + k] = row[1 : 1 + k]
        if 1 + k < B:
            labels[b, 1 + k] = (row[1 + k] + 1) % V  # the first miss
            labels[b, 2 + k :] = row[2 + k :]  # right again after it: still not accepted
    runs: list[torch.Tensor] = []
    block_loss(model, embed, head, batch, masks, position_weights(B, 1.0), runs=runs)
    assert torch.cat(runs).tolist() == want


def test_mask_token_resolution(tmp_path):
    assert resolve_mask_token_id(5, 7, 10) == 5
    assert resolve_mask_token_id("auto", 7, 10) == 7
    with pytest.raises(ValueError, match="no free id"):
        resolve_mask_token_id("auto", None, 10, tmp_path)
    with pytest.raises(ValueError, match="outside"):
        resolve_mask_token_id(12, None, 10)


def _tiny_target(path, tie: bool):
    cfg = Qwen3Config(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=tie,
        rope_theta=5e5,
    )
    torch.manual_seed(1)
    model = Qwen3ForCausalLM(cfg)
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("tie", [True, False])
def test_target_head_and_shapes_follow_target(tmp_path, tie):
    target = _tiny_target(tmp_path / "t", tie)
    embed, head = load_target_head(tmp_path / "t")
    assert torch.equal(embed, target.model.embed_tokens.weight.detach())
    assert torch.equal(head, target.lm_head.weight.detach())
    tc = json.loads((tmp_path / "t" / "config.json").read_text())
    cfg = config_from_target(tc, [0, 2], with_defaults("drafter", {"num_layers": 2, "mask_token_id": 3}))
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (H, 4, 2, 8)
    assert cfg.intermediate_size == 48 and cfg.rope_theta == 5e5 and cfg.num_target_layers == 4


def test_export_round_trip_and_config(tmp_path):
    _tiny_target(tmp_path / "t", tie=False)
    cfg = tiny_cfg(num_layers=3, layer_types=[SLIDING, SLIDING, FULL], sliding_window=16)
    torch.manual_seed(0)
    model = Drafter(cfg)
    out = save_zlab(model, tmp_path / "d", torch.bfloat16)
    c = json.loads((out / "config.json").read_text())
    assert c["architectures"] == ["DFlashDraftModel"] and c["model_type"] == "qwen3"
    # block_size also under dflash_config: SGLang reads it there (docs/serving.md)
    assert c["dflash_config"] == {"mask_token_id": V - 1, "target_layer_ids": [0, 2], "block_size": 4}
    assert c["block_size"] == 4 and c["num_target_layers"] == 4 and c["num_hidden_layers"] == 3
    assert c["layer_types"] == [SLIDING, SLIDING, FULL] and c["sliding_window"] == 16
    for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"):
        assert k in c
    saved = load_file(str(out / "model.safetensors"))
    assert "fc.weight" in saved and "hidden_norm.weight" in saved and "norm.weight" in saved
    assert "layers.2.self_attn.q_norm.weight" in saved and "layers.0.mlp.down_proj.weight" in saved
    assert not any("embed" in k or "lm_head" in k for k in saved)

    back = load_drafter(out)
    assert back.cfg == cfg
    for k, v in back.state_dict().items():
        assert v.dtype == torch.bfloat16
        assert torch.equal(v.view(torch.int16), saved[k].view(torch.int16)), k  # bit-exact
        assert torch.equal(v, model.state_dict()[k].to(torch.bfloat16)), k
    again = save_zlab(back, tmp_path / "d2", torch.bfloat16)
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()

    bd = load_block_drafter(str(out), str(tmp_path / "t"), "cpu", torch.float32)
    bd.extend(torch.randn(5, 2 * H))
    logits = bd.propose(7)
    assert logits.shape == (3, V) and torch.isfinite(logits).all()
    assert bd.block_size == 4 and bd.mask_token_id == V - 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's block masks are the GPU path")
@pytest.mark.parametrize("layer_types,window", [(None, None), ([SLIDING, FULL], 3)])
def test_flex_masks_equal_the_dense_ones_on_the_gpu(layer_types, window):
    """Training on a GPU attends through FlexAttention block masks built from the same mask_mod: the same mask
    element for element, and the same training forward as the dense masks of the CPU path."""
    from torch.nn.attention.flex_attention import create_mask

    torch.manual_seed(0)
    cfg = tiny_cfg(layer_types=layer_types or [], sliding_window=window, head_dim=16)  # flex needs d >= 16
    dev = torch.device("cuda")
    model = Drafter(cfg).to(dev)
    samples = _toy_samples(3, 37, 2 * H, 2)
    anchors = [torch.tensor([1, 9, 20]), torch.tensor([4, 30]), torch.tensor([2, 17, 33])]
    batch = make_batch(samples, anchors, cfg.block_size, cfg.mask_token_id).to(dev, torch.float32)
    lay = batch.layout
    q, kv = lay.num_queries, lay.num_ctx + lay.num_queries
    for kind_window in {window, None}:
        flex = create_mask(mask_mod_for(lay, kind_window), None, None, q, kv, device=dev)[0, 0]
        assert torch.equal(flex, dense_mask(lay, kind_window))
    x = torch.randn(q, H, device=dev)
    outs = [
        model(batch.taps, lay.ctx_pos, x, batch.query_positions(), build_masks(lay, cfg, use_flex))
        for use_flex in (False, True)
    ]
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-3, atol=2e-3)


def _packed_layout(lengths: list[int], block_size: int, seed: int) -> BlockLayout:
    """A layout as make_batch packs one: sequences in order, a block every ~20 positions at random anchors."""
    g = torch.Generator().manual_seed(seed)
    ctx_doc, ctx_pos, block_doc, anchor = [], [], [], []
    for s, t in enumerate(lengths):
        ctx_doc.append(torch.full((t,), s))
        ctx_pos.append(torch.arange(t))
        a = torch.sort(torch.randint(0, t, (max(1, t // 20),), generator=g)).values
        block_doc.append(torch.full((a.shape[0],), s))
        anchor.append(a)
    cat = torch.cat
    return BlockLayout(cat(ctx_doc), cat(ctx_pos), cat(block_doc), cat(anchor), block_size)


@pytest.mark.parametrize(
    "block_size,window,lengths",
    [(16, None, [300, 57, 1000, 129]), (16, 100, [300, 57, 1000, 129]), (16, 400, [1500, 700]),
     (16, 600, [3000]), (8, 37, [500, 9, 260]), (8, 300, [4000]), (32, None, [2000])],
)  # fmt: skip
def test_tile_block_mask_equals_the_mask_evaluated_everywhere(block_size, window, lengths):
    """The BlockMask built from intervals against create_block_mask's evaluation of every (query, key) pair:
    the same tiles computed, the same tiles computed without the mask_mod, and FlexAttention through it
    gives SDPA's output with the dense mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    lay = _packed_layout(lengths, block_size, seed=len(lengths) + block_size)
    Q, KV = lay.num_queries, lay.num_ctx + lay.num_queries
    mine = tile_block_mask(lay, window)
    ref = create_block_mask(mask_mod_for(lay, window), None, None, Q, KV, device="cpu", _compile=False)
    assert torch.equal(mine.to_dense(), ref.to_dense())

    def full_tiles(m) -> set[tuple[int, int]]:
        counts, idx = m.full_kv_num_blocks[0, 0], m.full_kv_indices[0, 0]
        return {(i, int(j)) for i in range(counts.shape[0]) for j in idx[i, : counts[i]]}

    assert full_tiles(mine) == full_tiles(ref)
    # the transposed lists the backward pass reads (FlexAttention has no backward on the CPU to run)
    assert torch.equal(mine.q_num_blocks, ref.q_num_blocks)
    assert torch.equal(mine.full_q_num_blocks, ref.full_q_num_blocks)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g) for n in (Q, KV, KV))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(lay, window))
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=mine), want, rtol=1e-5, atol=1e-5)


def test_tile_block_mask_leaves_what_it_cannot_read_to_create_block_mask():
    assert tile_block_mask(_packed_layout([300], 12, seed=0), None) is None  # 12 does not divide a tile
    lay = _packed_layout([300, 200], 16, seed=0)
    shuffled = BlockLayout(lay.ctx_doc.flip(0), lay.ctx_pos, lay.block_doc, lay.anchor, 16)
    assert tile_block_mask(shuffled, None) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the loss's terms compile for a GPU")
def test_the_compiled_loss_terms_equal_the_eager_ones(monkeypatch):
    """The GPU's fused loss (Inductor's kernels) against the same function run eagerly, at a chunk size and a
    smaller last chunk (dynamic rows): the same loss, gradient and argmax up to bf16's rounding."""
    from draftsmith.drafter.loss import FUSED_LOSS_ENV, ChunkedCrossEntropy

    torch.manual_seed(0)
    dev, rows, hidden, vocab = torch.device("cuda"), 1000, 64, 5003
    h = torch.randn(rows, hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)
    head = torch.randn(vocab, hidden, device=dev, dtype=torch.bfloat16) / hidden**0.5
    labels = torch.randint(0, vocab, (rows,), device=dev)
    w = torch.rand(rows, device=dev)
    out = {}
    for fused in ("0", "1"):
        monkeypatch.setenv(FUSED_LOSS_ENV, fused)
        h.grad = None
        loss, pred = ChunkedCrossEntropy.apply(h, head, labels, w, 384)  # chunks of 384, 384 and 232 rows
        loss.backward()
        out[fused] = loss.detach(), pred, h.grad.clone()
    torch.testing.assert_close(out["1"][0], out["0"][0], rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(out["1"][2], out["0"][2], rtol=2e-2, atol=1e-3)
    logits = (h.detach() @ head.T).float()
    for fused in ("0", "1"):  # bf16 logits tie: any maximal index is an argmax
        assert torch.equal(logits.gather(1, out[fused][1][:, None]).squeeze(1), logits.max(-1).values)
