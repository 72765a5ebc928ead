"""The regeneration engine against Transformers' own `generate`, on tiny real targets of both layer kinds."""

import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import sliding_model, tiny_model

from draftsmith.dataset.regenerate import regenerate
from draftsmith.engine.engine import Engine
from draftsmith.target.sampling import pick

VOCAB = 448
LENGTHS = (3, 17, 40, 8, 25, 1, 33)


def _prompts(seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]


def _reference(model, prompt: list[int], max_new: int, eos: int | None) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=0
    )[0, len(prompt) :].tolist()
    return out[: out.index(eos) + 1] if eos is not None and eos in out else out


@pytest.fixture(scope="module", params=["hybrid", "attention"])
def model(request):
    return tiny_model(request.param, VOCAB, layers=4)


def test_greedy_equals_generate_with_refill_and_eos(model):
    """Seven prompts through three slots (so slots are refilled mid-run), one EOS id that some answers hit."""
    prompts = _prompts()
    eos = _reference(model, prompts[0], 24, None)[6]  # a token the first answer produces: it must stop there
    refs = [_reference(model, p, 24, eos) for p in prompts]
    assert any(len(r) < 24 for r in refs) and any(len(r) == 24 for r in refs)
    engine = Engine(model, slots=3, max_len=80, eos_ids=[eos], sync_every=4, prefill_tokens=64)
    got, stats = engine.run(prompts, 24, progress=False)
    assert got == refs
    assert stats.new_tokens == sum(len(r) for r in refs)


def test_prefill_groups_are_powers_of_two(model):
    """fla compiles its prefill kernels once per batch size, so the engine admits groups of 1, 2, 4, ...
    prompts only; the answers must not depend on how the prompts were grouped."""
    prompts = _prompts()
    refs = [_reference(model, p, 10, None) for p in prompts]
    runs = {}
    for pow2 in (True, False):
        engine = Engine(
            model, slots=12, max_len=80, eos_ids=[], sync_every=4, pow2_groups=pow2
        )  # groups of <= 3
        got, stats = engine.run(prompts, 10, progress=False)
        assert got == refs
        runs[pow2] = [n for n, _ in stats.admissions]
        assert sum(runs[pow2]) == len(prompts)
    assert all(n & (n - 1) == 0 for n in runs[True]), runs
    assert 3 in runs[False]  # without the rule, the same queue gives a group of three


def test_min_refill_waits_for_free_slots_and_keeps_the_answers(model):
    """With min_refill 2, a slot freed alone waits for a second one (or for the queue's last prompt) before an
    admission: fewer, larger refills, the same greedy answers."""
    prompts = _prompts() * 3  # 21 prompts through 8 slots, admitted in groups of up to 2 (slots / 4)
    lengths = [3 + (7 * i) % 13 for i in range(len(prompts))]  # answers end at different steps
    refs = [_reference(model, p, n, None) for p, n in zip(prompts, lengths)]
    sizes = {}
    for k in (1, 2):
        engine = Engine(model, slots=8, max_len=80, eos_ids=[], sync_every=1, pow2_groups=False, min_refill=k)
        got, stats = engine.run(prompts, lengths, progress=False)
        assert got == refs
        sizes[k] = [n for n, _ in stats.admissions]
        assert sum(sizes[k]) == len(prompts)
    assert 1 in sizes[1][1:] and len(sizes[2]) < len(sizes[1]), sizes
    assert all(n >= 2 for n in sizes[2][:-1]), sizes  # only the queue's tail may come alone


def test_answer_is_capped_by_the_cache_length(model):
    prompts = _prompts()
    engine = Engine(model, slots=4, max_len=30, eos_ids=[], sync_every=3)
    got, _ = engine.run(prompts, 24, progress=False)
    for p, answer in zip(prompts, got):
        assert len(answer) == max(0, min(24, 30 - 1 - len(p)))
        if answer:
            assert answer == _reference(model, p, len(answer), None)


def test_sampling_is_seeded_and_top_p_narrows(model):
    prompts = _prompts(2)
    runs = [
        Engine(model, slots=3, max_len=80, eos_ids=[], temperature=1.0, seed=s).run(
            prompts, 12, progress=False
        )[0]
        for s in (0, 0, 1)
    ]
    assert runs[0] == runs[1]  # same seed, same answers
    assert runs[0] != runs[2]
    greedy = Engine(model, slots=3, max_len=80, eos_ids=[]).run(prompts, 12, progress=False)[0]
    assert runs[0] != greedy
    narrow = Engine(model, slots=3, max_len=80, eos_ids=[], temperature=1.0, top_p=1e-6).run(
        prompts, 12, progress=False
    )[0]
    assert narrow == greedy  # a top-p mass that small keeps only the most probable token


