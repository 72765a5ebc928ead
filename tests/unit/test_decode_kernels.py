"""The Triton decode kernels: how they are swapped into a model (everywhere) and what they compute (on a GPU).

The kernels themselves only run on CUDA; on a GPU machine the last test compares them with the functions they
replace. The GPU figures in docs/measurements.md come from `python -m draftsmith.perf.bench_regenerate`, which
runs the same check first.
"""

import importlib.util

import pytest
import torch
from conftest import compile_for_h200, tiny_model

from draftsmith.engine.engine import Engine
from draftsmith.engine.kernel_checks import self_check
from draftsmith.engine.kernels import as_segments, available, fused_decode, packed_prefill
from draftsmith.target.layers import mixer_module

# packed prefill needs fla's varlen kernels: without fla nothing packs
FLA = importlib.util.find_spec("fla") is not None

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


def _gdn_inputs(b: int, t: int, *, heads: int = 2, dim: int = 16, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(7)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    q, k, v = rnd(b, t, heads, dim), rnd(b, t, heads, dim), rnd(b, t, heads, dim)
    gate = -torch.rand(b, t, heads, generator=g).to(device)  # log decays, as the mixer computes them (fp32)
    beta = torch.rand(b, t, heads, generator=g).to(device=device, dtype=dtype)
    state = torch.randn(b, heads, dim, dim, generator=g).to(device)
    return q, k, v, gate, beta, state


def _segment_by_segment(chunk):
    """What fla documents for a packed row (`cu_seqlens`): each segment its own sequence with its own initial
    and final state. Built from `chunk`'s batch calls, to check the packing around it on the CPU."""

    def call(q, k, v, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None, **kw):
        assert q.shape[0] == 1 and cu_seqlens is not None
        outs, states = [], []
        for i, (a, b) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):
            o, st = chunk(
                q[:, a:b], k[:, a:b], v[:, a:b], g=g[:, a:b], beta=beta[:, a:b],
                initial_state=None if initial_state is None else initial_state[i : i + 1],
                output_final_state=output_final_state, **kw,
            )  # fmt: skip
            outs.append(o)
            states.append(st)
        return torch.cat(outs, 1), torch.cat(states) if output_final_state else None

    return call


def test_a_batch_packed_as_segments_gives_the_batch_call():
    """as_segments' reshapes and boundaries: rows of 70 positions (a chunk of 64 and a part), initial states
    per row; the output and the final states come back in the batch's shape and order."""
    chunk = mixer_module(tiny_model("hybrid", VOCAB, layers=2)).torch_chunk_gated_delta_rule
    q, k, v, gate, beta, state = _gdn_inputs(3, 70)
    kw = {"use_qk_l2norm_in_kernel": True}
    want, want_state = chunk(q, k, v, g=gate, beta=beta, initial_state=state, output_final_state=True, **kw)
    got, got_state = as_segments(_segment_by_segment(chunk), q, k, v, gate, beta, state, True, **kw)
    assert got.shape == want.shape and got_state.shape == want_state.shape == state.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state, want_state, rtol=1e-5, atol=1e-5)
    rows_swapped, _ = as_segments(_segment_by_segment(chunk), q.flip(0), k.flip(0), v.flip(0), gate.flip(0),
                                  beta.flip(0), state.flip(0), True, **kw)  # fmt: skip
    torch.testing.assert_close(rows_swapped.flip(0), want, rtol=1e-5, atol=1e-5)  # each row its own sequence


def test_a_chunk_function_that_ignores_the_segments_is_refused():
    """Transformers' torch reference drops `cu_seqlens` (its hub wrapper keeps only the arguments it knows):
    packed through it, a batch would run as one long sequence. as_segments must fail, not return that."""
    chunk = mixer_module(tiny_model("hybrid", VOCAB, layers=2)).torch_chunk_gated_delta_rule
    q, k, v, gate, beta, state = _gdn_inputs(3, 70)
    refused = "ignored cu_seqlens|can't keep packed sequences apart"  # the latter: Transformers 5.25's own
    with pytest.raises((RuntimeError, ValueError), match=refused):
        as_segments(chunk, q, k, v, gate, beta, state[:1], True, use_qk_l2norm_in_kernel=True)


def test_packed_prefill_swaps_and_restores_and_is_transparent_on_the_cpu():
    model = tiny_model("hybrid", VOCAB, layers=4)
    module = mixer_module(model)
    before = module.torch_chunk_gated_delta_rule
    with packed_prefill(module) as swapped:
        assert swapped and module.torch_chunk_gated_delta_rule is not before
    assert module.torch_chunk_gated_delta_rule is before
    with packed_prefill(mixer_module(tiny_model("attention", VOCAB, layers=2))) as swapped:
        assert swapped is None
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (5, 70, 9, 33)]
    plain, _ = Engine(model, slots=4, max_len=90, eos_ids=[]).run(prompts, 8, progress=False)
    engine = Engine(model, slots=4, max_len=90, eos_ids=[], packed=True)
    packed, _ = engine.run(prompts, 8, progress=False)
    assert packed == plain and engine.packed_calls == 0  # the CPU keeps the batch call
    assert module.torch_chunk_gated_delta_rule is before


