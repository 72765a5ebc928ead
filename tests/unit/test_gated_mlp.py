"""The gated MLP's SiLU and product as one Triton kernel (draftsmith.target.gated_mlp): which MLPs qualify,
and, through Triton's interpreter on the CPU, compiled for sm_90 and on a GPU, that it computes what torch
computes."""

from __future__ import annotations

import pytest
import torch
from conftest import compile_for_h200, tiny_model
from torch import nn

from draftsmith.target import gated_mlp
from draftsmith.target.fusion import fused_modules, kernel_modules
from draftsmith.target.gated_mlp import is_gated_mlp, silu_mul

VOCAB = 97
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel compiles for a GPU")


def test_every_gated_mlp_of_a_hybrid_and_an_attention_target_qualifies():
    for kind in ("hybrid", "attention"):
        model = tiny_model(kind, VOCAB, layers=3)
        mlps = [m for m in kernel_modules(model) if is_gated_mlp(m)]
        assert len(mlps) == 3 and all(type(m).__name__.endswith("MLP") for m in mlps)


def test_an_mlp_that_computes_something_else_keeps_its_forward():
    """The class's forward decides: another activation, another forward, or a hooked activation."""
    model = tiny_model("attention", VOCAB, layers=1)
    mlp = model.model.layers[0].mlp
    assert is_gated_mlp(mlp)

    class Scaled(type(mlp)):
        def forward(self, x):
            return 2 * self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    scaled = Scaled.__new__(Scaled)
    scaled.__dict__.update(mlp.__dict__)
    assert not is_gated_mlp(scaled)
    gelu = type(mlp).__new__(type(mlp))
    gelu.__dict__.update({**mlp.__dict__, "_modules": {**mlp._modules, "act_fn": nn.GELU()}})
    assert not is_gated_mlp(gelu)
    mlp.act_fn.forward = lambda x: x  # someone wrapped the activation
    assert not is_gated_mlp(mlp)


# (dtype, rounding steps of a result in eps x |value|, fraction of elements that may differ): the interpreter
# rounds float16 to nearest as a GPU does, where one unit in the last place on a few elements (up to 2 eps x
# |value| just above a power of two) is the exp's and division's last bit; bfloat16 it rounds toward zero, so
# there only the size is checked
INTERPRETED = (("float32", 4.0, 1.0), ("float16", 2.0, 0.01), ("bfloat16", 3.0, 1.0))


def test_the_kernel_under_triton_s_interpreter_computes_torch_s_silu_and_product(interpreted):
    assert interpreted["failures"] == []
    for dtype, most_steps, most_differ in INTERPRETED:
        alone = interpreted[f"silu_mul_{dtype}"]
        assert alone["in_place"], alone
        assert alone["steps"] <= most_steps and alone["differ"] <= most_differ, (dtype, alone)
        for kind in ("hybrid", "attention"):
            run = interpreted[f"mlp_{kind}_{dtype}"]
            assert run["mlps"] == 4 and run["swapped"] == 4 and run["restored"], run
            assert run["launches"] == 4 + 4, run  # each MLP alone, then each in the whole model
            most_rel = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 0.02}[dtype]
            assert run["rel"] < most_rel and run["hidden_rel"] < most_rel, (kind, dtype, run)


def test_calls_the_kernel_cannot_compute_as_torch_does_keep_the_module_s_forward(monkeypatch):
    from draftsmith.target.gated_mlp import _fits

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    assert _fits(x, w) and _fits(x.bfloat16(), w.bfloat16())
    assert not _fits(x, w.bfloat16())  # mixed dtypes: torch would promote
    assert not _fits(x.to(torch.float64), w.to(torch.float64))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not _fits(x, w)  # a CPU tensor without the interpreter
    with pytest.raises(ValueError, match="one shape"):
        silu_mul(torch.randn(4, 8), torch.randn(4, 9))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_kernel_compiles_for_an_h200_without_one(dtype):
    signature = {"gate": f"*{dtype}", "up": f"*{dtype}", "out": f"*{dtype}", "n": "i64"}
    compiled = compile_for_h200(gated_mlp._kernel(), signature, {"BLOCK": gated_mlp._BLOCK}, 4)
    assert len(compiled.asm["cubin"]) > 1000 and ".entry silu_mul_kernel" in compiled.asm["ptx"]


@needs_gpu
def test_the_kernel_on_a_gpu_rounds_where_torch_rounds():
    """bf16 at a prefill's size: at most one bf16 step apart, on at most 0.1% of the elements (the exp's and
    division's last bits); written over the gate, as the MLP's forward does."""
    g = torch.Generator("cuda").manual_seed(0)
    gate = 4 * torch.randn(4099, 17408, device="cuda", generator=g).bfloat16()
    up = torch.randn(4099, 17408, device="cuda", generator=g).bfloat16()
    want = torch.nn.functional.silu(gate) * up
    got = silu_mul(gate, up, out=gate)
    step = torch.finfo(torch.bfloat16).eps * want.float().abs().clamp_min(1e-30)
    assert bool(((got.float() - want.float()).abs() <= step).all())
    assert float((got != want).float().mean()) <= 1e-3


def _interpreted_mlp(monkeypatch):
    """A tiny target's first MLP, with CPU tensors sent to the kernel (Triton's interpreter, or a counter)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    launches = []
    monkeypatch.setattr(gated_mlp, "silu_mul", lambda gate, up, out=None: launches.append(out) or gate * 0)
    mlp = tiny_model("attention", VOCAB, layers=1).model.layers[0].mlp
    return mlp, launches


def test_hooks_on_the_activation_or_the_gate_projection_see_what_transformers_shows_them(monkeypatch):
    """A hook on the activation needs torch's SiLU to run (ours never calls it); a hook on the gate projection
    may keep its output, which the kernel then must not overwrite."""
    mlp, launches = _interpreted_mlp(monkeypatch)
    x = torch.randn(2, 5, mlp.gate_proj.in_features)
    seen = []
    with torch.no_grad(), fused_modules([mlp]):
        handle = mlp.act_fn.register_forward_hook(lambda _m, _a, out: seen.append(out))
        mlp(x)
        handle.remove()
        assert seen and launches == []  # the module's own forward ran
        handle = mlp.gate_proj.register_forward_hook(lambda _m, _a, out: seen.append(out))
        mlp(x)
        handle.remove()
        assert launches == [None]  # the kernel ran, into a new tensor
        mlp(x)
        assert launches[-1] is not None  # no hook: over the gate projection's output


def test_training_never_reaches_the_kernel(monkeypatch):
    """Any trainable projection (here only up_proj's weight) sends the call to torch's kernels, so every
    gradient flows as in Transformers."""
    mlp, launches = _interpreted_mlp(monkeypatch)
    for p in mlp.parameters():
        p.requires_grad_(False)
    mlp.up_proj.weight.requires_grad_(True)
    x = torch.randn(2, 5, mlp.gate_proj.in_features)
    with fused_modules([mlp]):
        mlp(x).sum().backward()
    assert launches == [] and mlp.up_proj.weight.grad is not None and mlp.up_proj.weight.grad.abs().sum() > 0


def test_an_activation_named_silu_that_computes_something_else_does_not_qualify():
    model = tiny_model("attention", VOCAB, layers=1)
    mlp = model.model.layers[0].mlp

    class SiLU(nn.Module):  # a remote-code model's own activation, by torch's name
        def forward(self, x):
            return torch.relu(x)

    mlp.act_fn = SiLU()
    assert not is_gated_mlp(mlp)
    with fused_modules([mlp]) as swapped:  # not even when handed over directly
        assert swapped == 0
