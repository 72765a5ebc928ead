"""The Triton decode kernels: how they are swapped into a model (everywhere) and what they compute (on a GPU).

The kernels themselves only run on CUDA; on a GPU machine the last test compares them with the functions they
replace. The GPU figures in docs/measurements.md come from `python -m draftsmith.perf.bench_regenerate`, which
runs the same check first.
"""

import pytest
import torch
from conftest import tiny_model

from draftsmith.engine.engine import Engine
from draftsmith.engine.kernels import available, fused_decode, self_check
from draftsmith.target.layers import mixer_module

VOCAB = 448


def test_fused_decode_swaps_and_restores_the_mixer_functions():
    model = tiny_model("hybrid", VOCAB, layers=4)
    module = mixer_module(model)
    before = {n: getattr(module, n) for n in ("torch_recurrent_gated_delta_rule", "causal_conv1d_update")}
    with fused_decode(module) as swapped:
        assert swapped
        assert all(getattr(module, n) is not f for n, f in before.items())
    assert all(getattr(module, n) is f for n, f in before.items())
    with pytest.raises(RuntimeError), fused_decode(module):
        raise RuntimeError("a failing step")
    assert all(getattr(module, n) is f for n, f in before.items())  # restored on errors too
    attention_only = mixer_module(tiny_model("attention", VOCAB, layers=2))
    with fused_decode(attention_only) as swapped:
        assert not swapped  # nothing to swap in an attention-only model


def test_wrappers_hand_cpu_calls_to_the_originals():
    """Off the GPU the wrappers must be transparent: the same answers with and without them."""
    model = tiny_model("hybrid", VOCAB, layers=4)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (5, 12, 9)]
    plain, _ = Engine(model, slots=2, max_len=40, eos_ids=[]).run(prompts, 10, progress=False)
    engine = Engine(model, slots=2, max_len=40, eos_ids=[])
    engine.fused = True  # as on a GPU: the step runs inside fused_decode (and the kernels see CPU tensors)
    engine._mixer = mixer_module(model)
    wrapped, _ = engine.run(prompts, 10, progress=False)
    assert wrapped == plain


@pytest.mark.skipif(not available(torch.device("cuda")), reason="the Triton kernels need a GPU")
def test_kernels_match_what_they_replace():
    err = self_check(torch.device("cuda"))
    assert err["recurrent_state"] < 1e-4 and err["recurrent_out"] < 2e-2 and err["conv_state"] == 0
    assert err["conv_out"] < 0.1 and err["attention"] < 2e-2 and err["attention_window"] < 2e-2


@pytest.mark.skipif(not available(torch.device("cuda")), reason="the Triton kernels need a GPU")
@pytest.mark.parametrize("kind", ["sliding", "hybrid"])
def test_engine_on_the_gpu_equals_generate(kind):
    """The GPU path end to end (Triton attention, windowed on sliding layers, Gated DeltaNet kernels, CUDA
    graph) against `generate` in fp32, where no tf32 rounding is allowed to tell them apart."""
    if kind == "sliding":
        model = tiny_model(
            "attention",
            VOCAB,
            layers=3,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        )
    else:
        model = tiny_model("hybrid", VOCAB, layers=4)
    model = model.cuda()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (3, 17, 40, 8, 25, 1, 33)]
    refs = [
        model.generate(
            torch.tensor([p], device="cuda"),
            max_new_tokens=20,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(p) :].tolist()
        for p in prompts
    ]
    engine = Engine(model, slots=3, max_len=80, eos_ids=[], sync_every=4, cuda_graph=True)
    assert engine.fused and engine.cuda_graph
    got, _ = engine.run(prompts, 20, progress=False)
    assert got == refs