def test_pick_top_p_keeps_the_smallest_prefix():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    seen = {int(pick(logits, 1.0, 0.7, g)) for _ in range(300)}
    assert seen == {0, 1}  # 0.5 < 0.7 <= 0.8: tokens 0 and 1 only


def _samples(prompts: list[list[int]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [f"s{i}" for i in range(len(prompts))],
            "input_ids": [np.asarray(p + [7, 8, 9], dtype=np.int32) for p in prompts],
            "loss_mask": [np.asarray([0] * len(p) + [1, 1, 1], dtype=np.uint8) for p in prompts],
            "prompt_len": [len(p) for p in prompts],
            "num_tokens": [len(p) + 3 for p in prompts],
        }
    )


class Tok:
    pad_token_id, eos_token_id = 0, None


def test_regenerate_replaces_the_last_turn(model):
    prompts = _prompts()
    samples = _samples(prompts)

    model.generation_config.eos_token_id = None
    out, stats = regenerate(
        model, Tok(), samples, max_new_tokens=10, temperature=0.0, max_length=45, slots=4, seed=0
    )
    for i, p in enumerate(prompts):
        ids, mask = out["input_ids"][i], out["loss_mask"][i]
        expect = (p + _reference(model, p, 10, None))[:45]
        assert ids.tolist() == expect and out["num_tokens"][i] == len(expect)
        assert mask.tolist() == ([0] * len(p) + [1] * (len(expect) - len(p)))[: len(expect)]
    assert stats.prompts == len(prompts)


def test_slot_bytes_match_the_allocated_cache(model):
    """The one-token probe predicts what the slot cache allocates, for both layer kinds, so slots can be sized
    to the free memory before anything is allocated."""
    engine = Engine(model, slots=3, max_len=50, eos_ids=[])
    per_position, fixed = engine.slot_bytes()
    assert per_position > 0
    engine.run(_prompts(), 6, progress=False)
    assert engine.cache.nbytes() == 3 * (per_position * 50 + fixed)
    assert (fixed > 0) == any("linear" in t for t in engine.types)


def test_fit_slots():
    from draftsmith.engine.memory import fit_slots

    gib = 2**30
    # 27B-like: 64 KiB per position, 155 MB of linear states per slot, 86 GiB free, 4 GiB reserved
    assert fit_slots(256, 769, 65536, 155_000_000, 86 * gib, 4 * gib) == 256
    assert fit_slots(256, 4097, 65536, 155_000_000, 86 * gib, 4 * gib) == 190
    assert (
        fit_slots(64, 4097, 65536, 155_000_000, 25 * gib, 4 * gib) == 48
    )  # an 80 GB GPU: fewer slots, no OOM
    assert fit_slots(64, 4097, 65536, 155_000_000, 3 * gib, 4 * gib) == 0


def test_eos_ids_join_generation_config_and_tokenizer(model):
    """Llama 3 style: the generation config lists end-of-turn and end-of-text, the tokenizer names one of
    them."""
    from types import SimpleNamespace

    from draftsmith.target.load import eos_ids_of

    before = model.generation_config.eos_token_id
    try:
        model.generation_config.eos_token_id = [9, 5]
        assert eos_ids_of(model, SimpleNamespace(eos_token_id=7)) == [5, 7, 9]
        model.generation_config.eos_token_id = None
        assert eos_ids_of(model, SimpleNamespace(eos_token_id=None)) == []
    finally:
        model.generation_config.eos_token_id = before


