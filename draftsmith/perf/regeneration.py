"""Regeneration throughput: the slot engine's rows at each slot count and kernel variant, its prefill against
the bare forward, and (perf/against_generate.py) against Transformers' generate on the same prompts."""

from __future__ import annotations

import logging
import time

import torch

from draftsmith.core.runtime import sync_device
from draftsmith.engine.engine import PREFILL_TOKENS, Engine, RegenStats
from draftsmith.engine.kernel_checks import self_check
from draftsmith.engine.kernels import available
from draftsmith.perf.against_generate import answer_lengths, greedy_check, same_prompts_rows, timed_engine
from draftsmith.target.fusion import failures as fusion_failures
from draftsmith.target.fusion import fused_modules, kernel_modules
from draftsmith.target.layers import body

log = logging.getLogger(__name__)


def bare_forward_s(model, prompts: list[list[int]]) -> float:
    """Seconds of the decoder stack's forward alone on these prompts (no cache, no LM head: what extraction
    runs, its layer kernels included, also where an engine row ran without them), warm: the same call once
    before the timed one."""
    device = next(model.parameters()).device
    ids = torch.tensor(prompts, device=device)
    with torch.inference_mode(), fused_modules(kernel_modules(model)):
        for _ in range(2):
            sync_device(device)
            t0 = time.perf_counter()
            body(model)(input_ids=ids, use_cache=False)
            sync_device(device)
    return time.perf_counter() - t0


def kernel_check(device: torch.device, *, log=print) -> dict:
    """On a GPU, the in-place decode kernels' largest differences from the functions they replace (the engine
    rows run on them); nothing elsewhere."""
    if not available(device):
        return {}
    check = self_check(device)
    log(
        "in-place decode kernels against the functions they replace, largest differences: "
        f"{ {k: f'{v:.2e}' for k, v in check.items()} }"
    )
    return {"kernel_check": check}


def _engine_figures(engine: Engine, stats: RegenStats, answers: list[list[int]], *, batch: int) -> dict:
    """The row of one timed engine variant, with graph and fused as the engine ran them."""
    device = engine.device
    return {
        "batch": batch,
        "cuda_graph": engine.cuda_graph,
        "fused_kernels": engine.fused,
        "layer_kernels": engine.layer_kernels,
        # a kind of kernel gave up in this process: Transformers' forwards ran instead
        "layer_kernel_failures": fusion_failures(),
        "new_tokens_per_s": stats.new_tokens_per_s,
        "decode_tokens_per_s": stats.decode_tokens_per_s,
        "seconds": stats.seconds,
        "prefill_seconds": stats.prefill_seconds,
        "steps": stats.steps,
        "prefill_tokens_per_s": stats.prefill_tokens / max(stats.prefill_seconds, 1e-9),
        "step_ms": 1e3 * (stats.seconds - stats.prefill_seconds) / max(stats.steps, 1),
        "cache_gb": engine.cache.nbytes() / 1e9,
        "peak_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None,
        "first_answer_head": answers[0][:8],
    }


def _row_again(
    engine: Engine, prompts: list[list[int]], *, lengths: list[int], stats: RegenStats, log
) -> dict:
    """The same prompts on the warm engine: kernels for every group size compiled and tuned."""
    sync_device(engine.device)
    warm = engine.run(prompts, lengths, progress=False)[1]
    log(
        f"engine  batch {engine.slots:4d} again: {warm.new_tokens_per_s:7.0f} new tok/s end to end, "
        f"{warm.decode_tokens_per_s:7.0f} decoding (prefill {warm.prefill_seconds:.1f}s of "
        f"{warm.seconds:.1f}s); first run's {stats.admission_summary()}"
    )
    return {
        "again_new_tokens_per_s": warm.new_tokens_per_s,
        "again_seconds": warm.seconds,
        "again_prefill_seconds": warm.prefill_seconds,
        "again_prefill_tokens_per_s": warm.prefill_tokens / max(warm.prefill_seconds, 1e-9),
    }


