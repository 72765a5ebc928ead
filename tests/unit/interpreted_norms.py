"""Run by test_norms.py in a process of its own with TRITON_INTERPRET=1 (Triton picks its interpreter as it
is imported): the fused RMSNorm kernel on CPU tensors through Triton's interpreter against Transformers' own
forwards. Prints one JSON object of figures for the test to judge."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from draftsmith.target import norms
from draftsmith.target.norms import fused_norms, norm_modules
from draftsmith.target.taps import forward_taps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest's tiny targets
from conftest import tiny_model  # noqa: E402

VOCAB = 97


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
            plain = forward_taps(model, ids, None, taps, norm_kernels=False)
        with _Counted() as calls:
            fused = forward_taps(model, ids, None, taps)
    return {"calls": len(calls), "plain_calls": len(plain_calls), "rel": _relative([fused], [plain])}


def _whole_model(model, ids: torch.Tensor) -> dict:
    """Every hidden state with and without the kernels, and the forms of the kernel's calls."""
    with torch.no_grad():
        want = model(ids, output_hidden_states=True).hidden_states
        with _Counted() as calls, fused_norms(norm_modules(model)) as swapped:
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
        with fused_norms([m]):
            mine = m(*args)
    return {
        "steps": _steps(mine, ref),
        "differ": float((mine != ref).float().mean()),
        "dtype_same": mine.dtype == ref.dtype,
        "strided": x.reshape(-1, n).data_ptr() == x.data_ptr() and x.reshape(-1, n).stride(0) == 2 * n,
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
            for m in norm_modules(model):
                out[f"{name}_{type(m).__name__}"] = _one_module(m, dtype, g)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
