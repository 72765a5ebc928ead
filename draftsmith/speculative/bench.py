"""The bench rule's work on one prompt: the methods, the losslessness check, resuming a part."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from draftsmith.config import content_hash
from draftsmith.core import faults
from draftsmith.core.gpu_pool import acquire
from draftsmith.core.io import tmp_path, write_jsonl
from draftsmith.speculative.bench_parts import (
    append_done,
    file_stamp,
    part_prompts,
    prompt_ids_of,
    resume_partial,
)
from draftsmith.speculative.loop import is_hybrid, speculative_generate
from draftsmith.speculative.proposers import (
    Proposer,
    ShorterBlock,
    fp32_drafter,
    load_block_drafter,
)
from draftsmith.speculative.reference import (
    TargetAnswers,
    check_reference,
    read_reference,
    reference_key,
    target_answers,
)
from draftsmith.speculative.replay import ar_generate, replay, target_hidden, tau
from draftsmith.target.kernels import exact_fp32
from draftsmith.target.load import eos_ids_of, load_configured_target
from draftsmith.target.upcast import fp32_by_layer

# How a record's tau was measured (the report's `acceptance` column)
EXACT_REPLAY = "exact replay"  # temperature 0: the target's greedy continuation, exact for any architecture
REJECTION = "rejection sampling"  # temperature > 0, DFlash: the real loop with z-lab's acceptance rule
NODE_SAMPLES = "target sample per node"  # temperature > 0, DDTree: the real loop walks one sample per node
# temperature > 0 by replay: drafts matched against one sampled continuation; for DDTree the same in
# distribution as a sample per node, for DFlash less than rejection sampling accepts
ONE_SAMPLE = "one sampled continuation"

HYBRID_DDTREE_NOTE = (
    "no wall-clock: hybrid target (Gated DeltaNet layers run a recurrence along the sequence, so a tree "
    "cannot be verified in one forward with an ancestor mask); tau from exact replay"
)


def bench_prompt(
    target: nn.Module,
    drafter: Proposer,
    prompt_ids: Sequence[int],
    taps: list[int],
    bench: dict,
    stop_ids: Sequence[int] = (),
    seed: int = 0,
    reference: TargetAnswers | None = None,
) -> list[dict]:
    """One record per method (and DDTree budget) for one prompt; `bench` is the config's bench section.
    `reference`: the target's answers to it, decoded by a reference job (speculative/reference.py)."""
    methods = bench["methods"]
    temperature = float(bench["temperature"])
    sampled = temperature > 0
    real = bool(bench["real_loop"])
    block = drafter.block_size
    hybrid = is_hybrid(target)
    answers = reference or target_answers(target, prompt_ids, bench, stop_ids=stop_ids, seed=seed)
    if sampled and answers.sampled is None:
        raise ValueError("bench above temperature 0 with target answers that hold no sample (made at 0)")
    greedy = answers.greedy
    continuation = answers.sampled if sampled and answers.sampled is not None else greedy
    tokens = list(prompt_ids) + continuation
    hidden = target_hidden(target, tokens, taps)
    base: dict[str, Any] = {
        "prompt_tokens": len(prompt_ids),
        "new_tokens": len(continuation),
        "block_size": block,
        "temperature": temperature,
        "hybrid": hybrid,
        "ar_seconds": answers.ar_seconds,
        "ar_tokens": len(greedy),
        "dtype": str(next(target.parameters()).dtype).removeprefix("torch."),
    }
    records: list[dict[str, Any]] = []
    if "ar" in methods:
        records.append(
            {
                **base,
                "method": "ar",
                "budget": None,
                "committed": [1] * len(greedy),
                "seconds": answers.ar_seconds,
                "out_tokens": len(greedy),
                "lossless": True,
            }
        )
    runs: list[tuple[str, int | None]] = []
    if "dflash" in methods:
        runs.append(("dflash", None))
    if "ddtree" in methods:
        runs += [("ddtree", int(b)) for b in bench["ddtree_budgets"]]
    for method, budget in runs:
        rec: dict[str, Any] = {**base, "method": method, "budget": budget}
        rec.update(seconds=None, out_tokens=None, lossless=None, split=None, real_committed=None, note=None)
        if sampled and real and not (hybrid and budget is not None):  # the references need the target
            looped = _sampled_loop(
                target, drafter, prompt_ids, taps, budget=budget, bench=bench, stop_ids=stop_ids, seed=seed
            )
            rec.update(looped)
        else:
            committed = replay(drafter, tokens, hidden, len(prompt_ids), budget)
            rec.update(
                committed=committed, tau=tau(committed), acceptance=ONE_SAMPLE if sampled else EXACT_REPLAY
            )
            if real and hybrid and budget is not None:
                rec["note"] = HYBRID_DDTREE_NOTE
            elif real and not sampled:
                rec.update(
                    _greedy_loop(target, drafter, prompt_ids, taps, budget=budget, bench=bench,
                                 stop_ids=stop_ids, greedy=greedy)
                )  # fmt: skip
        records.append(rec)
    return records


