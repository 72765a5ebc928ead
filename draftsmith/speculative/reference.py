"""The target's own answers to the bench prompts, decoded once for every drafter benched on them.

A bench prompt's tau replays the drafter's blocks against the target's greedy answer (and, above temperature
0, one seeded sample). That answer does not depend on the drafter, and at batch 1 it is most of what a
tau-only prompt costs: one forward a token. When the bench runs no real loop (`bench.real_loop: false`), a
reference job decodes each part's answers once, while the drafters still train, and every drafter's bench job
(the run's own, a study's sizes) reads them. A real loop is timed against an autoregressive decode in its own
job, on the same GPU share, so with real loops each bench job decodes its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from draftsmith.config import BENCH_REFERENCE_KEYS, content_hash
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
from draftsmith.speculative.replay import ar_generate
from draftsmith.target.load import eos_ids_of, load_configured_target


@dataclass
class TargetAnswers:
    """The target's answer to one prompt: greedy (timed), and a seeded sample above temperature 0."""

    greedy: list[int]
    ar_seconds: float
    sampled: list[int] | None = None


def target_answers(
    target: nn.Module, prompt_ids: Sequence[int], bench: dict, *, stop_ids: Sequence[int], seed: int
) -> TargetAnswers:
    """The greedy answer, then (temperature > 0) the sample drawn with a CPU generator seeded by `seed`."""
    max_new = int(bench["max_new_tokens"])
    temperature = float(bench["temperature"])
    greedy = ar_generate(target, prompt_ids, max_new, stop_ids)
    sampled = None
    if temperature > 0:
        gen = torch.Generator().manual_seed(seed)
        sampled = ar_generate(target, prompt_ids, max_new, stop_ids, temperature, gen).tokens
    return TargetAnswers(greedy=greedy.tokens, ar_seconds=greedy.seconds, sampled=sampled)


def reference_key(
    target_dir: str, *, prompts_path: str, part: int, parts: int, bench: dict, dataset: str, target_cfg: dict
) -> str:
    """What a reference (or its partial file) was made with; a bench job refuses one made otherwise. The
    target is named as the config names it: a hub id resolves to a cache path that may differ between jobs."""
    settings = {k: bench[k] for k in BENCH_REFERENCE_KEYS}
    target = target_cfg.get("model") or target_dir
    return content_hash(
        "reference", target, file_stamp(prompts_path), part, parts, settings, dataset, target_cfg
    )


def run_reference(
    target_dir: str,
    *,
    prompts_path: str,
    part: int,
    parts: int,
    out_path: str,
    bench: dict,
    dataset: str,
    gpus: int = 1,
    target_cfg: dict | None = None,
) -> int:
    """The target's answers to prompts part::parts, one JSON line a prompt after a header with the key.

    Resumable as a bench job is: each answered prompt is appended to `<out>.partial` first."""
    from tqdm import tqdm

    target_cfg = target_cfg or {}
    mine = part_prompts(prompts_path, bench, part=part, parts=parts)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = tmp_path(out)
    key = reference_key(
        target_dir, prompts_path=prompts_path, part=part, parts=parts, bench=bench, dataset=dataset,
        target_cfg=target_cfg,
    )  # fmt: skip
    done = resume_partial(partial, key, count=len(mine))
    todo = [i for i in range(len(mine)) if i not in done]
    with acquire(gpus if todo else 0) as devices, partial.open("a") as log_f:
        if todo:
            target, tokenizer, _ = load_configured_target(target_dir, devices, target_cfg, exact=True)
            stop_ids = eos_ids_of(target, tokenizer)
            thinking = bool(bench["thinking"])
            first = prompt_ids_of(mine[todo[0]], tokenizer, thinking)
            for w in range(int(bench["warmup"])):  # as a bench job warms up, so that ar_seconds is warm
                target_answers(target, first, bench, stop_ids=stop_ids, seed=w)
            for n, i in enumerate(tqdm(todo, desc=f"reference {dataset} part {part}", unit="prompt"), 1):
                ids = prompt_ids_of(mine[i], tokenizer, thinking)
                answers = target_answers(target, ids, bench, stop_ids=stop_ids, seed=part + i * parts)
                done[i] = [{"prompt_ids": list(ids), **asdict(answers)}]
                append_done(log_f, i, done[i])
                faults.pause(f"reference:{n}")  # a drill: killed here, the rerun starts at the next prompt
    rows = [{"key": key}] + [{"index": i, **done[i][0]} for i in sorted(done)]
    write_jsonl(out, rows, tmp=out.with_name(out.name + ".tmp"))
    partial.unlink()
    return len(rows) - 1


def check_reference(path: str | Path, *, key: str) -> None:
    """Refuses a reference made with other settings, from its first line: before a bench job loads a model."""
    with open(path) as f:
        first = f.readline()
    if (json.loads(first) if first.strip() else {}).get("key") != key:
        raise ValueError(
            f"{path}: the target's answers were made for another target, prompt file or bench setting than "
            "this bench job's; delete the file and rerun, and its rule makes them again"
        )


def read_reference(path: str | Path, *, key: str, prompts: Sequence[Sequence[int]]) -> list[TargetAnswers]:
    """A reference's answers, checked against the bench job's own prompts: same settings, same tokens."""
    check_reference(path, key=key)
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()[1:]]
    if len(rows) != len(prompts):
        raise ValueError(f"{path}: {len(rows)} answers for {len(prompts)} prompts; delete the file and rerun")
    for row, ids in zip(rows, prompts):
        if row["prompt_ids"] != list(ids):
            raise ValueError(
                f"{path}: prompt {row['index']} was tokenized otherwise than in this bench job (another "
                "tokenizer or chat template); delete the file and rerun"
            )
    return [TargetAnswers(greedy=r["greedy"], ar_seconds=r["ar_seconds"], sampled=r["sampled"]) for r in rows]
