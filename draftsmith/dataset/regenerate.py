"""Regenerating each sample's last assistant turn with the target, and the answer cache that keeps them."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from draftsmith.config import content_hash
from draftsmith.core.gpu_memory import job_memory
from draftsmith.core.io import write_json, write_parquet
from draftsmith.engine.engine import Engine, RegenStats
from draftsmith.engine.memory import plan_slots
from draftsmith.plan.data import answer_files, answer_settings, decoding_settings
from draftsmith.target.load import eos_ids_of

log = logging.getLogger(__name__)


def regenerate(
    model,
    tokenizer,
    samples: pd.DataFrame,
    max_new_tokens: int,
    temperature: float,
    max_length: int,
    slots: int,
    seed: int,
    top_p: float = 1.0,
    sync_every: int = 8,
    cuda_graph: bool = True,
    min_refill: int = 1,
) -> tuple[pd.DataFrame, RegenStats]:
    """Replaces each last assistant turn with the target's own answer (drafters learn the target, not the
    data)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = [list(map(int, ids[:pl])) for ids, pl in zip(samples["input_ids"], samples["prompt_len"])]
    longest = max((len(p) for p in prompts), default=1)
    max_len = min(max_length, longest + max_new_tokens) + 1
    slots = max(1, min(slots, len(prompts)))
    device = next(model.parameters()).device
    if device.type == "cuda":  # slots are preallocated: size them to the memory left beside the weights
        torch.cuda.empty_cache()
        free, _ = job_memory(device)  # its share of a GPU other jobs use too, under `gpu_memory`
        slots = plan_slots(model, slots, max_len, pad, free)
    engine = Engine(
        model,
        slots=slots,
        max_len=max_len,
        eos_ids=eos_ids_of(model, tokenizer),
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        sync_every=sync_every,
        pad_id=pad,
        cuda_graph=cuda_graph,
        min_refill=min_refill,
    )
    answers, stats = engine.run(prompts, max_new_tokens)
    log.info("regenerated %s; %s", stats.summary(), stats.admission_summary())
    new_ids, new_mask = [], []
    for k, (p, resp) in enumerate(zip(prompts, answers)):
        old_mask = np.asarray(samples["loss_mask"].iloc[k][: len(p)], dtype=np.uint8)
        new_ids.append(np.asarray(p + resp, dtype=np.int32)[:max_length])
        new_mask.append(np.concatenate([old_mask, np.ones(len(resp), dtype=np.uint8)])[:max_length])
    out = samples.copy()
    out["input_ids"] = new_ids
    out["loss_mask"] = new_mask
    out["num_tokens"] = [len(x) for x in new_ids]
    return out, stats


def cache_key(target: dict, regen: dict, max_length: int, samples: pd.DataFrame) -> str:
    """What the answers depend on: the target, the decoding settings and the prompts. Not the slot count or
    the sync interval, which change speed only, so a retry with fewer slots still reuses them."""
    decoding = decoding_settings(regen)
    prompts = [
        np.asarray(ids[:pl]).tobytes().hex() for ids, pl in zip(samples["input_ids"], samples["prompt_len"])
    ]
    return content_hash(target, decoding, max_length, samples["id"].tolist(), prompts)


def regenerate_cached(
    model,
    tokenizer,
    samples: pd.DataFrame,
    cache: Path,
    key: str,
    *,
    elsewhere: Callable[[], pd.DataFrame | None] | None = None,
    settings: str | None = None,
    **kwargs,
) -> tuple[pd.DataFrame, RegenStats | None]:
    """`regenerate`, with the answers kept in `cache` (a parquet file and its key beside it): a rerun of the
    job (a retry after running out of memory in extraction, a killed job, new taps or storage) reuses them
    instead of decoding for hours again. `elsewhere` looks for them in the run's other answer files before
    anything is decoded, and only the samples none of them answers are decoded. Stats are None when every
    answer was reused, else they count the decoded ones. `settings` (`answer_settings`) goes
    into the stamp: the plan reads it to leave the answers it will reuse out of regeneration's hours."""
    found, complete = cached_answers(samples, cache, key, elsewhere=elsewhere)
    if complete and found is not None:
        log.info(
            "regeneration: reusing %d answers from %s (same target, settings and prompts)", len(found), cache
        )
        return found, None
    rest = samples if found is None else samples[~samples["id"].isin(found["id"])].reset_index(drop=True)
    stats = None
    if len(rest) or found is None:  # only the prompts no file answers: a grown data set decodes its new ones
        out, stats = regenerate(model, tokenizer, rest, **kwargs)
        if found is not None:
            log.info("regeneration: %d answers reused, %d decoded", len(found), len(rest))
            out = pd.concat([found, out]).set_index("id", drop=False)
            out = out.loc[samples["id"].tolist()].reset_index(drop=True)
    else:
        out = found
    write_parquet(out, cache)
    write_json(cache.with_suffix(".json"), {"key": key, "answers": len(out), "settings": settings})
    return out, stats


def cached_answers(
    samples: pd.DataFrame,
    cache: Path,
    key: str,
    *,
    elsewhere: Callable[[], pd.DataFrame | None] | None = None,
) -> tuple[pd.DataFrame | None, bool]:
    """The answers a job finds before it decodes: every one in its own `cache` under `key` (True), else those
    the run's other answer files hold (`elsewhere`; False, None when they hold none)."""
    try:
        if json.loads(cache.with_suffix(".json").read_text()).get("key") == key:
            done = pd.read_parquet(cache)
            if done["id"].tolist() == samples["id"].tolist():
                return done, True
    except (OSError, ValueError, KeyError):
        pass  # no cache, or a torn one: decode
    return (elsewhere() if elsewhere is not None else None), False