def _greedy_loop(
    target: nn.Module,
    drafter: Proposer,
    prompt_ids: Sequence[int],
    taps: list[int],
    *,
    budget: int | None,
    bench: dict,
    stop_ids: Sequence[int],
    greedy: list[int],
) -> dict:
    """The real loop at temperature 0: its wall clock, and whether its output is greedy decoding's."""
    out, committed = speculative_generate(
        target, drafter, prompt_ids, int(bench["max_new_tokens"]), taps, budget, stop_ids, timing=True
    )
    exact = out.tokens == greedy
    diverged = None if exact else divergence(target, prompt_ids, greedy, out.tokens)
    return {
        "seconds": out.seconds,
        "out_tokens": len(out.tokens),
        "split": out.split,
        "real_committed": committed,
        "exact": exact,
        "divergence": diverged,
        "lossless": exact or bool(diverged and diverged["tie"]),
    }


def _sampled_loop(
    target: nn.Module,
    drafter: Proposer,
    prompt_ids: Sequence[int],
    taps: list[int],
    *,
    budget: int | None,
    bench: dict,
    stop_ids: Sequence[int],
    seed: int,
) -> dict:
    """Above temperature 0, as the references measure it, in the real loop: DFlash samples its drafts and
    keeps them by rejection sampling, DDTree walks its tree down one target sample per node; tau from those
    rounds."""
    out, committed = speculative_generate(
        target, drafter, prompt_ids, int(bench["max_new_tokens"]), taps, budget, stop_ids, timing=True,
        temperature=float(bench["temperature"]), generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    return {
        "committed": committed,
        "tau": tau(committed),
        "acceptance": REJECTION if budget is None else NODE_SAMPLES,
        "seconds": out.seconds,
        "out_tokens": len(out.tokens),
        "split": out.split,
        "real_committed": committed,
    }


@torch.inference_mode()
def divergence(target: nn.Module, prompt_ids: Sequence[int], greedy: list[int], spec: list[int]) -> dict:
    """Where the speculative output first leaves greedy decoding, and whether that was a numerical tie.

    In bf16 a block verification and a one-token decode round differently, so two tokens whose logits differ
    by less than the rounding of the logits can swap. That is a tie of the arithmetic, not a bug of the loop;
    a margin above the rounding is a real loss and is reported as one.
    """
    i = next((k for k, (a, b) in enumerate(zip(greedy, spec)) if a != b), min(len(greedy), len(spec)))
    if i >= min(len(greedy), len(spec)):
        return {"index": i, "margin": None, "tolerance": None, "tie": False}  # one stopped early: a real loss
    device = next(target.parameters()).device
    ids = torch.tensor([list(prompt_ids) + greedy[:i]], device=device)
    logits = target(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1].float()
    margin = float(logits[greedy[i]] - logits[spec[i]])
    tol = float(4 * torch.finfo(next(target.parameters()).dtype).eps * logits.abs().max())
    return {"index": i, "margin": margin, "tolerance": tol, "tie": abs(margin) <= tol}


def drafter_taps(drafter_dir: str) -> list[int]:
    cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
    return [int(t) for t in cfg["dflash_config"]["target_layer_ids"]]


def _bench_key(
    target_dir: str,
    drafter_dir: str,
    *,
    prompts_path: str,
    part: int,
    parts: int,
    bench: dict,
    taps: list[int] | None,
    dataset: str,
    target_cfg: dict,
    reference_path: str | None = None,
) -> str:
    """What a partial benchmark file must have been made with to be resumed (a retrained drafter, or target
    answers made again, start it afresh)."""
    d = Path(drafter_dir)
    return content_hash(
        target_dir,
        file_stamp(d / "config.json"),
        file_stamp(d / "model.safetensors"),
        file_stamp(prompts_path),
        *([file_stamp(reference_path)] if reference_path else []),
        part,
        parts,
        bench,
        taps,
        dataset,
        target_cfg,
    )


def run_bench(
    target_dir: str,
    drafter_dir: str,
    *,
    prompts_path: str,
    part: int,
    parts: int,
    out_path: str,
    bench: dict,
    taps: list[int] | None = None,
    dataset: str | None = None,
    gpus: int = 1,
    target_cfg: dict | None = None,
    reference_path: str | None = None,
) -> int:
    """Benchmarks prompts part::parts of a prompt file on one model copy (`gpus` devices from the pool);
    writes one JSON line per record. `reference_path`: the target's answers to the same part, decoded once
    for every drafter (speculative/reference.py); without it each prompt's are decoded here.

    Each finished prompt is appended (and fsynced) to `<out>.partial`, so a killed job's rerun skips the
    prompts it already did; the output appears, complete, by rename at the end.
    """
    dataset = dataset or Path(prompts_path).stem
    mine = part_prompts(prompts_path, bench, part=part, parts=parts)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = tmp_path(out)
    target_cfg = target_cfg or {}
    key = _bench_key(
        target_dir, drafter_dir, prompts_path=prompts_path, part=part, parts=parts, bench=bench, taps=taps,
        dataset=dataset, target_cfg=target_cfg, reference_path=reference_path,
    )  # fmt: skip
    made_with = reference_key(
        target_dir, prompts_path=prompts_path, part=part, parts=parts, bench=bench, dataset=dataset,
        target_cfg=target_cfg,
    )  # fmt: skip
    if reference_path:  # refused before any model loads
        if bench["real_loop"]:
            raise ValueError("bench.real_loop: the real loops are timed against this job's own decode; "
                             "drop --reference")  # fmt: skip
        check_reference(reference_path, key=made_with)
    done = resume_partial(partial, key, count=len(mine))
    todo = [i for i in range(len(mine)) if i not in done]
    models: Models | None = None
    with acquire(gpus if todo else 0) as devices, partial.open("a") as log_f:
        if todo:
            models = load_models(target_dir, drafter_dir, devices=devices, target_cfg=target_cfg, bench=bench)
            ids = [prompt_ids_of(rec, models.tokenizer, bool(bench["thinking"])) for rec in mine]
            answers: Sequence[TargetAnswers | None] = [None] * len(mine)
            if reference_path:
                answers = read_reference(reference_path, key=made_with, prompts=ids)
            taps = taps or drafter_taps(drafter_dir)
            done.update(
                _bench_todo(models, mine, ids, answers, todo, log_f, taps=taps, bench=bench, dataset=dataset,
                            part=part, parts=parts)
            )  # fmt: skip
        rows = [r for i in sorted(done) for r in done[i]]
        check = functools.partial(
            fp32_check, target_dir, drafter_dir, mine, dataset=dataset, part=part, parts=parts, rows=rows,
            gpus=gpus, target_cfg=target_cfg, bench=bench, taps=taps or drafter_taps(drafter_dir),
        )  # fmt: skip
        if models is not None:  # on the devices held now, before they go back to the pool
            rows += check(loaded=models)
    if models is None:  # a rerun that found every prompt done: the check takes devices of its own
        rows += check()
    write_jsonl(out, rows, tmp=out.with_name(out.name + ".tmp"))  # tmp_path(out) holds the progress
    partial.unlink()
    return len(rows)


def _bench_todo(
    models: Models,
    mine: list[dict],
    ids: list[list[int]],
    answers: Sequence[TargetAnswers | None],
    todo: list[int],
    log_f: TextIO,
    *,
    taps: list[int],
    bench: dict,
    dataset: str,
    part: int,
    parts: int,
) -> dict[int, list[dict]]:
    """The prompts not done yet, each appended to the partial file as it ends; the warm-up first."""
    from tqdm import tqdm

    for w in range(int(bench["warmup"])):  # compile kernels, warm allocators
        _bench_with(models, ids[todo[0]], taps=taps, bench=bench, seed=w, reference=answers[todo[0]])
    done = {}
    for n, i in enumerate(tqdm(todo, desc=f"bench {dataset} part {part}", unit="prompt"), 1):
        seed = part + i * parts
        got = _bench_with(models, ids[i], taps=taps, bench=bench, seed=seed, reference=answers[i])
        done[i] = [{"dataset": dataset, "id": str(mine[i].get("id", seed)), **r} for r in got]
        append_done(log_f, i, done[i])
        faults.pause(f"bench:{n}")  # a drill: killed here, the rerun starts at the next prompt
    return done


def fp32_check(
    target_dir: str,
    drafter_dir: str,
    prompts: list[dict],
    *,
    dataset: str,
    part: int,
    parts: int,
    rows: list[dict],
    gpus: int,
    target_cfg: dict,
    bench: dict,
    taps: list[int],
    loaded: Models | None = None,
) -> list[dict]:
    """The first `bench.fp32_check_prompts` prompts again with target and drafter in fp32: there the real
    DFlash loop must equal greedy decoding exactly, so a difference is a bug, not bf16 rounding. One record
    each (`check: fp32`). Nothing to do where the bench ran in fp32 already, or without the real loop.

    `loaded` (the bench's models, still on their devices) are used where they are; only a rerun that found
    every prompt done reads the models from disk again. The target stays in its dtype and computes in fp32 a
    layer at a time (`fp32_by_layer`): the 27B in fp32 would not fit a 96 GB card."""
    count = min(int(bench["fp32_check_prompts"]), len(prompts))
    ran_fp32 = all(r.get("dtype") == "float32" for r in rows)
    if not count or ran_fp32 or not bench["real_loop"] or float(bench["temperature"]) > 0:
        return []
    if loaded is not None:
        return _check_in_fp32(loaded, prompts[:count], dataset=dataset, part=part, parts=parts, bench=bench,
                              taps=taps)  # fmt: skip
    with acquire(gpus) as devices:
        models = load_models(target_dir, drafter_dir, devices=devices, target_cfg=target_cfg, bench=bench)
        return _check_in_fp32(
            models, prompts[:count], dataset=dataset, part=part, parts=parts, bench=bench, taps=taps
        )


def _check_in_fp32(
    models: Models, prompts: list[dict], *, dataset: str, part: int, parts: int, bench: dict, taps: list[int]
) -> list[dict]:
    """`checks_in_fp32` on the prompts, one `check: fp32` record each."""
    thinking = bool(bench["thinking"])
    ids = [prompt_ids_of(rec, models.tokenizer, thinking) for rec in prompts]
    stop = models.stop_ids
    results = checks_in_fp32(models.target, models.drafter, ids, taps=taps, bench=bench, stop_ids=stop)
    return [
        {"dataset": dataset, "id": str(rec.get("id", part + i * parts)), "check": "fp32", "method": "dflash",
         "dtype": "float32", **result}
        for i, (rec, result) in enumerate(zip(prompts, results, strict=True))
    ]  # fmt: skip


def checks_in_fp32(
    target: nn.Module,
    drafter: Proposer,
    prompts: list[list[int]],
    *,
    taps: list[int],
    bench: dict,
    stop_ids: list[int],
) -> list[dict]:
    """The real DFlash loop against greedy decoding in fp32, `exact` and `divergence` a prompt: the target a
    layer at a time from its own weights, the drafter cast. No tf32 anywhere: on fla's kernels, which round to
    tf32 inside, a 16-layer target of the 27B width parted from greedy decoding at a logit margin of 6e-3
    (docs/measurements.md)."""
    results = []
    with exact_fp32(), fp32_by_layer(target) as exact_target:
        exact_drafter = fp32_drafter(drafter, bench, target=exact_target)
        for ids in prompts:
            greedy = ar_generate(exact_target, ids, int(bench["max_new_tokens"]), stop_ids)
            real = _greedy_loop(exact_target, exact_drafter, ids, taps, budget=None, bench=bench,
                                stop_ids=stop_ids, greedy=greedy.tokens)  # fmt: skip
            results.append({"exact": real["exact"], "divergence": real["divergence"]})
    return results


@dataclass
class Models:
    """A loaded target and drafter, with what benchmarking a prompt on them needs."""

    target: nn.Module
    tokenizer: PreTrainedTokenizerBase
    drafter: Proposer
    stop_ids: list[int]


def load_models(target_dir: str, drafter_dir: str, *, devices: list, target_cfg: dict, bench: dict) -> Models:
    """The target on the pool's devices and the drafter beside it, cut to bench.block_size when that is
    set."""
    # exact: on the CPU the bench runs in fp32, so that its real loop is checked against greedy bit for bit
    target, tokenizer, device = load_configured_target(target_dir, devices, target_cfg, exact=True)
    drafter: Proposer = load_block_drafter(drafter_dir, target_dir, device, next(target.parameters()).dtype)
    if bench["block_size"]:
        drafter = ShorterBlock(drafter, int(bench["block_size"]))
    return Models(target=target, tokenizer=tokenizer, drafter=drafter, stop_ids=eos_ids_of(target, tokenizer))


def _bench_with(
    models: Models,
    prompt_ids: list[int],
    *,
    taps: list[int],
    bench: dict,
    seed: int,
    reference: TargetAnswers | None = None,
) -> list[dict]:
    """`bench_prompt` on the loaded models: the warm-up and the measured prompts make the same call."""
    return bench_prompt(
        models.target,
        models.drafter,
        prompt_ids=prompt_ids,
        taps=taps,
        bench=bench,
        stop_ids=models.stop_ids,
        seed=seed,
        reference=reference,
    )
