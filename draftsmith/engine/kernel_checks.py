"""The decode kernels (engine/kernels.py) checked against the functions they replace, and timed: what the GPU
tests and the regeneration benchmarks call."""

from __future__ import annotations

import importlib

import torch

from draftsmith.engine.kernels import _CONV, _RECURRENT, GDN_LAUNCHES, attention_, conv_step_, gdn_step_


def reference_attention(query, key, value, pos, scale, window: int = 0) -> torch.Tensor:
    """attention_ in fp32 torch: [B, 1, HQ, D]."""
    group = query.shape[1] // key.shape[1]
    k, v = (x.float().repeat_interleave(group, 1) for x in (key, value))
    scores = (query.float() @ k.transpose(-1, -2)) * scale
    cols = torch.arange(key.shape[2], device=key.device)
    hidden = cols[None, :] > pos[:, None]
    if window > 0:
        hidden |= cols[None, :] <= (pos - window)[:, None]
    scores = scores.masked_fill(hidden[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


def self_check(
    device: torch.device, module_name: str = "transformers.models.qwen3_5.modeling_qwen3_5"
) -> dict:
    """Largest differences of both kernels from the functions they replace (fla's or Transformers' own), on
    random inputs shaped like a decode step with grouped heads and strided inputs; states compared after the
    step."""
    module = importlib.import_module(module_name)
    gen = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    b, h, hv, kd, vd = 5, 2, 6, 128, 128
    mixed = rnd(
        b, 1, 2 * h * kd + hv * vd
    )  # one projection split into q, k, v: strided views, as in the mixer
    q, k, v = (
        x.reshape(b, 1, -1, d) for x, d in zip(mixed.split([h * kd, h * kd, hv * vd], -1), (kd, kd, vd))
    )
    g = -torch.rand(b, 1, hv, generator=gen, device=device)
    beta = torch.rand(b, 1, hv, generator=gen, device=device).to(torch.bfloat16)
    state = rnd(b, hv, kd, vd, dtype=torch.float32)
    rep = hv // h
    want_o, want_s = getattr(module, _RECURRENT)(
        q.repeat_interleave(rep, 2),
        k.repeat_interleave(rep, 2),
        v,
        g=g,
        beta=beta,
        initial_state=state.clone(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    mine = state.clone()
    got_o = gdn_step_(q, k, v, g, beta, mine)

    c, s, kw = 1000, 4, 4
    x = rnd(b, 1, c).transpose(1, 2)
    conv_state, weight, bias = rnd(b, c, s), rnd(c, kw), rnd(c)
    ref_state = conv_state.clone()
    want_c = getattr(module, _CONV)(x, ref_state, weight, bias, "silu")
    got_c = conv_step_(x, conv_state, weight, bias, "silu")
    hq, hkv, length, d = 24, 4, 300, 256  # Qwen3.6's grouping and head size; slots at different positions
    qa = rnd(b, hq, 1, d)
    keys, values = rnd(b, hkv, length, d), rnd(b, hkv, length, d)
    pos = torch.tensor([0, 63, 64, 200, length - 1], device=device)[:b]
    got_a = attention_(qa, keys, values, pos, d**-0.5)
    got_w = attention_(
        qa, keys, values, pos, d**-0.5, window=100
    )  # a sliding layer: slots inside and past it
    want_w = reference_attention(qa, keys, values, pos, d**-0.5, window=100)
    return {
        "attention": (got_a.float() - reference_attention(qa, keys, values, pos, d**-0.5)).abs().max().item(),
        "attention_window": (got_w.float() - want_w).abs().max().item(),
        "recurrent_out": (got_o.float() - want_o.float()).abs().max().item(),
        "recurrent_state": (mine - want_s.float()).abs().max().item(),
        "conv_out": (got_c.float() - want_c.float()).abs().max().item(),
        "conv_state": (conv_state.float() - ref_state.float()).abs().max().item(),
    }


def time_kernels(
    device: torch.device,
    slots: int,
    heads: int = 16,
    value_heads: int = 48,
    dim: int = 128,
    kernel: int = 4,
    repeats: int = 20,
    module_name: str = "transformers.models.qwen3_5.modeling_qwen3_5",
) -> dict:
    """Milliseconds per call of each kernel and of what it replaces (the recurrence then a copy back into the
    state, as the CUDA-graph path needs), for one layer at `slots` slots; the default shape is
    Qwen3.6-27B's."""
    module = importlib.import_module(module_name)
    q = torch.randn(slots, 1, value_heads, dim, device=device, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    g = -torch.rand(slots, 1, value_heads, device=device)
    beta = torch.rand(slots, 1, value_heads, device=device).to(torch.bfloat16)
    state = torch.randn(slots, value_heads, dim, dim, device=device)
    channels = 2 * heads * dim + value_heads * dim
    x = torch.randn(slots, 1, channels, device=device, dtype=torch.bfloat16).transpose(1, 2)
    conv_state = torch.randn(slots, channels, kernel, device=device, dtype=torch.bfloat16)
    weight = torch.randn(channels, kernel, device=device, dtype=torch.bfloat16)

    def original_recurrent():
        _, new = getattr(module, _RECURRENT)(
            q,
            k,
            v,
            g=g,
            beta=beta,
            initial_state=state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        state.copy_(new)

    hq, hkv, length, d = 24, 4, 1537, 256  # attention at 1k tokens into a cache with room for 1.5k
    qa = torch.randn(slots, hq, 1, d, device=device, dtype=torch.bfloat16)
    keys = torch.randn(slots, hkv, length, d, device=device, dtype=torch.bfloat16)
    values = torch.randn_like(keys)
    pos = torch.full((slots,), 1024, device=device)
    mask = (torch.arange(length, device=device)[None, :] <= pos[:, None])[:, None, None, :]

    def grouped_torch_attention():  # what the engine did before: every cached position, masked
        qg = qa.reshape(slots, hkv, hq // hkv, d)
        scores = torch.matmul(qg, keys.transpose(-1, -2)).float().masked_fill(~mask, float("-inf"))
        torch.matmul(torch.softmax(scores, -1).to(values.dtype), values)

    calls = {
        "attention_torch_whole_cache": grouped_torch_attention,
        "attention_kernel": lambda: attention_(qa, keys, values, pos, d**-0.5),
        "recurrent_original_and_copy": original_recurrent,
        "recurrent_in_place": lambda: gdn_step_(q, k, v, g, beta, state),
        "conv_original": lambda: getattr(module, _CONV)(x, conv_state, weight, None, "silu"),
        "conv_in_place": lambda: conv_step_(x, conv_state, weight, None, "silu"),
    }
    out = {name: _ms_per_call(fn, repeats) for name, fn in calls.items()}
    out["state_gb_per_s_in_place"] = 2 * state.nbytes / out["recurrent_in_place"] / 1e6
    before = state.clone()
    want = gdn_step_(q, k, v, g, beta, state)
    for launch in GDN_LAUNCHES:  # the other cuts of the state, timed in the same run as the engine's
        name = f"recurrent_bv{launch.block_v}_w{launch.warps}{'_stream' if launch.stream else ''}"
        mine = before.clone()
        got = gdn_step_(q, k, v, g, beta, mine, launch=launch)
        out[f"max_diff_{name}"] = max(float((got - want).abs().max()), float((mine - state).abs().max()))
        ms = _ms_per_call(lambda cut=launch, s=mine: gdn_step_(q, k, v, g, beta, s, launch=cut), repeats)
        out[f"state_gb_per_s_{name}"] = 2 * state.nbytes / ms / 1e6
    return out


def _ms_per_call(fn, repeats: int) -> float:
    """GPU milliseconds per call of `fn`, after three warm-up calls (compilation included there)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats
