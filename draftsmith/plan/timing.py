"""This node's rates, timed by the rates job: the target's extraction forward (on synthetic data shaped like
the run's), its regeneration (on the run's own prompts) and its batch-1 decode (the bench), the drafter's
training step (on random states), and what a job pays before its first token (start-up, loading, first
shapes). The plan turns them into GPU-hours (docs/planning.md); the rates table is the fallback where nothing
was timed."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from draftsmith.core.runtime import sync_device
from draftsmith.target.files import text_config

EXTRACT_BATCHES = 3  # timed batches of the extraction forward, after one untimed (first shapes compile)
BENCH_TOKENS = 48  # batch-1 greedy tokens timed (the bench's reference decode)
TRAIN_STEPS = 4  # timed training steps a length profile, after two untimed (FlexAttention's compile)
TRAIN_PROFILES = (0.25, 1.0)  # sample lengths as fractions of data.max_length: a step's cost splits into a
# part per sample (anchors x block through the head) and a part per step (the padded tokens)


def synthetic_samples(count: int, length: int, *, prompt: int, vocab: int, seed: int = 0) -> pd.DataFrame:
    """`count` samples of random tokens, `prompt` of them the prompt, as prepared shards hold them."""
    rng = np.random.default_rng(seed)
    low = min(16, vocab - 1)  # above the special tokens most vocabularies start with
    ids = [rng.integers(low, vocab, length, dtype=np.int64).astype(np.int32) for _ in range(count)]
    mask = np.concatenate([np.zeros(prompt, np.uint8), np.ones(length - prompt, np.uint8)])
    return pd.DataFrame(
        {
            "id": [f"timing{i}" for i in range(count)],
            "input_ids": ids,
            "loss_mask": [mask] * count,
            "num_tokens": [length] * count,
            "prompt_len": [prompt] * count,
        }
    )


def time_extraction(
    model, *, taps: list[int], token_budget: int, length: int, storage: str, workdir: Path
) -> dict:
    """Tokens/s of `extract_samples` (forward, taps, copy, write to `workdir`, on the results disk), warm,
    and the first batch's extra seconds."""
    from draftsmith.dataset.extract import extract_samples

    vocab = int(model.config.get_text_config().vocab_size)
    per_batch = max(1, token_budget // length)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        seconds = []
        for batches, name in ((1, "first"), (EXTRACT_BATCHES, "warm")):
            samples = synthetic_samples(per_batch * batches, length, prompt=length // 2, vocab=vocab)
            t = time.perf_counter()
            extract_samples(
                model, samples, taps, Path(tmp) / f"{name}.safetensors", token_budget, storage, progress=False
            )
            seconds.append(time.perf_counter() - t)
    warm_batch = seconds[1] / EXTRACT_BATCHES
    tokens = per_batch * length
    return {
        "extract_tokens_s": tokens / warm_batch,
        "extract_first_batch_s": max(0.0, seconds[0] - warm_batch),
    }


def time_regeneration(
    model, tokenizer, samples: pd.DataFrame, *, regen: dict, slots: int, max_length: int
) -> dict:
    """New tokens/s of regeneration end to end as its jobs run it: the run's own prompts (a quarter more than
    the slots, so that answers end raggedly and slots refill), the config's decoding settings and stop tokens,
    slots sized to the memory; prefill included."""
    from draftsmith.dataset.regenerate import regenerate

    kw = {k: regen[k] for k in ("temperature", "seed", "top_p", "sync_every", "cuda_graph", "min_refill")}
    take = samples.head(slots + slots // 4)
    warm = take.head(max(1, slots // 8))
    regenerate(model, tokenizer, warm, max_new_tokens=8, max_length=max_length, slots=slots, **kw)  # untimed
    answered, stats = regenerate(
        model,
        tokenizer,
        take,
        max_new_tokens=int(regen["max_new_tokens"]),
        max_length=max_length,
        slots=slots,
        **kw,
    )
    # each answer's length (as data.max_length keeps it): the plan cuts them at the bench's cap
    lengths = (answered["num_tokens"] - answered["prompt_len"]).to_numpy()
    return {
        "regenerate_new_tokens_s": stats.new_tokens_per_s,
        "answer_tokens_mean": stats.new_tokens / max(1, stats.prompts),
        "answer_lengths": sorted(int(n) for n in lengths.clip(min=0)),
        "regenerate_slots": slots,
    }


def time_bench_decode(model) -> dict:
    """Tokens/s of the bench's batch-1 greedy decode (its reference answer, a prompt's largest cost)."""
    from draftsmith.speculative.replay import ar_generate

    vocab = int(model.config.get_text_config().vocab_size)
    prompt = synthetic_samples(1, 64, prompt=64, vocab=vocab, seed=2)["input_ids"][0].tolist()
    ar_generate(model, prompt, 4)
    gen = ar_generate(model, prompt, BENCH_TOKENS)
    return {"bench_tokens_s": len(gen.tokens) / gen.seconds}


def _train_profile(target_dir: Path, work: Path, *, length: int, taps: list[int], drafter: dict, train: dict):
    """(seconds to set up, the state's save and load included, of the first step, of a warm step, samples a
    step) on one step's batch of random states."""
    from draftsmith.drafter.train import EpochPlans, _set_up, _train_step
    from draftsmith.perf.bench_train_loop import write_data

    text = text_config(target_dir)
    budget = int(train["token_budget"])
    samples = max(2, math.ceil(budget / length) + 1)
    prompt = max(1, length // 3)
    write_data(
        work,
        samples=samples,
        width=len(taps) * int(text["hidden_size"]),
        hidden=int(text["hidden_size"]),
        taps=taps,
        vocab=int(text["vocab_size"]),
        prompt=(prompt, prompt),
        answer=(length - prompt,) * 2,
        device=torch.device("cuda" if torch.cuda.is_available() else "cpu"),
    )
    tcfg = {**train, "heldout_fraction": 0.0, "epochs": 1000, "max_steps": None, "max_samples": None}
    t = time.perf_counter()
    run = _set_up(
        work / "merged" / "manifest.json",
        target_dir,
        drafter_section=drafter,
        tcfg=tcfg,
        preset_mask_token_id=None,
    )
    setup = time.perf_counter() - t
    plans = EpochPlans(run)
    in_step = len(plans.indices(0)[1])  # samples step 0 packs into the token budget
    batch = plans.host_batch(0)[1].to(run.device, run.dtype)
    autocast = torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.dtype == torch.bfloat16)
    seconds = []
    for step in range(2 + TRAIN_STEPS):
        sync_device(run.device)
        t = time.perf_counter()
        _train_step(run, run.model, autocast=autocast, batch=batch, step=step)
        sync_device(run.device)
        seconds.append(time.perf_counter() - t)
    # a round's training job loads the state the round before handed on, and saves its own
    t = time.perf_counter()
    torch.save({"model": run.model.state_dict(), "opt": run.opt.state_dict()}, work / "state.pt")
    torch.load(work / "state.pt", map_location=run.device, weights_only=False)
    state_io = time.perf_counter() - t
    return setup + state_io, seconds[0], float(np.mean(seconds[2:])), in_step


def time_training(target_dir: Path, *, taps: list[int], drafter: dict, train: dict, max_length: int) -> dict:
    """A training step's cost as seconds a sample plus seconds a step, from warm steps at two sample lengths
    (the same token budget), and the first step's extra seconds (compiling)."""
    runs = []
    drafter = {**drafter, "mask_token_id": 0}  # any id: the mask token does not change a step's cost
    for fraction in TRAIN_PROFILES:
        length = max(8, int(max_length * fraction))
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(
                _train_profile(target_dir, Path(tmp), length=length, taps=taps, drafter=drafter, train=train)
            )
    (setup, first, warm_a, n_a), (_, _, warm_b, n_b) = runs
    per_sample = max(0.0, (warm_a - warm_b) / (n_a - n_b)) if n_a != n_b else 0.0
    per_step = max(0.0, warm_b - per_sample * n_b)
    return {
        "train_s_per_sample": per_sample,
        "train_s_per_step": per_step,
        "train_setup_s": setup,
        "train_first_step_s": max(0.0, first - warm_a),
        "train_profiles": [{"samples_a_step": n, "s_a_step": w} for _, _, w, n in runs],
    }