def test_answers_are_kept_for_a_rerun(model, tmp_path):
    """A retried or rerun extraction job reuses the answers instead of decoding again, unless what they depend
    on changed; fewer slots (the out-of-memory retry) still reuse them; a torn cache is decoded again."""
    from draftsmith.dataset.regenerate import cache_key, regenerate_cached

    samples = _samples(_prompts())
    target, regen = (
        {"model": "tiny"},
        {"enabled": True, "max_new_tokens": 6, "temperature": 0.0, "batch_size": 4},
    )
    key = cache_key(target, regen, 64, samples)
    cache = tmp_path / "regen" / "shard000.parquet"
    kw = dict(max_new_tokens=6, temperature=0.0, max_length=64, seed=0)
    first, stats = regenerate_cached(model, Tok(), samples, cache, key, slots=4, **kw)
    assert stats is not None and cache.exists()
    again, stats = regenerate_cached(
        model,
        Tok(),
        samples,
        cache,
        cache_key(target, {**regen, "batch_size": 2, "min_refill": 2}, 64, samples),
        slots=2,
        **kw,
    )
    assert stats is None
    assert [a.tolist() for a in again["input_ids"]] == [a.tolist() for a in first["input_ids"]]
    assert [a.tolist() for a in again["loss_mask"]] == [a.tolist() for a in first["loss_mask"]]
    for changed in (
        cache_key(target, {**regen, "max_new_tokens": 5}, 64, samples),
        cache_key({"model": "other"}, regen, 64, samples),
        cache_key(target, regen, 64, _samples(_prompts(3))),
    ):
        assert changed != key
    cache.with_suffix(".json").write_text("{torn")
    _, stats = regenerate_cached(model, Tok(), samples, cache, key, slots=4, **kw)
    assert stats is not None


def test_answers_made_in_one_layout_are_found_in_another(model, tmp_path):
    """Answers made by a run in rounds (answers/cache/, one file a regeneration job) are found by the same
    run's extraction in one round (extract/regen/), however the shards cut the samples now: a change of disk
    budget, jobs_per_shard or shard count decodes nothing again. Other decoding settings decode again."""
    from draftsmith.config import with_defaults
    from draftsmith.dataset.regenerate import regenerate_into, regenerate_shard
    from draftsmith.plan.rounds import job_rows

    samples = _samples(_prompts())
    target = {"model": "tiny"}
    data = with_defaults("data", {"max_length": 64, "regenerate": {"enabled": True, "max_new_tokens": 6}})
    results = tmp_path / "results"
    for job in (0, 1):  # a shard answered by two regeneration jobs, every other sample each
        rows = samples.iloc[job_rows(len(samples), job, 2)].reset_index(drop=True)
        cache = results / "answers" / "cache" / f"shard000.j{job}.parquet"
        _, stats = regenerate_into(
            model, Tok(), rows, cache, target=target, data=data, slots=4, results=results
        )
        assert stats is not None  # the other job's file holds none of these samples: decoded
    made = pd.concat([pd.read_parquet(f) for f in sorted((results / "answers/cache").glob("*.parquet"))])
    made = made.set_index("id")
    shard_out = results / "extract" / "shard000.safetensors"
    reordered = samples.iloc[::-1].reset_index(drop=True)  # another cut of the samples into shards
    got, stats = regenerate_shard(
        model, Tok(), reordered, shard_out=shard_out, target=target, data=data, slots=4
    )
    assert stats is None and got["id"].tolist() == reordered["id"].tolist()
    for i, ids in zip(got["id"], got["input_ids"]):
        assert np.array_equal(ids, made.loc[i, "input_ids"])
    assert (results / "extract/regen/shard000.parquet").exists()  # kept in this layout's cache as well
    longer = with_defaults("data", {"max_length": 64, "regenerate": {"enabled": True, "max_new_tokens": 5}})
    other_out = results / "extract" / "shard001.safetensors"
    _, stats = regenerate_shard(
        model, Tok(), samples, shard_out=other_out, target=target, data=longer, slots=4
    )
    assert stats is not None  # other settings: no file's key is the key of its rows under them
    cut = samples.copy()
    cut.loc[0, "prompt_len"] -= 1  # a prompt that is a prefix of the one answered: not the same prompt
    other_out = results / "extract" / "shard002.safetensors"
    _, stats = regenerate_shard(model, Tok(), cut, shard_out=other_out, target=target, data=data, slots=4)
    assert stats is not None
    shutil.rmtree(results / "extract")  # the rounds' files alone again
    for job in (0, 1, 2):  # three jobs a shard now, each with its own file beside the two jobs' files
        rows = samples.iloc[job_rows(len(samples), job, 3)].reset_index(drop=True)
        cache = results / "answers" / "cache" / f"shard000.j{job}.of3.parquet"
        _, stats = regenerate_into(
            model, Tok(), rows, cache, target=target, data=data, slots=4, results=results
        )
        assert stats is None, job


