"""The slot engine against Transformers' `generate` on the same prompts and answer lengths, and its greedy
answers against generate's: the comparisons the regeneration benchmark prints."""

from __future__ import annotations

import time

import numpy as np
import torch

from draftsmith.core.runtime import sync_device
from draftsmith.engine.engine import Engine, RegenStats, left_pad


@torch.inference_mode()
def hf_generate(
    model, prompts: list[list[int]], new_tokens: int, pad_id: int = 0
) -> tuple[list[list[int]], float]:
    """Transformers' greedy `generate` on one left-padded batch (no EOS): answers and seconds."""
    device = next(model.parameters()).device
    ids, att = left_pad(prompts, pad_id)
    sync_device(device)
    t0 = time.perf_counter()
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=att.to(device),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=pad_id,
    )
    sync_device(device)
    return out[:, ids.shape[1] :].tolist(), time.perf_counter() - t0


def answer_lengths(n: int, longest: int, spread: bool, seed: int = 0) -> list[int]:
    """Every answer `longest` tokens, or (spread) lengths drawn uniformly from longest/8 to longest: a
    random-weight target never says EOS, so this stands in for answers that end at different times."""
    if not spread:
        return [longest] * n
    g = torch.Generator().manual_seed(seed)
    return torch.randint(max(1, longest // 8), longest + 1, (n,), generator=g).tolist()


def timed_engine(
    model,
    prompts: list[list[int]],
    *,
    slots: int,
    new_tokens: int | list[int],
    max_len: int,
    graph: bool,
    fused: bool = True,
    pow2_groups: bool = True,
    min_refill: int = 1,
    packed: bool = False,
    layer_kernels: bool = True,
) -> tuple[Engine, list[list[int]], RegenStats]:
    """One engine run after a one-prompt warm-up (kernels, autotuning, allocator, graph capture)."""
    device = next(model.parameters()).device
    engine = Engine(
        model,
        slots=slots,
        max_len=max_len,
        eos_ids=[],
        sync_every=8,
        cuda_graph=graph,
        fused_kernels=fused,
        pow2_groups=pow2_groups,
        min_refill=min_refill,
        packed=packed,
        layer_kernels=layer_kernels,
    )
    engine.run(prompts[:1], 8, progress=False)  # every step runs all slots, so this warms the full batch
    sync_device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    answers, stats = engine.run(prompts, new_tokens, progress=False)
    sync_device(device)
    return engine, answers, stats


def _time_generate(model, prompts: list[list[int]], *, batch: int, lengths: list[int]) -> tuple[float, float]:
    """Seconds of `generate` over all batches, and of one-token runs of the same batches: their prefill."""
    hf_generate(model, prompts[:batch], 2)  # warm-up
    gen_s = gen_prefill_s = 0.0
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        gen_prefill_s += hf_generate(model, group, 1)[1]
        gen_s += hf_generate(model, group, max(lengths[i : i + batch]))[1]
    return gen_s, gen_prefill_s


def _generate_row(model, prompts: list[list[int]], *, batch: int, lengths: list[int], log) -> dict:
    """`generate` on the prompts `batch` at a time: end to end, a step, and decoding alone."""
    device = next(model.parameters()).device
    row: dict = {"batch": batch, "prompts": len(prompts), "longest": max(lengths), "new_tokens": sum(lengths)}
    try:
        gen_s, gen_prefill_s = _time_generate(model, prompts, batch=batch, lengths=lengths)
    except torch.OutOfMemoryError as e:
        row["generate_error"] = f"OutOfMemoryError: {str(e).splitlines()[0]}"
        log(f"same prompts, batch {batch}: generate ran out of memory")
        return row
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    steps = sum(max(lengths[i : i + batch]) - 1 for i in range(0, len(prompts), batch))
    row.update(
        generate_seconds=gen_s,
        generate_tokens_per_s=row["new_tokens"] / gen_s,
        generate_step_ms=1e3 * (gen_s - gen_prefill_s) / max(steps, 1),
        generate_decode_tokens_per_s=(row["new_tokens"] - len(prompts)) / max(gen_s - gen_prefill_s, 1e-9),
    )
    log(
        f"same prompts, batch {batch}: generate {row['generate_tokens_per_s']:.0f} new tok/s end to end "
        f"({gen_s:.1f}s, {row['generate_step_ms']:.0f} ms a step), {row['generate_decode_tokens_per_s']:.0f} "
        "decoding"
    )
    return row


def _same_prompts_again(
    engine: Engine, prompts: list[list[int]], *, lengths: list[int], generate_rate: float, log
) -> dict:
    """The same prompts again on the same engine: what a long job sees once every kernel is compiled and
    tuned."""
    sync_device(engine.device)
    again = engine.run(prompts, lengths, progress=False)[1]
    row = {
        "engine_again_seconds": again.seconds,
        "engine_again_prefill_seconds": again.prefill_seconds,
        "engine_again_tokens_per_s": again.new_tokens_per_s,
        "ratio_again": again.new_tokens_per_s / generate_rate,
    }
    log(
        f"engine again on the same prompts: {again.new_tokens_per_s:.0f} new tok/s ({again.seconds:.1f}s, "
        f"{again.prefill_seconds:.1f}s of it prefill): {row['ratio_again']:.1f}x generate; "
        f"{again.admission_summary()}"
    )
    return row


def same_prompts(
    model,
    prompts: list[list[int]],
    *,
    batch: int,
    lengths: list[int],
    graph: bool,
    log=print,
    pow2_groups: bool = True,
    min_refill: int = 1,
    packed: bool = False,
) -> dict:
    """`generate` and the engine on the same prompts and answer lengths at the same batch size.

    `generate` takes the prompts `batch` at a time and runs each batch until its longest answer is done (what
    it does with EOS on: finished rows keep decoding padding); only the `lengths` count as new tokens. The
    engine gets them all through `batch` slots. Decode-only rates subtract each side's prefill (`generate`: a
    one-token run of the same batch).
    """
    device = next(model.parameters()).device
    row = _generate_row(model, prompts, batch=batch, lengths=lengths, log=log)
    if "generate_error" in row:
        return row
    gen_s = row["generate_seconds"]
    max_len = len(prompts[0]) + max(lengths) + 1
    engine, _, stats = timed_engine(
        model,
        prompts,
        slots=batch,
        new_tokens=lengths,
        max_len=max_len,
        graph=graph,
        pow2_groups=pow2_groups,
        min_refill=min_refill,
        packed=packed,
    )
    row.update(
        cuda_graph=engine.cuda_graph,
        pow2_groups=pow2_groups,
        min_refill=min_refill,
        packed=packed,
        engine_seconds=stats.seconds,
        engine_prefill_seconds=stats.prefill_seconds,
        engine_tokens_per_s=stats.new_tokens_per_s,
        engine_decode_tokens_per_s=stats.decode_tokens_per_s,
        ratio=stats.new_tokens_per_s / row["generate_tokens_per_s"],
        decode_ratio=stats.decode_tokens_per_s / row["generate_decode_tokens_per_s"],
    )
    log(
        f"same {len(prompts)} prompts at batch {batch}, answers of {min(lengths)}-{max(lengths)} tokens "
        f"({row['new_tokens']} in all), prefill included: generate {row['generate_tokens_per_s']:.0f} new "
        f"tok/s ({gen_s:.1f}s, {row['generate_step_ms']:.0f} ms a step), engine "
        f"{row['engine_tokens_per_s']:.0f} ({stats.seconds:.1f}s, {stats.prefill_seconds:.1f}s of it "
        f"prefill, graph {row['cuda_graph']}, powers of two {pow2_groups}, min refill {min_refill}): "
        f"{row['ratio']:.1f}x; "
        f"decoding alone: generate {row['generate_decode_tokens_per_s']:.0f}, engine "
        f"{row['engine_decode_tokens_per_s']:.0f}: {row['decode_ratio']:.1f}x"
    )
    log(f"engine, {stats.admission_summary()}")
    row.update(
        _same_prompts_again(
            engine, prompts, lengths=lengths, generate_rate=row["generate_tokens_per_s"], log=log
        )
    )
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def same_prompts_rows(
    model,
    prompts: list[list[int]],
    *,
    batches: list[int],
    waves: int,
    new_tokens: int,
    spread: bool,
    seed: int,
    graph: bool,
    log=print,
    **engine_kw,
) -> list[dict]:
    """same_prompts at each of `batches` (`waves` batches of prompts each)."""
    rows = []
    for b in batches:
        n = b * waves
        lengths = answer_lengths(n, new_tokens, spread, seed)
        rows.append(
            same_prompts(model, prompts[:n], batch=b, lengths=lengths, graph=graph, log=log, **engine_kw)
        )
    return rows


def greedy_check(model, prompts: list[list[int]], *, check_tokens: int, log=print) -> dict:
    """How many tokens the engine's greedy answers share with `generate`'s at batch 1, and generate's top-1
    minus top-2 logit where they first differ: a difference at a near-tie is rounding, not a bug."""
    device = next(model.parameters()).device
    agree, margins, typical = [], [], []
    for p in prompts:
        ids = torch.as_tensor([p], device=device)
        ref = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=check_tokens,
            min_new_tokens=check_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
        want = ref.sequences[0, len(p) :].tolist()
        top2 = torch.stack(
            [x[0].float().topk(2).values for x in ref.scores]
        )  # generate's own logits per step
        gap = (top2[:, 0] - top2[:, 1]).tolist()
        got, _ = Engine(model, slots=1, max_len=len(p) + check_tokens + 1, eos_ids=[]).run(
            [p], check_tokens, progress=False
        )
        same = next((i for i, (a, b) in enumerate(zip(want, got[0])) if a != b), len(got[0]))
        agree.append(same)
        margins.append(gap[same] if same < len(gap) else None)
        typical.append(float(np.median(gap)))
    log(
        f"greedy check, first {check_tokens} tokens vs generate at batch 1: tokens equal before the first "
        f"difference per prompt {agree}; generate's top-1 minus top-2 logit there "
        f"{[None if m is None else round(m, 4) for m in margins]} (median over its steps "
        f"{[round(m, 4) for m in typical]}: a difference at a near-tie is rounding, not a bug)"
    )
    return {
        "greedy_agreement": agree,
        "greedy_margin_at_difference": margins,
        "greedy_median_margin": typical,
    }
