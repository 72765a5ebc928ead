"""The Triton decode kernels' wrappers (the kernels themselves are in triton_kernels.py): two for the
one-token step of Gated DeltaNet layers, writing their states in place, and one for decode attention over each
slot's own keys.

Under a CUDA graph the slot cache's states must keep their addresses. fla's recurrent kernel writes the new
recurrent state to a fresh tensor, so the graph path had to copy it back: for Qwen3.6-27B a 151 MB fp32 state
per slot, read and written once more every step (13 ms of a 57 ms step at 128 slots). Transformers' one-token
convolution update without the `causal_conv1d` package is a concatenation, a copy, a grouped `conv1d`, an
activation and a cast. Both become one kernel each that reads a state once and writes it back where it was.

`fused_decode(mixer_module(model))` swaps them in for Transformers' functions of that model's family while a
decode step runs (eager or captured), on CUDA with Triton; anything else (prefill, several tokens, the CPU)
goes to the original. The attention kernel is called by the engine's own attention function
(attention.decode_attention). The kernels' Triton sources are in engine/triton_kernels.py.

`packed_prefill(mixer_module(model))` runs a prefill group's Gated DeltaNet chunks as one packed row of
segments, so that fla compiles its prefill kernels once rather than once per group size.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from dataclasses import dataclass

import torch

from draftsmith.engine.triton_kernels import _kernels

# the module-level names the Gated DeltaNet mixers of Qwen3.5/3.6 and Qwen3-Next call in their decode branch
_RECURRENT, _CONV = "torch_recurrent_gated_delta_rule", "causal_conv1d_update"


def available(device: torch.device) -> bool:
    if device.type != "cuda" or not torch.cuda.is_available():  # Triton may be installed without a GPU
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class GdnLaunch:
    """How `gdn_step_` cuts the state: `block_v` state columns a program, `warps` a program, and whether the
    state is loaded and stored as streamed (not kept in L2)."""

    block_v: int = 64
    warps: int = 4
    stream: bool = False


# the engine's choice, the fastest cut measured (docs/measurements.md); time_kernels times the others
GDN_LAUNCH = GdnLaunch()
GDN_LAUNCHES = (
    GdnLaunch(8, 1),
    GdnLaunch(16, 1),
    GdnLaunch(32, 4),
    GdnLaunch(64, 4, True),
    GdnLaunch(64, 8),
    GdnLaunch(128, 4),
    GdnLaunch(128, 8),
)


def gdn_step_(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    l2norm: bool = True,
    scale: float | None = None,
    *,
    launch: GdnLaunch | None = None,
) -> torch.Tensor:
    """One token of the gated delta rule for every slot; `state` [B, HV, K, V] fp32 is updated in place.

    query/key [B, 1, H, K] (H divides HV), value [B, 1, HV, V], g (log decay) and beta [B, 1, HV]; returns the
    output [B, 1, HV, V] in value's dtype. `launch`: how the state is cut among programs (`time_kernels`
    compares the choices).
    """
    launch = launch or GDN_LAUNCH
    b, _, h, kd = key.shape
    hv, vd = value.shape[2], value.shape[3]
    query, key, value = (x if x.stride(-1) == 1 else x.contiguous() for x in (query, key, value))
    out = value.new_empty((b, 1, hv, vd))
    bk, bv = triton_next_pow2(kd), launch.block_v
    gdn_step, _, _ = _kernels()
    gdn_step[(b * hv * -(-vd // bv),)](
        query,
        key,
        value,
        g,
        beta,
        state,
        out,
        query.stride(0),
        query.stride(2),
        key.stride(0),
        key.stride(2),
        value.stride(0),
        value.stride(2),
        g.stride(0),
        beta.stride(0),
        kd**-0.5 if scale is None else scale,
        HV=hv,
        GROUP=hv // h,
        K=kd,
        V=vd,
        BK=bk,
        BV=bv,
        L2NORM=l2norm,
        STREAM=launch.stream,
        num_warps=launch.warps,
    )
    return out


def conv_step_(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
) -> torch.Tensor:
    """One token of the depthwise causal convolution; `state` [B, C, S] shifts left in place and takes the
    input.

    x [B, C, 1]; weight [C, KW] with KW <= S + 1; returns [B, C, 1] in x's dtype (a view of a [B, 1, C]
    tensor, the layout the mixer transposes it back to).
    """
    b, c, _ = x.shape
    kw = weight.shape[-1]
    out = x.new_empty((b, 1, c))
    bc = 256
    _, conv_step, _ = _kernels()
    conv_step[(b, -(-c // bc))](
        x,
        state,
        weight.contiguous(),
        bias if bias is not None else weight,
        out,
        x.stride(0),
        x.stride(1),
        state.stride(0),
        state.stride(1),
        c,
        S=state.shape[-1],
        KW=kw,
        BC=bc,
        HAS_BIAS=bias is not None,
        SILU=activation in ("silu", "swish"),
        num_warps=4,
    )
    return out.transpose(1, 2)


def attention_(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pos: torch.Tensor,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """One new token per slot against keys/values [B, HKV, L, D] up to position `pos[b]` (inclusive) of each
    slot, and (window > 0) only the last `window` of them, as Transformers' sliding mask has it: only the keys
    a slot sees are read, and each once for all query heads of its group. query [B, HQ, 1, D]; returns [B, 1,
    HQ, D]."""
    b, hq, _, d = query.shape
    hkv = key.shape[1]
    if query.stride(-1) != 1:
        query = query.contiguous()
    out = query.new_empty((b, 1, hq, d))
    group = hq // hkv
    _, _, attend = _kernels()
    attend[(b * hkv,)](
        query,
        key,
        value,
        pos,
        out,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        key.stride(2),
        value.stride(0),
        value.stride(1),
        value.stride(2),
        out.stride(0),
        out.stride(2),
        scale,
        window if window > 0 else key.shape[2] + 1,
        HKV=hkv,
        GROUP=group,
        GP=max(16, triton_next_pow2(group)),
        D=d,
        BN=64 if d <= 128 else 32,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=4,
    )  # fp32 models: no tf32 rounding
    return out


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _fused_recurrent(original):
    def recurrent(
        query,
        key,
        value,
        g,
        beta,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=None,
        **kwargs,
    ):
        ok = (
            query.is_cuda
            and initial_state is not None
            and output_final_state
            and query.shape[1] == 1
            and cu_seqlens is None
            and not kwargs.get("scale")
            and initial_state.dtype == torch.float32
            and initial_state.is_contiguous()
            and value.shape[2] % key.shape[2] == 0
        )
        if not ok:
            return original(
                query,
                key,
                value,
                g=g,
                beta=beta,
                initial_state=initial_state,
                output_final_state=output_final_state,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                cu_seqlens=cu_seqlens,
                **kwargs,
            )
        return gdn_step_(query, key, value, g, beta, initial_state, use_qk_l2norm_in_kernel), initial_state

    return recurrent


def _fused_conv(original):
    def conv(hidden_states, conv_state, weight, bias=None, activation=None):
        ok = (
            hidden_states.is_cuda
            and hidden_states.shape[-1] == 1
            and activation in (None, "silu", "swish")
            and weight.shape[-1] <= conv_state.shape[-1] + 1
            and conv_state.stride(-1) == 1
        )
        if not ok:
            return original(hidden_states, conv_state, weight, bias, activation)
        return conv_step_(hidden_states, conv_state, weight, bias, activation)

    return conv


@contextlib.contextmanager
def fused_decode(module):
    """While active, the one-token Gated DeltaNet calls of `module` (see mixer_module; None: nothing to swap)
    run on the in-place kernels above."""
    names = [n for n in (_RECURRENT, _CONV) if module is not None and callable(getattr(module, n, None))]
    saved = {n: getattr(module, n) for n in names}
    wrap = {_RECURRENT: _fused_recurrent, _CONV: _fused_conv}
    try:
        for n in names:
            setattr(module, n, wrap[n](saved[n]))
        yield bool(names)
    finally:
        for n in names:
            setattr(module, n, saved[n])


# --- prefill: a batch of rows as one packed sequence of segments
_CHUNK = "torch_chunk_gated_delta_rule"


def as_segments(
    fn, query, key, value, g, beta, initial_state=None, output_final_state=False, *, boundaries=None, **kwargs
):
    """Calls a chunked Gated DeltaNet function `fn` on a batch [B, T, ...] as one row of B segments of T
    positions (`cu_seqlens` 0, T, 2T, ...), and returns its output in the batch's shape [B, T, ...] with the
    final states [B, ...] as the batch call gives them.

    fla's chunk kernels treat every segment of a packed row as its own sequence, chunked from its own start,
    so the arithmetic is the batch's; but some of them (the gates' chunk cumsum) take the batch size as a
    compile-time constant and autotune per batch size, which is what makes a prefill group of each new size
    pay a compilation. Packed, every group is a batch of one. `boundaries`: the (device, host) copies of the
    segment starts (`segment_starts`); fla reads its chunk indices from the host copy instead of syncing."""
    b, t = query.shape[:2]
    cu, cu_cpu = boundaries if boundaries is not None else segment_starts(b, t, query.device)

    def row(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(1, b * t, *x.shape[2:])

    out, state = fn(
        row(query),
        row(key),
        row(value),
        g=row(g),
        beta=row(beta),
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu,
        cu_seqlens_cpu=cu_cpu,
        **kwargs,
    )
    if output_final_state and (state is None or state.shape[0] != b):
        # Transformers' torch reference drops `cu_seqlens` and would have run the row as one sequence
        raise RuntimeError(
            f"packed prefill: {b} segments gave {None if state is None else state.shape[0]} final states; "
            "the chunk function ignored cu_seqlens (packing needs fla's varlen kernels: is fla installed?)"
        )
    return out.reshape(b, t, *out.shape[2:]), state


def segment_starts(b: int, t: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`cu_seqlens` of B segments of T positions, on `device` and on the host (built apart: no sync)."""
    return (
        torch.arange(0, (b + 1) * t, t, dtype=torch.long, device=device),
        torch.arange(0, (b + 1) * t, t, dtype=torch.long),
    )