def _engine_row(
    model,
    prompts: list[list[int]],
    *,
    batch: int,
    lengths: list[int],
    max_len: int,
    graph: bool,
    fused: bool,
    layer_kernels: bool = True,
    pow2_groups: bool,
    min_refill: int,
    packed: bool = False,
    first_answers: list[list[int]] | None,
    again: bool,
    log,
) -> tuple[dict, list[list[int]] | None]:
    """One engine variant timed: its row and answers, or an error row and None."""
    device = next(model.parameters()).device
    try:
        engine, answers, stats = timed_engine(
            model,
            prompts,
            slots=batch,
            new_tokens=lengths,
            max_len=max_len,
            graph=graph,
            fused=fused,
            layer_kernels=layer_kernels,
            pow2_groups=pow2_groups,
            min_refill=min_refill,
            packed=packed,
        )
    except Exception as e:  # noqa: BLE001 - a failed variant is a figure too; the others still run
        log(f"engine  batch {batch:4d} graph {graph}: FAILED {type(e).__name__}: {e}")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {"batch": batch, "cuda_graph": graph, "error": f"{type(e).__name__}: {e}"}, None
    row = _engine_figures(engine, stats, answers, batch=batch)
    if first_answers is not None:  # graph and kernel variants must decode what the first variant decoded
        row["answers_equal_first"] = sum(a == e for a, e in zip(answers, first_answers)) / len(answers)
    graph, fused = engine.cuda_graph, engine.fused  # off where there is no GPU
    log(
        f"engine  batch {batch:4d} graph {graph!s:5} fused {fused!s:5} "
        f"layer kernels {engine.layer_kernels!s:5}: "
        f"{row['new_tokens_per_s']:7.0f} new "
        f"tok/s end to end, {row['decode_tokens_per_s']:7.0f} decoding ({stats.steps} steps of "
        f"{row['step_ms']:.1f} ms, prefill {stats.prefill_seconds:.1f}s of {stats.seconds:.1f}s, cache "
        f"{row['cache_gb']:.1f} GB, peak {row['peak_gb'] or 0:.1f} GB, first answer starts "
        f"{row['first_answer_head']}"
        + (
            f", answers equal to the first variant's: {row['answers_equal_first']:.0%})"
            if "answers_equal_first" in row
            else ")"
        )
    )
    if again:
        row.update(_row_again(engine, prompts, lengths=lengths, stats=stats, log=log))
    return row, answers


def kernel_variants(
    batch: int, *, plain_layer_batches: tuple[int, ...], unfused_batches: tuple[int, ...]
) -> list[tuple[bool, bool]]:
    """(Triton decode kernels, layer kernels) to time at `batch`: both on, then the A/Bs the flags ask for
    there (Transformers' norms and MLPs; neither)."""
    variants = [(True, True)]
    variants += [(True, False)] if batch in plain_layer_batches else []
    variants += [(False, False)] if batch in unfused_batches else []
    return variants


def engine_rows(
    model,
    prompts: list[list[int]],
    *,
    batch_sizes: list[int],
    waves: int,
    new_tokens: int,
    max_len: int,
    graphs: tuple[bool, ...],
    eager_batches: tuple[int, ...] | None,
    unfused_batches: tuple[int, ...],
    plain_layer_batches: tuple[int, ...] = (),
    spread_engine: bool,
    seed: int,
    pow2_groups: bool,
    min_refill: int,
    packed: bool = False,
    again: bool,
    log=print,
) -> tuple[list[dict], bool]:
    """The engine's rows at each slot count and variant, and whether CUDA graphs held (after a failed capture
    the remaining graph variants are skipped)."""
    device = next(model.parameters()).device
    rows, graph_ok = [], True
    for b in batch_sizes:
        first_answers = None
        timed = [graph for graph in graphs if graph or eager_batches is None or b in eager_batches]
        kernels = kernel_variants(b, plain_layer_batches=plain_layer_batches, unfused_batches=unfused_batches)
        # the unfused A/B runs at every graph setting, the others where eager_batches lets them
        variants = [(graph, f, n) for f, n in kernels for graph in (timed if f else graphs)]
        for graph, fused, layer_kernels in variants:
            if graph and not graph_ok:
                continue
            row, answers = _engine_row(
                model,
                prompts[: b * waves],
                batch=b,
                lengths=answer_lengths(b * waves, new_tokens, spread_engine, seed),
                max_len=max_len,
                graph=graph,
                fused=fused,
                layer_kernels=layer_kernels,
                pow2_groups=pow2_groups,
                min_refill=min_refill,
                packed=packed,
                first_answers=first_answers,
                again=again,
                log=log,
            )
            rows.append(row)
            if answers is None:
                graph_ok = graph_ok and not graph
                continue
            if first_answers is None:
                first_answers = answers
            if device.type == "cuda":
                # the next slot cache is larger; a freed graph pool must not fragment it
                torch.cuda.empty_cache()
    return rows, graph_ok