def test_a_grown_data_set_decodes_its_new_prompts_alone(model, tmp_path):
    """Issue 37's math run added 8,460 prompts to 43,629 answered ones, and its two one-round extraction jobs
    decoded all 52,089 again (5 minutes each): the other layouts' files counted only when they answered every
    sample of a shard. Now the answers found are kept and only the rest are decoded, in the shard's order."""
    from draftsmith.config import with_defaults
    from draftsmith.dataset.regenerate import regenerate_into, regenerate_shard

    samples = _samples(_prompts() + _prompts(seed=2))
    target = {"model": "tiny"}
    data = with_defaults("data", {"max_length": 64, "regenerate": {"enabled": True, "max_new_tokens": 6}})
    results = tmp_path / "results"
    old = samples.iloc[: len(samples) // 2 + 1].reset_index(drop=True)  # the smaller data set, answered
    cache = results / "answers" / "cache" / "shard000.parquet"
    made, _ = regenerate_into(model, Tok(), old, cache, target=target, data=data, slots=4, results=results)
    made = made.set_index("id")
    grown = samples.iloc[::-1].reset_index(drop=True)  # all of them, cut into a shard in another order
    out = results / "extract" / "shard000.safetensors"

    def answer() -> tuple[pd.DataFrame, object]:
        return regenerate_shard(model, Tok(), grown, shard_out=out, target=target, data=data, slots=4)

    got, stats = answer()
    assert stats is not None and stats.prompts == len(samples) - len(old)  # the new prompts alone
    assert got["id"].tolist() == grown["id"].tolist()
    for i, ids, mask, n in zip(got["id"], got["input_ids"], got["loss_mask"], got["num_tokens"]):
        assert len(ids) == len(mask) == n
        if i in made.index:
            assert np.array_equal(ids, made.loc[i, "input_ids"])
        else:
            assert not np.array_equal(ids, samples.set_index("id").loc[i, "input_ids"])  # answered anew
    again, stats = answer()  # a rerun: its own cache
    assert stats is None and [a.tolist() for a in again["input_ids"]] == [
        a.tolist() for a in got["input_ids"]
    ]
    # grown in place: the job's own file, written for the smaller set, is the only one that holds answers
    alone = tmp_path / "in_place" / "extract" / "shard000.safetensors"
    _, stats = regenerate_shard(model, Tok(), old, shard_out=alone, target=target, data=data, slots=4)
    assert stats is not None and stats.prompts == len(old)
    _, stats = regenerate_shard(model, Tok(), grown, shard_out=alone, target=target, data=data, slots=4)
    assert stats is not None and stats.prompts == len(samples) - len(old)
    # a job with no rows (jobs_per_shard over a shard's samples): none decoded, none found, no error
    none = results / "answers/cache/shard001.parquet"
    empty, _ = regenerate_into(
        model, Tok(), samples.iloc[:0], none, target=target, data=data, slots=4, results=results
    )
    assert len(empty) == 0


def test_plan_slots_fits_memory_and_says_what_to_lower(model, caplog):
    """The GPU path of `regenerate` sizes its slots with this, from the free memory nvidia reports."""
    from draftsmith.engine.memory import NoRoomForAnswers, fit_slots, plan_slots, prefill_reserve

    per_position, fixed = Engine(model, slots=1, max_len=2, eos_ids=[]).slot_bytes()
    reserve = prefill_reserve(model, 16384)
    one = per_position * 80 + fixed + fixed // 4
    assert plan_slots(model, 6, 80, 0, reserve + 10 * one) == 6
    with caplog.at_level("WARNING"):
        assert plan_slots(model, 6, 80, 0, reserve + 2 * one + one // 2) == 2
    assert "data.regenerate.batch_size" in caplog.text
    with pytest.raises(NoRoomForAnswers, match="lower data.max_length or data.regenerate.max_new_tokens"):
        plan_slots(model, 6, 80, 0, reserve + one // 2)
    assert fit_slots(6, 80, per_position, fixed, reserve + 3 * one, reserve) == 3


def test_bench_regenerate_cpu_smoke(tmp_path):
    """The GPU session's regeneration figures come from this script: it must run, and its greedy check must
    hold where there is no bf16 rounding (the tiny target on the CPU, in fp32)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "regen.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftsmith.perf.bench_regenerate",
            "--shape",
            "tiny-hybrid",
            "--batch-sizes",
            "3,5",
            "--generate-batches",
            "4",
            "--prompt-len",
            "12",
            "--new-tokens",
            "6",
            "--generate-new-tokens",
            "9",
            "--generate-waves",
            "2",
            "--spread",
            "--check-prompts",
            "2",
            "--check-tokens",
            "6",
            "--profile-batch",
            "3",
            "--admit-sizes",
            "1,2",
            "--packed",
            "--json-out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["greedy_agreement"] == [6, 6]
    assert [row["batch"] for row in r["engine"]] == [3, 5] and not any("error" in row for row in r["engine"])
    assert all(
        row["new_tokens_per_s"] > 0 and row["decode_tokens_per_s"] >= row["new_tokens_per_s"]
        for row in r["engine"]
    )
    same = r["same_prompts"][0]
    assert same["batch"] == 4 and same["prompts"] == 8 and same["ratio"] > 0 and same["decode_ratio"] > 0
    assert same["longest"] <= 9 and 8 <= same["new_tokens"] < 8 * 9  # spread lengths, counted as generated
    assert "Name" in res.stdout  # the profile table
    assert [row["group"] for row in r["admit"]] == [1, 2] and all(row["packed"] for row in r["admit"])
    assert all(row["again_s"] > 0 < row["bare_tokens_per_s"] and row["vs_bare"] > 0 for row in r["admit"])


@pytest.mark.parametrize("family", ["qwen3-mixed", "mistral", "gemma2", "gpt-oss"])
def test_sliding_window_targets_equal_generate(family):
    """Sliding layers see only the last `sliding_window` positions, and Transformers' prefill cache hands over
    only that many keys. Prompts longer than the window, answers that slide further, slots refilled by other
    prompts: the engine's greedy answers must equal `generate`'s token for token."""
    window = 6
    model = sliding_model(family, VOCAB, window)
    prompts = _prompts()
    assert max(map(len, prompts)) > window
    refs = [_reference(model, p, 20, None) for p in prompts]
    unwindowed = sliding_model(family, VOCAB, window, slide=False)  # the window must matter
    assert [_reference(unwindowed, p, 20, None) for p in prompts] != refs
    engine = Engine(model, slots=3, max_len=80, eos_ids=[], sync_every=4, prefill_tokens=64)
    assert engine.window == window
    got, _ = engine.run(prompts, 20, progress=False)
    assert got == refs


def test_chunked_attention_is_refused_clearly():
    model = tiny_model("attention", VOCAB, layers=2)
    model.config.attention_chunk_size = 8
    with pytest.raises(NotImplementedError, match=r"chunked attention.*regenerate.enabled: false"):
        Engine(model, slots=2, max_len=40, eos_ids=[])


def test_the_plan_leaves_answers_it_will_reuse_out_of_regenerations_hours(model, tmp_path):
    """Answers the cache holds under this run's settings are not decoded again, so the plan does not price
    them (issue 37's answers-first run planned 0.06 GPU-hours of regeneration with every answer cached);
    answers under other settings, which the jobs would decode again, still count."""
    from draftsmith.config import with_defaults
    from draftsmith.dataset.regenerate import regenerate_into
    from draftsmith.plan.data import answer_settings, measured
    from draftsmith.plan.hours import _work

    samples = _samples(_prompts())
    target = {"model": "tiny", "mask_token_id": 5}  # a key data jobs never see: not in the settings
    data = with_defaults("data", {"max_length": 64, "regenerate": {"enabled": True, "max_new_tokens": 6}})
    results = tmp_path / "results"
    (results / "prepared").mkdir(parents=True)
    samples[["id", "num_tokens", "prompt_len"]].to_parquet(results / "prepared/samples.parquet")
    half = samples.iloc[::2].reset_index(drop=True)
    seen = {k: v for k, v in target.items() if k != "mask_token_id"}  # as the regeneration job gets it
    cache = results / "answers" / "cache" / "shard000.j0.parquet"
    regenerate_into(model, Tok(), half, cache, target=seen, data=data, slots=4, results=results)
    config = {"train": with_defaults("train"), "bench": with_defaults("bench")}

    def to_decode(data: dict) -> float:
        size = measured(
            results, data, settings=answer_settings(target, data["regenerate"], data["max_length"])
        )
        assert size is not None
        return _work(config, size, bench_prompts=0)["new"] / size.answer_tokens

    assert to_decode(data) == len(samples) - len(half)
    other = with_defaults("data", {"max_length": 64, "regenerate": {"enabled": True, "max_new_tokens": 5}})
    assert to_decode(other) == len(samples)  # another cap: every answer decoded again
    regenerate_into(
        model, Tok(), samples, cache.with_name("shard000.parquet"), target=seen, data=data, slots=4
    )
    assert to_decode(data) == 0  # all answered: nothing left to decode
    assert measured(results, data) is not None and measured(results, data).answered == 0  # no settings: all