def _fla_present() -> bool:
    return importlib.util.find_spec("fla") is not None


def _packed_chunk(original):
    fla = _fla_present()  # without fla the chunk function is Transformers' reference, which knows no segments
    starts: dict[tuple[int, int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def chunk(
        query, key, value, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None, **kw
    ):
        if not (fla and query.is_cuda) or cu_seqlens is not None or query.shape[0] == 1:
            return original(
                query,
                key,
                value,
                g=g,
                beta=beta,
                initial_state=initial_state,
                output_final_state=output_final_state,
                cu_seqlens=cu_seqlens,
                **kw,
            )
        chunk.calls += 1
        b, t = query.shape[:2]
        key_ = (b, t, query.device)  # one group's layers share their segment starts
        if key_ not in starts:
            starts[key_] = segment_starts(b, t, query.device)
        return as_segments(
            original,
            query,
            key,
            value,
            g,
            beta,
            initial_state,
            output_final_state,
            boundaries=starts[key_],
            **kw,
        )

    chunk.calls = 0  # layer calls packed; 0 after a GPU prefill: the model never called the swapped name
    return chunk


@contextlib.contextmanager
def packed_prefill(module):
    """While active, the chunked (multi-token) Gated DeltaNet calls of `module` (see mixer_module; None:
    nothing to swap) run their batch as one packed row on CUDA with fla (`as_segments`); the CPU, or a GPU
    without fla, keeps the batch call. Yields the wrapper (its `calls`: how many layer calls it packed), or
    None where nothing was swapped."""
    original = getattr(module, _CHUNK, None) if module is not None else None
    if not callable(original):
        yield None
        return
    wrapper = _packed_chunk(original)
    try:
        setattr(module, _CHUNK, wrapper)
        yield wrapper
    finally:
        setattr(module, _CHUNK, original)