def prefill_against_bare(model, prompts: list[list[int]], rows: list[dict], *, prompt_len: int, log) -> dict:
    """The bare forward on one prefill group's worth of the same prompts (what the engine prefills at
    once), and each engine row's prefill rate (first run and warm) as a fraction of it: the issue's prefill
    figure."""
    group = min(len(prompts), max(1, PREFILL_TOKENS // prompt_len))
    bare = group * prompt_len / bare_forward_s(model, prompts[:group])
    for row in rows:
        for key in ("prefill_tokens_per_s", "again_prefill_tokens_per_s"):
            if key in row:
                row[key.replace("tokens_per_s", "vs_bare")] = row[key] / bare
        if "prefill_vs_bare" in row:
            warm = row.get("again_prefill_vs_bare")
            log(
                f"prefill at batch {row['batch']} (graph {row['cuda_graph']}): "
                f"{row['prefill_tokens_per_s']:.0f} prompt tok/s, {row['prefill_vs_bare']:.2f} of the bare "
                f"forward's {bare:.0f} on {group} of the same prompts"
                + (f"; warm {warm:.2f} of it" if warm is not None else "")
            )
    return {"bare_prefill_group": group, "bare_prefill_tokens_per_s": bare}


def best_row(rows: list[dict], *, log=print) -> dict | None:
    """The fastest engine row end to end; None when every variant failed."""
    ok = [r for r in rows if "error" not in r]
    best = max(ok, key=lambda r: r["new_tokens_per_s"]) if ok else None
    if best:
        log(
            f"best: {best['new_tokens_per_s']:.0f} new tok/s end to end ({best['decode_tokens_per_s']:.0f} "
            f"decoding) at batch {best['batch']} (graph {best['cuda_graph']}, fused kernels "
            f"{best['fused_kernels']})"
        )
    return best


def random_prompts(n: int, vocab: int, *, prompt_len: int, seed: int) -> list[list[int]]:
    """`n` prompts of random token ids (a random-weight target has no meaningful text)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (prompt_len,), generator=g).tolist() for _ in range(n)]


def bench(
    model,
    vocab: int,
    *,
    batch_sizes: list[int],
    prompt_len: int,
    new_tokens: int,
    waves: int,
    generate_batches: list[int],
    generate_new_tokens: int,
    check_prompts: int,
    check_tokens: int,
    graphs: tuple[bool, ...] = (False,),
    generate_waves: int = 1,
    spread: bool = False,
    unfused_batches: tuple[int, ...] = (),
    plain_layer_batches: tuple[int, ...] = (),
    eager_batches: tuple[int, ...] | None = None,
    seed: int = 0,
    pow2_groups: bool = True,
    min_refill: int = 1,
    packed: bool = False,
    spread_engine: bool = False,
    again: bool = False,
    log=print,
) -> dict:
    """New tokens/s of the engine at each slot count (prompts = slots x waves, fixed answers: EOS off), end to
    end and decoding alone, eager (at `eager_batches` if given) and as a CUDA graph if `graphs` says so; at
    `unfused_batches` without the Triton decode kernels, at `plain_layer_batches` with Transformers' norms and
    MLPs (their A/Bs); then `generate` and the engine on the same prompts at `generate_batches` (see
    same_prompts). `spread_engine`: answers of 1/8 to all of `new_tokens`; `again`: each row rerun warm. Plus
    a greedy agreement check of `check_tokens` tokens against `generate` at batch 1."""
    device = next(model.parameters()).device
    top = max(
        [b * waves for b in batch_sizes] + [b * generate_waves for b in generate_batches] + [check_prompts]
    )
    prompts = random_prompts(top, vocab, prompt_len=prompt_len, seed=seed)
    result: dict = {"prompt_len": prompt_len, "new_tokens": new_tokens, "waves": waves, "engine": []}
    result.update(kernel_check(device, log=log))
    result.update(greedy_check(model, prompts[:check_prompts], check_tokens=check_tokens, log=log))
    if device.type != "cuda":  # CUDA graphs need a GPU: every batch runs eagerly
        graphs, eager_batches = (False,), None
    result["engine"], graph_ok = engine_rows(
        model,
        prompts,
        batch_sizes=batch_sizes,
        waves=waves,
        new_tokens=new_tokens,
        max_len=prompt_len + new_tokens + 1,
        graphs=graphs,
        eager_batches=eager_batches,
        unfused_batches=unfused_batches,
        plain_layer_batches=plain_layer_batches,
        spread_engine=spread_engine,
        seed=seed,
        pow2_groups=pow2_groups,
        min_refill=min_refill,
        packed=packed,
        again=again,
        log=log,
    )
    if device.type == "cuda" and batch_sizes:
        result.update(prefill_against_bare(model, prompts, result["engine"], prompt_len=prompt_len, log=log))
    result["best"] = best_row(result["engine"], log=log)
    result["same_prompts"] = same_prompts_rows(
        model,
        prompts,
        batches=generate_batches,
        waves=generate_waves,
        new_tokens=generate_new_tokens,
        spread=spread,
        seed=seed,
        graph=graphs[-1] and graph_ok,
        log=log,
        pow2_groups=pow2_groups,
        min_refill=min_refill,
        packed=packed,
    )
    return result