@pytest.mark.skipif(not (FLA and available(torch.device("cuda"))), reason="fla's kernels: fla and a GPU")
def test_fla_chunks_packed_as_segments_equal_the_batch_call():
    """fla's varlen path against its batch path on the same rows, in bf16 as a prefill runs."""
    chunk = mixer_module(tiny_model("hybrid", VOCAB, layers=2).cuda()).torch_chunk_gated_delta_rule
    q, k, v, gate, beta, state = _gdn_inputs(4, 200, heads=4, dim=64, device="cuda", dtype=torch.bfloat16)
    kw = {"use_qk_l2norm_in_kernel": True}
    want, want_state = chunk(q, k, v, g=gate, beta=beta, initial_state=state, output_final_state=True, **kw)
    got, got_state = as_segments(chunk, q, k, v, gate, beta, state, True, **kw)
    assert (got.float() - want.float()).abs().max() <= 1e-2 * want.float().abs().max()
    assert (got_state - want_state).abs().max() <= 1e-3 * want_state.abs().max()


@pytest.mark.skipif(not available(torch.device("cuda")), reason="the Triton kernels need a GPU")
def test_kernels_match_what_they_replace():
    err = self_check(torch.device("cuda"))
    assert err["recurrent_state"] < 1e-4 and err["recurrent_out"] < 2e-2 and err["conv_state"] == 0
    assert err["conv_out"] < 0.1 and err["attention"] < 2e-2 and err["attention_window"] < 2e-2


def test_every_cut_of_the_recurrence_compiles_for_an_h200_without_one():
    """The engine's cut and the others time_kernels compares build to sm_90 machine code on the 27B shape's
    layer (48 value heads, 16 key heads, 128 x 128 states), on a CPU: CI catches a cut that does not build."""
    from draftsmith.engine.kernels import GDN_LAUNCH, GDN_LAUNCHES
    from draftsmith.engine.triton_kernels import _kernels

    signature = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "g": "*fp32", "beta": "*bf16", "state": "*fp32"}
    signature |= {"out": "*bf16"} | dict.fromkeys(
        ("sq_b", "sq_h", "sk_b", "sk_h", "sv_b", "sv_h", "sg_b", "sbeta_b"), "i32"
    )
    signature |= {"scale": "fp32"}
    for launch in (GDN_LAUNCH, *GDN_LAUNCHES):
        shape = {"HV": 48, "GROUP": 3, "K": 128, "V": 128, "BK": 128, "BV": launch.block_v}
        constants = {**shape, "L2NORM": True, "STREAM": launch.stream}
        compiled = compile_for_h200(_kernels()[0], signature, constants, launch.warps)
        assert ".entry gdn_step" in compiled.asm["ptx"], launch


@pytest.mark.skipif(not available(torch.device("cuda")), reason="the Triton kernels need a GPU")
def test_every_cut_of_the_recurrent_state_computes_the_same_step():
    """The launches time_kernels compares must be candidates for the engine: same output, same new state."""
    from draftsmith.engine.kernels import GDN_LAUNCHES, gdn_step_

    g = torch.Generator("cuda").manual_seed(0)
    q, k = (torch.randn(5, 1, 2, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(5, 1, 6, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    decay = -torch.rand(5, 1, 6, device="cuda", generator=g)
    beta = torch.rand(5, 1, 6, device="cuda", generator=g)
    start = torch.randn(5, 6, 128, 128, device="cuda", generator=g)
    state = start.clone()
    want = gdn_step_(q, k, v, decay, beta, state)
    assert not torch.equal(state, start)
    for launch in GDN_LAUNCHES:
        mine = start.clone()
        got = gdn_step_(q, k, v, decay, beta, mine, launch=launch)
        torch.testing.assert_close(got, want, msg=str(launch))
        torch.testing.assert_close(mine, state, msg=str(launch))


@pytest.mark.skipif(not available(torch.device("cuda")), reason="the Triton kernels need a GPU")
@pytest.mark.parametrize("kind", ["sliding", "hybrid", "hybrid-packed"])
def test_engine_on_the_gpu_equals_generate(kind):
    """The GPU path end to end (Triton attention, windowed on sliding layers, Gated DeltaNet and RMSNorm
    kernels, CUDA graph) against `generate` in fp32, where no tf32 rounding is allowed to tell them apart."""
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
    packed = kind == "hybrid-packed"  # prefill groups as packed rows of segments
    # 3 slots admit one prompt at a time (groups of a quarter of the slots); 8 admit groups of 2, 2, 2, 1
    slots = 8 if packed else 3
    engine = Engine(model, slots=slots, max_len=80, eos_ids=[], sync_every=4, cuda_graph=True, packed=packed)
    assert engine.fused and engine.cuda_graph and engine.layer_kernels  # every RMSNorm a kernel too
    got, _ = engine.run(prompts, 20, progress=False)
    assert got == refs
    # the model called the swapped function, so packing was not a no-op; without fla nothing packs (the batch
    # call, as on the CPU), and the answers above still had to agree
    assert (engine.packed_calls > 0) == (packed and FLA)
