"""The target's RMSNorms as one Triton kernel each (draftsmith.target.norms): which modules it takes, that it
swaps and restores them, that CPU tensors keep Transformers' forward, and, through Triton's interpreter on the
CPU and on a GPU, that the kernel computes what Transformers computes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import compile_for_h200, tiny_model

from draftsmith.target.fusion import fused_modules, kernel_modules
from draftsmith.target.norms import GATED, WEIGHTED, ZERO_CENTRED, norm_form, rms_norm

VOCAB = 97
HERE = Path(__file__).resolve().parent


def norm_modules(model) -> list:
    return [m for m in kernel_modules(model) if norm_form(m) is not None]


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel compiles for a GPU")


def test_every_rmsnorm_of_a_hybrid_and_an_attention_target_is_found_with_its_form():
    hybrid = norm_modules(tiny_model("hybrid", VOCAB, layers=4))  # 3 Gated DeltaNet layers, 1 attention layer
    forms = [norm_form(m) for m in hybrid]
    # two a layer, q and k norms of the attention layer, the final norm; one gated norm a Gated DeltaNet layer
    assert forms.count(ZERO_CENTRED) == 4 * 2 + 2 + 1 and forms.count(GATED) == 3
    attention = norm_modules(tiny_model("attention", VOCAB, layers=3))
    assert [norm_form(m) for m in attention] == [WEIGHTED] * (3 * 4 + 1)


def test_swapped_forwards_are_restored_and_cpu_tensors_keep_transformers_forward():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Triton runs interpreted in this process: CPU tensors go to the kernel")
    model = tiny_model("hybrid", VOCAB, layers=4)
    found = norm_modules(model)
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
        with fused_modules(found) as swapped:
            assert swapped == len(found) and all("forward" in vars(m) for m in found)
            got = model(ids).logits
        assert torch.equal(got, want)
        assert all("forward" not in vars(m) for m in found)
        with pytest.raises(RuntimeError, match="inside"), fused_modules(found):
            raise RuntimeError("inside")
    assert all("forward" not in vars(m) for m in found)
    with fused_modules(None) as swapped:
        assert swapped == 0


# (dtype, rounding steps of one norm's result in eps x |value|, fraction of its elements that may differ,
# relative difference of the taps): fp32 differs only by a few steps (sum order, fast exp and rsqrt); float16,
# which the interpreter rounds to nearest as a GPU does, shows where the kernel rounds (one unit in the last
# place, up to 2 eps x |value| just above a power of two, on a few elements; a rounding left out moves a
# quarter of them); bfloat16 the interpreter rounds toward zero, so there only the size is checked
INTERPRETED = (("float32", 4.0, 1.0, 1e-5), ("float16", 2.0, 0.01, 1e-3), ("bfloat16", 3.0, 1.0, 0.02))


@pytest.mark.parametrize("kind", ["hybrid", "attention"])
def test_the_kernel_under_triton_s_interpreter_computes_transformers_norms(interpreted, kind):
    """Each norm module alone on strided rows, the whole model, and the extraction forward: every norm goes
    through the kernel, every module gets its forward back, and the results are Transformers' within the
    rounding above."""
    assert interpreted["failures"] == []  # a kernel that failed would hand back to Transformers' forward
    for dtype, most_steps, most_differ, most_rel in INTERPRETED:
        run = interpreted[f"{kind}_{dtype}"]
        assert run["restored"]
        swapped = run["swapped"]
        assert swapped == (14 if kind == "hybrid" else 17)
        assert sum(run["calls_by_form"].values()) == swapped  # each norm runs once a forward
        taps = interpreted[f"{kind}_{dtype}_forward_taps"]  # the extraction forward: kernels unless told not
        assert taps["calls"] > 0 and taps["plain_calls"] == 0 and taps["rel"] < most_rel, taps
        modules = {
            k: v
            for k, v in interpreted.items()
            if k.startswith(f"{kind}_{dtype}_") and not k.endswith("_taps")
        }
        assert modules, sorted(interpreted)
        for name, f in modules.items():
            assert f["dtype_same"] and f["strided"], (name, f)
            assert f["steps"] <= most_steps and f["differ"] <= most_differ, (name, f)
        assert run["hidden_rel"] < most_rel, run


@needs_gpu
@pytest.mark.parametrize(
    "form, weight_dtype", [(ZERO_CENTRED, "bf16"), (WEIGHTED, "bf16"), (WEIGHTED, "fp32"), (GATED, "bf16")]
)
def test_the_kernel_on_a_gpu_rounds_where_transformers_rounds(form, weight_dtype):
    """bf16 inputs on a GPU, read in place from strided rows: at most one bf16 step apart, on at most 1% of
    the elements (fp32 sums of squares in another order can move a value across a rounding
    boundary, seldom). An fp32 weight makes Llama's norm return fp32, and the kernel too: there nothing
    rounds the sums' order away, so a few fp32 steps (4, as under the interpreter) on any element."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm, Qwen3_5RMSNormGated

    width = {ZERO_CENTRED: 5120, WEIGHTED: 4096, GATED: 128}[form]
    module = {ZERO_CENTRED: Qwen3_5RMSNorm, WEIGHTED: LlamaRMSNorm, GATED: Qwen3_5RMSNormGated}[form](width)
    module = module.to("cuda", torch.float32 if weight_dtype == "fp32" else torch.bfloat16)
    g = torch.Generator("cuda").manual_seed(0)
    module.weight.data += 0.3 * torch.randn(width, device="cuda", generator=g).to(module.weight.dtype)
    x = 3 * torch.randn(4096, 2 * width, device="cuda", generator=g).bfloat16()[:, :width]
    gate = torch.randn(4096, width, device="cuda", generator=g).bfloat16() if form == GATED else None
    with torch.no_grad():
        want = module(x) if gate is None else module(x, gate)
        got = rms_norm(
            x,
            module.weight,
            module.variance_epsilon if form != ZERO_CENTRED else module.eps,
            form=form,
            gate=gate,
        )
    assert got.dtype == want.dtype and got.shape == want.shape
    # one step of x's dtype (where both round the normed row before the weight), on at most 1% of elements;
    # an fp32 result differs elsewhere by a few fp32 steps at most
    step = torch.finfo(x.dtype).eps * want.float().abs().clamp_min(1e-30)
    diff = (got.float() - want.float()).abs()
    assert bool((diff <= step).all())
    fine = 4 * torch.finfo(torch.float32).eps * want.abs() if want.dtype == torch.float32 else 0.0
    assert float((diff > fine).float().mean()) <= 0.01


