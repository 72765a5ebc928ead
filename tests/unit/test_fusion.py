"""target.fusion: which modules take our kernels, the switch that turns them off in every job, and what
happens where a kernel cannot run (the kernels' own numbers are test_norms.py's and test_gated_mlp.py's)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from draftsmith.target import fusion, gated_mlp, norms
from draftsmith.target.fusion import failures, fused_modules, kernel_modules

VOCAB = 97


def test_the_environment_can_turn_the_kernels_off_for_every_job(monkeypatch):
    """The engine and the extraction forward both take their modules from kernel_modules: 14 norms and 4
    gated MLPs here."""
    monkeypatch.setenv("DRAFTSMITH_LAYER_KERNELS", "0")
    model = tiny_model("hybrid", VOCAB, layers=4)
    assert kernel_modules(model) == []
    monkeypatch.setenv("DRAFTSMITH_LAYER_KERNELS", "1")
    found = kernel_modules(model)
    assert sum(norms.norm_form(m) is not None for m in found) == 14
    assert sum(gated_mlp.is_gated_mlp(m) for m in found) == 4 and len(found) == 18


@pytest.mark.parametrize(
    "kind, owner, name", [("RMSNorm", norms, "rms_norm"), ("gated MLP", gated_mlp, "silu_mul")]
)
def test_a_kernel_that_cannot_run_leaves_transformers_forward_in_place(
    monkeypatch, caplog, kind, owner, name
):
    """A Triton that cannot compile a kernel on some machine must cost one warning, not the job: that kind
    hands every call to Transformers from then on, the other kind keeps running."""
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("no such instruction on this GPU")

    monkeypatch.setattr(owner, name, broken)
    monkeypatch.setattr(fusion, "_failed", {})
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors are sent to the (broken) kernel
    model = tiny_model("hybrid", VOCAB, layers=4)
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    only = [m for m in kernel_modules(model) if (norms.norm_form(m) is not None) == (kind == "RMSNorm")]
    with torch.no_grad():
        want = model(ids).logits
        with caplog.at_level("WARNING", logger="draftsmith.target.fusion"), fused_modules(only):
            got = model(ids).logits
            again = model(ids).logits
    assert torch.equal(got, want) and torch.equal(again, want)
    assert len(calls) == 1  # tried once, then Transformers' forward for every later call
    assert [f.split(":")[0] for f in failures()] == [kind]
    assert sum(f"{kind} kernel failed" in r.message for r in caplog.records) == 1


def test_a_caller_s_own_error_is_raised_and_leaves_the_kernels_on(monkeypatch):
    """Only a kernel's launch is guarded: a wrong input raises Transformers' own error, and a keyword call
    goes to Transformers' forward, neither turning a kind of kernel off."""
    monkeypatch.setattr(fusion, "_failed", {})
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model = tiny_model("attention", VOCAB, layers=1)
    mlp, norm = model.model.layers[0].mlp, model.model.norm
    with torch.no_grad(), fused_modules([mlp, norm]) as swapped:
        assert swapped == 2
        with pytest.raises(RuntimeError, match="shape"):
            mlp(torch.randn(2, 5, mlp.gate_proj.in_features + 1))
        x = torch.randn(2, 5, norm.weight.shape[0])
        assert torch.equal(norm(hidden_states=x), norm.__class__.forward(norm, x))
    assert failures() == []


def test_the_extraction_forward_and_the_engine_run_the_mlp_kernel(monkeypatch):
    """Nothing on these paths (tap hooks, Transformers' own recording) keeps the gated MLP on torch's kernels:
    each MLP up to the deepest tap launches ours once."""
    from draftsmith.engine.engine import Engine
    from draftsmith.target import taps

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    launches = []

    def counted(gate, up, out=None):
        launches.append(gate.shape)
        return torch.nn.functional.silu(gate) * up

    monkeypatch.setattr(gated_mlp, "silu_mul", counted)
    only_mlps = lambda model: [m for m in kernel_modules(model) if gated_mlp.is_gated_mlp(m)]  # noqa: E731
    monkeypatch.setattr(taps, "kernel_modules", only_mlps)  # Triton stays unimported: no interpreter leaks
    model = tiny_model("hybrid", VOCAB, layers=4)
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    taps.forward_taps(model, ids, None, [0, 2])
    assert len(launches) == 3  # layers 0..2; the forward stops after the deepest tap
    launches.clear()
    engine = Engine(model, slots=2, max_len=16, eos_ids=[])
    # on a CPU the engine keeps Transformers' forwards; here the MLPs take ours
    engine._kernel_modules = only_mlps(model)
    engine.run([ids[0].tolist(), ids[1].tolist()], 2, progress=False)
    assert len(launches) >= 4 * 2  # a prefill and at least one decode step through every layer
