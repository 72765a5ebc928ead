"""Run once a test session (conftest's `interpreted` fixture) in a process of its own with
TRITON_INTERPRET=1 (Triton picks its interpreter as it is imported): target.fusion's kernels (RMSNorms, the
gated MLP's SiLU and product) on CPU tensors through Triton's interpreter against Transformers' own forwards.
Prints one JSON object of figures for test_norms.py and test_gated_mlp.py to judge."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from draftsmith.target import gated_mlp, norms
from draftsmith.target.fusion import failures, fused_modules, kernel_modules
from draftsmith.target.taps import forward_taps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest's tiny targets
from conftest import tiny_model  # noqa: E402

VOCAB = 97


def norm_modules(model) -> list:
    return [m for m in kernel_modules(model) if norms.norm_form(m) is not None]


def _randomize_norms(model) -> None:
    g = torch.Generator().manual_seed(3)
    for m in norm_modules(model):
        m.weight.data += 0.3 * torch.randn(m.weight.shape, generator=g).to(m.weight.dtype)


def _steps(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference in units of b's dtype's spacing at b's magnitude (1: one rounding step)."""
    spacing = torch.finfo(b.dtype).eps * b.float().abs().clamp_min(torch.finfo(b.dtype).tiny)
    return float(((a.float() - b.float()).abs() / spacing).max())


def _relative(got, want) -> float:
    return max(float((a - b).float().norm() / b.float().norm()) for a, b in zip(got, want))


class _Counted:
    """norms.rms_norm, counting its calls by form while active."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.real = norms.rms_norm

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs["form"])
        return self.real(*args, **kwargs)

    def __enter__(self) -> list[int]:
        norms.rms_norm = self
        return self.calls

    def __exit__(self, *exc) -> None:
        norms.rms_norm = self.real


def _forward_taps(model, ids: torch.Tensor) -> dict:
    """The extraction forward with and without the kernels (the first taps of the DFlash default)."""
    taps = [1, 2]
    with torch.no_grad():
        with _Counted() as plain_calls:
            plain = forward_taps(model, ids, None, taps, layer_kernels=False)
        with _Counted() as calls:
            fused = forward_taps(model, ids, None, taps)
    return {"calls": len(calls), "plain_calls": len(plain_calls), "rel": _relative([fused], [plain])}


def _whole_model(model, ids: torch.Tensor) -> dict:
    """Every hidden state with and without the kernels, and the forms of the kernel's calls."""
    with torch.no_grad():
        want = model(ids, output_hidden_states=True).hidden_states
        with _Counted() as calls, fused_modules(norm_modules(model)) as swapped:
            got = model(ids, output_hidden_states=True).hidden_states
    return {
        "swapped": swapped,
        "calls_by_form": {str(f): calls.count(f) for f in sorted(set(calls))},
        "hidden_rel": _relative(got, want),
        "restored": all("forward" not in vars(m) for m in norm_modules(model)),
    }


def _one_module(m, dtype: torch.dtype, g: torch.Generator) -> dict:
    """One module alone, on 600 rows that are strided (the first half of each row of a wider tensor, which the
    kernel reads in place) beside a contiguous gate."""
    n = m.weight.shape[0]
    x = (3 * torch.randn(40, 15, 2 * n, generator=g)).to(dtype)[..., :n]
    args = (x, torch.randn(x.shape, generator=g).to(dtype)) if norms.norm_form(m) == norms.GATED else (x,)
    with torch.no_grad():
        ref = m(*args)
        with fused_modules([m]):
            mine = m(*args)
    return {
        "steps": _steps(mine, ref),
        "differ": float((mine != ref).float().mean()),
        "dtype_same": mine.dtype == ref.dtype,
        "strided": x.reshape(-1, n).data_ptr() == x.data_ptr() and x.reshape(-1, n).stride(0) == 2 * n,
    }


def _mlps(model, ids: torch.Tensor, dtype: torch.dtype, g: torch.Generator) -> dict:
    """Each gated MLP alone (activations at the scale of a trained model's), and the whole model with only
    the MLPs swapped: its hidden states against Transformers'."""
    mlps = [m for m in kernel_modules(model) if gated_mlp.is_gated_mlp(m)]
    launches = []
    real = gated_mlp.silu_mul

    def counted(*args, **kwargs):
        launches.append(1)
        return real(*args, **kwargs)

    gated_mlp.silu_mul = counted
    rel = 0.0  # relative, not in rounding steps: the down projection sums some outputs to near zero
    with torch.no_grad():
        for m in mlps:
            x = (3 * torch.randn(2, 33, m.gate_proj.in_features, generator=g)).to(dtype)
            ref = m(x)
            with fused_modules([m]):
                mine = m(x)
            rel = max(rel, _relative([mine], [ref]))
        want = model(ids, output_hidden_states=True).hidden_states
        with fused_modules(mlps) as swapped:
            got = model(ids, output_hidden_states=True).hidden_states
    gated_mlp.silu_mul = real
    return {
        "launches": len(launches),
        "mlps": len(mlps),
        "swapped": swapped,
        "rel": rel,
        "hidden_rel": _relative(got, want),
        "restored": all("forward" not in vars(m) for m in mlps),
    }


def _silu_mul(dtype: torch.dtype, g: torch.Generator) -> dict:
    """The kernel alone against torch's two kernels, over an odd number of elements (a partial last block),
    written over its gate input as the MLP's forward does."""
    gate = (4 * torch.randn(3, 2500, generator=g)).to(dtype)
    up = torch.randn(3, 2500, generator=g).to(dtype)
    want = torch.nn.functional.silu(gate) * up
    got = gated_mlp.silu_mul(gate.clone(), up)
    over = gate.clone()
    same = gated_mlp.silu_mul(over, up, out=over)
    return {
        "steps": _steps(got, want),
        "differ": float((got != want).float().mean()),
        "in_place": same.data_ptr() == over.data_ptr() and torch.equal(same, got),
    }


def main() -> None:
    out: dict = {}
    g = torch.Generator().manual_seed(0)
    # float16: the interpreter rounds to it as a GPU does (to nearest), unlike bfloat16 (toward zero)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for kind in ("hybrid", "attention"):
            model = tiny_model(kind, VOCAB, layers=4).to(dtype)
            _randomize_norms(model)
            name = f"{kind}_{str(dtype).split('.')[-1]}"
            ids = torch.randint(1, VOCAB, (3, 21), generator=g)
            out[name] = _whole_model(model, ids)
            out[f"{name}_forward_taps"] = _forward_taps(model, ids)
            out[f"mlp_{name}"] = _mlps(model, ids, dtype, g)
            for m in norm_modules(model):
                out[f"{name}_{type(m).__name__}"] = _one_module(m, dtype, g)
        out[f"silu_mul_{str(dtype).split('.')[-1]}"] = _silu_mul(dtype, g)
    out["failures"] = failures()  # a kernel that failed would hand back to Transformers' exact forward
    print(json.dumps(out))


if __name__ == "__main__":
    main()
