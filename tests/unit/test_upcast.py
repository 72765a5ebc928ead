"""fp32 from bf16 weights a layer at a time (the bench's check on a card that cannot hold the target in fp32):
the same bits as the model cast whole, with no more than one layer in fp32 beside the embeddings and head."""

import torch

from draftsmith.speculative.replay import ar_generate
from draftsmith.target.layers import decoder_layers
from draftsmith.target.upcast import fp32_by_layer, fp32_tensor_bytes
from tests.conftest import tiny_model


def _pair(kind: str, **overrides):
    """A bf16 model and the same weights cast whole to fp32."""
    low = tiny_model(kind, vocab=96, layers=4, hidden=64, seed=3, **overrides).to(torch.bfloat16)
    whole = tiny_model(kind, vocab=96, layers=4, hidden=64, seed=3, **overrides).to(torch.bfloat16).float()
    return low, whole


def test_layer_by_layer_fp32_is_the_whole_cast_bit_for_bit():
    for kind, tied in (("hybrid", False), ("attention", False), ("attention", True)):
        low, whole = _pair(kind, tie_word_embeddings=tied)
        ids = torch.randint(0, 96, (2, 23), generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            expected = whole(input_ids=ids).logits
            with fp32_by_layer(low) as model:
                got = model(input_ids=ids).logits
            bf16 = low(input_ids=ids).logits
        assert got.dtype == torch.float32 and torch.equal(got, expected), kind
        assert not torch.equal(bf16.float(), expected), kind  # the check would notice bf16 arithmetic
        assert {p.dtype for p in low.parameters()} == {torch.bfloat16}, kind  # its weights given back


def test_greedy_decoding_with_a_cache_matches_the_whole_cast():
    low, whole = _pair("hybrid")
    prompt = [5, 17, 42, 8, 9]
    with torch.inference_mode():
        expected = ar_generate(whole, prompt, 12, stop_ids=[])
        with fp32_by_layer(low) as model:
            got = ar_generate(model, prompt, 12, stop_ids=[])
    assert got.tokens == expected.tokens and len(got.tokens) == 12


def test_one_layer_at_a_time_in_fp32():
    low, _ = _pair("hybrid")
    layers = decoder_layers(low)
    one_layer = max(sum(p.numel() * 4 for p in layer.parameters()) for layer in layers)
    whole = sum(p.numel() * 4 for p in low.parameters())
    seen = []
    for layer in layers:
        layer.register_forward_hook(lambda *_: seen.append(fp32_tensor_bytes(low)))
    with torch.inference_mode(), fp32_by_layer(low) as model:
        resting = fp32_tensor_bytes(model)
        model(input_ids=torch.tensor([[1, 2, 3]]))
    assert len(seen) == len(layers)
    assert max(seen) <= resting + one_layer < whole
    assert fp32_tensor_bytes(low) == 0