def answered_elsewhere(
    samples: pd.DataFrame, files: list[Path], key_of: Callable[[pd.DataFrame], str]
) -> pd.DataFrame | None:
    """The answers to `samples` gathered from answer files written in another layout (rounds and one round,
    another jobs_per_shard or shard count, or a smaller data set), in the order of `samples`; None when no
    sample has one. A file counts only when its stamp's key is the key of its own rows now (the same target,
    decoding settings and prompts) and it has every column of `samples`, and a sample only when its prompt is
    the one asked about."""

    def prompt(ids, pl) -> bytes:
        return np.asarray(ids[:pl], dtype=np.int64).tobytes()

    asked = {
        i: prompt(ids, pl) for i, ids, pl in zip(samples["id"], samples["input_ids"], samples["prompt_len"])
    }
    valid: list[pd.DataFrame] = []
    found: dict[str, tuple[int, int]] = {}  # sample id -> (file, row)
    for f in files:
        try:  # the ids first: a fresh run's jobs find none of theirs in the files written so far
            if not pd.read_parquet(f, columns=["id"])["id"].isin(asked.keys() - found.keys()).any():
                continue
            key = json.loads(f.with_suffix(".json").read_text()).get("key")
            df = pd.read_parquet(f)
        except (OSError, ValueError, KeyError):
            continue
        if key != key_of(df) or not set(samples.columns) <= set(df.columns):
            continue
        hits = {
            i: (len(valid), row)
            for row, (i, ids, pl) in enumerate(zip(df["id"], df["input_ids"], df["prompt_len"]))
            if i in asked and i not in found and prompt(ids, pl) == asked[i]  # the same prompt, cut the same
        }
        if hits:
            found.update(hits)
            valid.append(df[list(samples.columns)])
    if not found:
        return None
    rows: dict[int, list[int]] = {}
    for k, row in found.values():
        rows.setdefault(k, []).append(row)
    pool = pd.concat([valid[k].iloc[r] for k, r in rows.items()]).set_index("id", drop=False)
    out = pool.loc[[i for i in samples["id"] if i in found]].reset_index(drop=True)
    log.info(
        "regeneration: reusing %d of %d answers, found in %d answer file(s) of this run's other layouts",
        len(out),
        len(samples),
        len(valid),
    )
    return out


def _lookup(samples: pd.DataFrame, *, target: dict, data: dict, results: Path | None):
    """How a job knows its answers: the key of a set of rows (target, decoding settings, prompts), and the
    search of the run's other answer files for `samples`."""
    regen, max_length = data["regenerate"], int(data["max_length"])

    def key_of(rows: pd.DataFrame) -> str:
        return cache_key(target, regen, max_length, rows)

    def elsewhere() -> pd.DataFrame | None:
        # its own file too: written for fewer prompts (a grown data set), its answers still hold for those
        files = [] if results is None else answer_files(results)
        return answered_elsewhere(samples, files, key_of) if files else None

    return key_of, elsewhere


def shard_cache(shard_out: Path) -> Path:
    """The extract job's answer cache: beside the shards, RESULTS/extract/regen/<shard>.parquet."""
    return shard_out.parent / "regen" / f"{shard_out.stem}.parquet"


def reusable_answers(
    samples: pd.DataFrame, *, shard_out: Path, target: dict, data: dict
) -> pd.DataFrame | None:
    """The answers `regenerate_shard` will reuse rather than decode, found without a model: the extract job
    weighs them on the disk at their own length before any GPU work."""
    key_of, elsewhere = _lookup(samples, target=target, data=data, results=shard_out.parent.parent)
    return cached_answers(samples, shard_cache(shard_out), key_of(samples), elsewhere=elsewhere)[0]


def regenerate_shard(
    model, tokenizer, samples: pd.DataFrame, *, shard_out: Path, target: dict, data: dict, slots: int
) -> tuple[pd.DataFrame, RegenStats | None]:
    """The extract job's regeneration: answers kept beside the shards (extract/regen/), reused by any rerun; a
    retry after running out of memory passes half the slots."""
    cache = shard_cache(shard_out)
    return regenerate_into(
        model,
        tokenizer,
        samples,
        cache,
        target=target,
        data=data,
        slots=slots,
        results=shard_out.parent.parent,
    )


def regenerate_into(
    model,
    tokenizer,
    samples: pd.DataFrame,
    cache: Path,
    *,
    target: dict,
    data: dict,
    slots: int,
    results: Path | None = None,
) -> tuple[pd.DataFrame, RegenStats | None]:
    """`regenerate_cached` with the config's `data` and `target` sections: the answers in `cache`, or in the
    other answer files of the run under `results` (a change of layout decodes nothing again)."""
    regen, max_length = data["regenerate"], int(data["max_length"])
    key_of, elsewhere = _lookup(samples, target=target, data=data, results=results)
    return regenerate_cached(
        model,
        tokenizer,
        samples,
        cache,
        key_of(samples),
        elsewhere=elsewhere,
        settings=answer_settings(target, regen, max_length),
        max_new_tokens=int(regen["max_new_tokens"]),
        temperature=float(regen["temperature"]),
        max_length=max_length,
        slots=slots,
        seed=int(regen["seed"]),
        top_p=float(regen["top_p"]),
        sync_every=int(regen["sync_every"]),
        cuda_graph=bool(regen["cuda_graph"]),
        min_refill=int(regen["min_refill"]),
    )