def test_calls_the_kernel_cannot_compute_as_the_module_does_keep_the_module_s_forward(monkeypatch):
    """Weights of another length or layout, a gate of another shape, empty or too wide rows, a gated norm
    whose weight has another dtype than its input, a call that autograd would follow: all go to
    Transformers' forward."""
    from draftsmith.target.norms import _fits

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors count as the kernel's
    x, w = torch.randn(4, 8), torch.randn(8)
    assert _fits(x, w, None, gated=False) and _fits(x, w, torch.randn(4, 8), gated=True)
    assert not _fits(x, torch.randn(1), None, gated=False)
    assert not _fits(x, torch.randn(16)[::2], None, gated=False)  # not contiguous
    assert not _fits(x, w, torch.randn(3, 8), gated=True) and not _fits(x, w, None, gated=True)
    assert not _fits(x, w.bfloat16(), torch.randn(4, 8), gated=True)
    assert not _fits(torch.randn(4, 0), torch.randn(0), None, gated=False)
    assert not _fits(torch.randn(2, 9000), torch.randn(9000), None, gated=False)
    trained = torch.nn.Parameter(w.clone())
    assert not _fits(x, trained, None, gated=False)  # the kernel has no backward
    with torch.no_grad():
        assert _fits(x, trained, None, gated=False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not _fits(x, w, None, gated=False)  # a CPU tensor without the interpreter


def test_norms_wrapped_by_accelerate_keep_their_hooks():
    """A model spread over GPUs has accelerate's hooks on its modules: those norms are left as they are, and
    a wrapper installed while the kernels are swapped in is not removed with them."""
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module

    model = tiny_model("hybrid", VOCAB, layers=4)
    hooked = model.model.norm
    add_hook_to_module(hooked, ModelHook())
    found = norm_modules(model)
    assert hooked not in found and len(found) == 4 * 2 + 2 + 3
    later = norm_modules(model)[0]
    with fused_modules(found):
        assert vars(hooked)["forward"] is not None
        add_hook_to_module(later, ModelHook())  # someone wraps a swapped module meanwhile
        theirs = vars(later)["forward"]
    assert vars(later).get("forward") is theirs and "forward" in vars(hooked)
    remove_hook_from_module(later)
    remove_hook_from_module(hooked)


@pytest.mark.parametrize(
    "form, width, out", [(ZERO_CENTRED, 5120, "bf16"), (WEIGHTED, 4096, "fp32"), (GATED, 128, "bf16")]
)
def test_the_kernel_compiles_for_an_h200_without_one(form, width, out):
    """What the interpreter cannot say, that the kernel builds to machine code for sm_90, CI says on a CPU."""
    from draftsmith.target.norms import _kernel, launch_shape

    rows, block, warps = launch_shape(width)
    weight = "*fp32" if out == "fp32" else "*bf16"
    signature = {"x": "*bf16", "gate": "*bf16", "w": weight, "out": f"*{out}"}
    signature |= dict.fromkeys(("n_rows", "n", "sx", "sg"), "i32") | {"eps": "fp32", "inv_n": "fp32"}
    compiled = compile_for_h200(_kernel(), signature, {"FORM": form, "ROWS": rows, "BLOCK": block}, warps)
    assert len(compiled.asm["cubin"]) > 1000 and ".entry rms_norm_kernel" in compiled.asm["ptx"]
