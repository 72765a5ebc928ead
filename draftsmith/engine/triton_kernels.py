"""The Triton sources of the in-place decode kernels (Gated DeltaNet step, causal convolution step,
attention).

Kept apart from their torch wrappers in engine/kernels.py, which size the launches and decide when they apply.
`_kernels()` compiles them on first use: Triton is only there on GPU machines.
"""

from __future__ import annotations

import functools


@functools.cache
def _kernels():
    """Compiled lazily: Triton is only there on GPU machines."""
    import triton
    import triton.language as tl

    @triton.jit
    def gdn_step(
        q,
        k,
        v,
        g,
        beta,
        state,
        out,
        sq_b,
        sq_h,
        sk_b,
        sk_h,
        sv_b,
        sv_h,
        sg_b,
        sbeta_b,
        scale,
        HV: tl.constexpr,
        GROUP: tl.constexpr,
        K: tl.constexpr,
        V: tl.constexpr,
        BK: tl.constexpr,
        BV: tl.constexpr,
        L2NORM: tl.constexpr,
        STREAM: tl.constexpr,
    ):
        # one program: one (slot, value head) and BV columns of its [K, V] state; neighbouring programs take
        # neighbouring columns, so together they stream whole rows (other orders ran at a third of the
        # bandwidth)
        pid = tl.program_id(0).to(tl.int64)
        NV: tl.constexpr = (V + BV - 1) // BV
        i_bh, i_v = pid // NV, pid % NV
        i_b, i_hv = i_bh // HV, i_bh % HV
        i_h = i_hv // GROUP  # the query/key head this value head reads
        ok = tl.arange(0, BK)
        ov = i_v * BV + tl.arange(0, BV)
        mk, mv = ok < K, ov < V
        b_q = tl.load(q + i_b * sq_b + i_h * sq_h + ok, mask=mk, other=0).to(tl.float32)
        b_k = tl.load(k + i_b * sk_b + i_h * sk_h + ok, mask=mk, other=0).to(tl.float32)
        if L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        b_v = tl.load(v + i_b * sv_b + i_hv * sv_h + ov, mask=mv, other=0).to(tl.float32)
        decay = tl.exp(tl.load(g + i_b * sg_b + i_hv).to(tl.float32))
        b_beta = tl.load(beta + i_b * sbeta_b + i_hv).to(tl.float32)
        p_s = state + i_bh * K * V + ok[:, None] * V + ov[None, :]
        m_s = mk[:, None] & mv[None, :]
        if STREAM:  # each state is read and written once a step: keep it from evicting what is reused
            b_s = tl.load(p_s, mask=m_s, other=0, eviction_policy="evict_first")
        else:
            b_s = tl.load(p_s, mask=m_s, other=0)
        b_s = b_s * decay  # decay the memory, then write the delta-rule correction
        delta = b_beta * (b_v - tl.sum(b_s * b_k[:, None], 0))
        b_s = b_s + b_k[:, None] * delta[None, :]
        b_o = tl.sum(b_s * b_q[:, None], 0)
        tl.store(out + i_bh * V + ov, b_o.to(out.dtype.element_ty), mask=mv)
        if STREAM:
            tl.store(p_s, b_s, mask=m_s, cache_modifier=".cs")
        else:
            tl.store(p_s, b_s, mask=m_s)

    @triton.jit
    def conv_step(
        x,
        state,
        w,
        bias,
        out,
        sx_b,
        sx_c,
        ss_b,
        ss_c,
        C,
        S: tl.constexpr,
        KW: tl.constexpr,
        BC: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        SILU: tl.constexpr,
    ):
        # one program: BC channels of one slot; each channel belongs to one thread, so the shift below (store
        # at t-1 after the load at t) never races with another thread's load
        i_b = tl.program_id(0).to(tl.int64)
        oc = tl.program_id(1) * BC + tl.arange(0, BC)
        m = oc < C
        b_x = tl.load(x + i_b * sx_b + oc * sx_c, mask=m, other=0)
        acc = tl.zeros([BC], dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(bias + oc, mask=m, other=0).to(tl.float32)
        p_s = state + i_b * ss_b + oc * ss_c
        for t in tl.static_range(S + 1):  # the window is the S states then the new input
            if t < S:
                val = tl.load(p_s + t, mask=m, other=0)
            else:
                val = b_x.to(state.dtype.element_ty)
            if t >= S + 1 - KW:
                acc += tl.load(w + oc * KW + (t - (S + 1 - KW)), mask=m, other=0).to(tl.float32) * val.to(
                    tl.float32
                )
            if t >= 1:
                tl.store(p_s + (t - 1), val, mask=m)
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out + i_b * C + oc, acc.to(out.dtype.element_ty), mask=m)

    @triton.jit
    def attend(
        q,
        k,
        v,
        pos,
        out,
        sq_b,
        sq_h,
        sk_b,
        sk_h,
        sk_l,
        sv_b,
        sv_h,
        sv_l,
        so_b,
        so_h,
        scale,
        window,
        HKV: tl.constexpr,
        GROUP: tl.constexpr,
        GP: tl.constexpr,
        D: tl.constexpr,
        BN: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        # one program: one slot's query heads that share a key/value head, against that slot's first pos+1
        # keys (only the last `window` of them: a sliding layer; the wrapper passes more than the cache holds
        # otherwise)
        pid = tl.program_id(0)
        i_b, i_h = pid // HKV, pid % HKV
        n = (
            tl.sum(tl.load(pos + i_b + tl.arange(0, 1))).to(tl.int32) + 1
        )  # a 0-d value, also for the interpreter
        lo = tl.maximum(n - window, 0)
        og, od, on = tl.arange(0, GP), tl.arange(0, D), tl.arange(0, BN)
        heads = i_h * GROUP + og
        b_q = tl.load(
            q + i_b * sq_b + heads[:, None] * sq_h + od[None, :], mask=(og < GROUP)[:, None], other=0
        )
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        p_k = k + i_b.to(tl.int64) * sk_b + i_h * sk_h
        p_v = v + i_b.to(tl.int64) * sv_b + i_h * sv_h
        for start in range(lo, n, BN):  # online softmax over blocks of keys
            cols = start + on
            live = cols < n
            b_k = tl.load(p_k + cols[:, None] * sk_l + od[None, :], mask=live[:, None], other=0)
            s = tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION) * scale
            s = tl.where(live[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            b_v = tl.load(p_v + cols[:, None] * sv_l + od[None, :], mask=live[:, None], other=0)
            acc = acc * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v, input_precision=PRECISION)
            m_i = m_new
        b_o = acc / l_i[:, None]
        tl.store(
            out + i_b * so_b + heads[:, None] * so_h + od[None, :],
            b_o.to(out.dtype.element_ty),
            mask=(og < GROUP)[:, None],
        )

    return gdn_step, conv_step, attend
