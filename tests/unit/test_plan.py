"""The plan: sizes, the rounds' layout of samples, the budget's errors, the CLI on the Qwen3.6-27B preset, and
shard files that reserve their disk before anything is written (on a real size-limited file system)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from draftsmith.config import with_defaults
from draftsmith.core.units import parse_size
from draftsmith.dataset.shards import ShardWriter
from draftsmith.plan.cli import load_config
from draftsmith.plan.hours import bench_runs, job_counts
from draftsmith.plan.plan import PlanError, decide_rounds
from draftsmith.plan.rounds import (
    answer_jobs,
    extracted_epoch,
    extracted_rounds,
    extraction_passes,
    heldout_rows,
    job_rows,
    peak_tokens,
    round_order,
    round_orders,
    rounds_problems,
    select_rows,
)
from draftsmith.plan.sizes import target_params, token_bytes

REPO = Path(__file__).resolve().parents[2]


def test_sizes_read_as_written_and_a_bad_one_names_the_key():
    assert parse_size("2TB") == 2 * 10**12 and parse_size("500 GB") == 5 * 10**11
    assert parse_size("1.5TiB") == int(1.5 * 2**40) and parse_size(4096) == 4096
    with pytest.raises(ValueError, match="extract.disk_budget: 'lots'"):
        parse_size("lots")


def test_a_token_of_the_27b_takes_51_kb():
    """5 taps x 5120 x 2 bytes, plus its id and mask (and its fp8 scale)."""
    assert token_bytes(taps=5, hidden=5120, storage="bf16") == pytest.approx(51_200 + 4 + 1, abs=0.01)
    assert token_bytes(taps=5, hidden=5120, storage="fp8") == pytest.approx(25_600 + 4 + 4 + 1, abs=0.01)


def _samples(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(5, 60, n)
    return pd.DataFrame({"id": [f"s{i}" for i in range(n)], "prompt_len": prompt, "num_tokens": prompt + 30})


@pytest.mark.parametrize("rounds", [1, 2, 3, 5])
def test_rounds_partition_the_training_samples(rounds):
    """Every sample in exactly one round or the held-out set, the held-out set the same whatever the rounds,
    and the rounds about equal in the tokens they can take."""
    data = with_defaults("data", {"max_length": 64, "regenerate": {"enabled": True, "max_new_tokens": 32}})
    df = _samples(200)
    rows = {"heldout_fraction": 0.05, "seed": 3, "rounds": rounds}
    held = select_rows(df, {**rows, "kind": "heldout"}, data)["id"].tolist()
    parts = [select_rows(df, {**rows, "kind": "round", "round": r}, data) for r in range(rounds)]
    ids = [i for p in parts for i in p["id"]]
    assert len(ids) == len(set(ids)) and set(ids) | set(held) == set(df["id"]) and not set(ids) & set(held)
    assert held == df["id"][heldout_rows(df["id"].tolist(), fraction=0.05, seed=3)].tolist() and held
    bound = [int(np.minimum(p["prompt_len"] + 32, 64).sum()) for p in parts]
    assert max(bound) - min(bound) <= 64  # balanced to within one sample


def test_fewer_shards_than_slots_are_answered_by_several_jobs_each():
    """Ahead of the rounds every slot answers at once: 2 shards on 8 slots take 4 jobs each, every 4th sample
    each, covering the shard once; one round, or a pinned count, keeps what the config says."""
    config = with_defaults("data", {"regenerate": {"enabled": True}})
    config = {
        "data": config,
        "bench": with_defaults("bench", {"parts": 1, "datasets": []}),
        "train": with_defaults("train"),
    }
    config["extract"] = with_defaults("extract")
    assert answer_jobs(config, rounds=4, base_shards=2, slots=8) == 4
    assert answer_jobs(config, rounds=4, base_shards=3, slots=8) == 3  # ceil: a slot may answer twice
    assert answer_jobs(config, rounds=4, base_shards=16, slots=8) == 1
    assert answer_jobs(config, rounds=1, base_shards=2, slots=8) == 1  # the extraction jobs answer
    assert job_counts(config, rounds=4, base_shards=2, slots=8)["regeneration"] == 8
    config["data"]["regenerate"]["jobs_per_shard"] = 3
    assert answer_jobs(config, rounds=4, base_shards=2, slots=8) == 3
    assert [job_rows(10, j, 3).tolist() for j in range(3)] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_a_studys_sizes_are_planned_as_the_drafters_they_train_and_bench():
    """Each size trains its share of the samples (at equal epochs) or the main run's steps (at equal steps),
    and benches the same prompts; its jobs count as the main run's do."""
    from draftsmith.plan.data import DataSize
    from draftsmith.plan.hours import _work

    config = {
        "data": with_defaults("data", {}),
        "train": with_defaults("train", {"heldout_fraction": 0.0}),
        "bench": with_defaults("bench", {"parts": 2, "datasets": [{"name": "a", "path": "a"}]}),
    }
    size = DataSize(
        samples=1000, prompt_tokens=50.0, answer_tokens=100.0, tokens_bound=150.0, source="estimate"
    )
    alone = _work(config, size, bench_prompts=10)
    config["study"] = {"train_samples": [250, 500], "budget": "epochs"}
    study = _work(config, size, bench_prompts=10)
    assert study["training_runs"] == 1.75 and study["bench_tokens"] == 3 * alone["bench_tokens"]
    config["study"]["budget"] = "steps"
    assert _work(config, size, bench_prompts=10)["training_runs"] == 3
    config["train"]["epochs"] = 2
    config["extract"] = with_defaults("extract")
    jobs = job_counts(config, rounds=4, base_shards=2, slots=8)
    assert jobs["training"] == 3 * (4 * 2 + 1) and jobs["bench"] == 3 * 2, jobs
    # reusing the last round: epoch 1's first round is neither extracted nor trained in a job of its own
    config["extract"]["reuse_last_round"] = True
    reused = job_counts(config, rounds=4, base_shards=2, slots=8)
    assert reused["training"] == 3 * (4 * 2 - 1 + 1) and reused["extraction"] == 2 * (4 * 2 - 1 + 1), reused
    assert 4 * extraction_passes(2, 4, reuse_last=True) == 4 * 2 - 1  # the rounds extracted, as the jobs say
    # without real loops the target's answers are decoded once, by a reference job a part, for every size
    config["bench"]["real_loop"] = False
    assert _work(config, size, bench_prompts=10)["bench_tokens"] == 10 * config["bench"]["max_new_tokens"]
    # but every size replays every run (DFlash, DDTree at each budget) over those answers, a round a token
    runs = 1 + len(config["bench"]["ddtree_budgets"])
    assert bench_runs(config["bench"]) == runs
    replayed = _work(config, size, bench_prompts=10)["bench_replayed"]
    assert replayed == 10 * config["bench"]["max_new_tokens"] * 3 * runs
    assert job_counts(config, rounds=4, base_shards=2, slots=8)["bench"] == (3 + 1) * 2


def test_each_epoch_visits_the_rounds_in_its_own_order():
    orders = [round_order(6, e, 0) for e in range(4)]
    assert all(sorted(o) == list(range(6)) for o in orders) and len({tuple(o) for o in orders}) > 1
    assert round_order(6, 1, 0) == orders[1]  # seeded: the DAG is the same at every parse


def test_reusing_the_last_round_begins_each_epoch_with_the_round_the_one_before_ended_with():
    """extract.reuse_last_round: every epoch still visits every round once; each after the first begins with
    the previous epoch's last round, trained on that epoch's extraction, so one round an epoch is not
    extracted again; the first epoch's order is the one without reuse."""
    orders = round_orders(4, 5, 0, reuse_last=True)
    assert orders[0] == round_order(4, 0, 0) == round_orders(4, 5, 0, reuse_last=False)[0]
    assert all(sorted(o) == list(range(4)) for o in orders)
    assert all(b[0] == a[-1] for a, b in zip(orders, orders[1:]))
    assert len({tuple(o[1:]) for o in orders[1:]}) > 1  # the others in each epoch's own order
    assert [
        extracted_epoch(e, p, rounds=4, reuse_last=True) for e, p in [(0, 0), (1, 0), (1, 1), (3, 0)]
    ] == [
        0,
        0,
        1,
        2,
    ]
    assert extracted_epoch(1, 0, rounds=4, reuse_last=False) == 1
    extracted = extracted_rounds(orders, reuse_last=True)
    assert len(extracted) == 4 * 5 - 4 and len(extracted_rounds(orders, reuse_last=False)) == 20
    assert all((e, orders[e][0]) not in extracted for e in range(1, 5))
    assert extraction_passes(5, 4, reuse_last=True) == len(extracted) / 4 == 4.0
    assert extraction_passes(6, 2, reuse_last=True) == 3.5 and extraction_passes(6, 2, reuse_last=False) == 6
    assert extraction_passes(6, 1, reuse_last=True) == 1  # one round: extracted once, kept


def test_rounds_as_few_as_fit_and_a_budget_below_one_round_is_refused():
    config = {
        "train": with_defaults("train"),
        "data": with_defaults("data", {"max_length": 100}),
        "extract": with_defaults("extract"),
    }
    kw = {"config": config, "samples": 1000, "base_shards": 4, "per_token": 10.0}
    assert decide_rounds(1e6, 2_000_000, **kw)[0] == 1
    assert decide_rounds(1e6, 300_000, **kw)[0] == 4  # (0.95 MB) / (0.3 MB - 50 KB held out - 4 KB slack)
    with pytest.raises(PlanError, match=r"extract.disk_budget.*smallest round.*fp8"):
        decide_rounds(1e6, 50_000, **kw)


def test_what_rounds_cannot_train_is_named_with_the_way_out():
    """A subset of the training split (train.max_samples) is refused in rounds, and the problem says which
    key lifts it: a budget that holds every state makes one round, where it is allowed."""
    sections = {s: with_defaults(s) for s in ("train", "data", "extract", "study")}
    config = {**sections, "train": with_defaults("train", {"max_samples": 21088, "epochs": 12})}
    assert rounds_problems(config, 1) == []
    (problem,) = rounds_problems(config, 3)
    assert "train.max_samples" in problem and "3 rounds" in problem and "extract.disk_budget" in problem
    # rounds sized before any answer was decoded, at their bound: decoding them first may leave one round
    problem, hint = rounds_problems(config, 3, answers_bounded=True)
    assert "`snakemake answers`" in hint and "answers' bound" in hint
    config["train"] = with_defaults("train", {"epochs": 2.5})
    assert any("whole number" in p for p in rounds_problems(config, 3))


def test_rounds_in_flight_share_the_budget():
    """Two rounds on disk at once: each is sized to half of what the held-out samples leave, and the peak of
    any two rounds with the held-out samples fits."""
    config = {
        "train": with_defaults("train"),
        "data": with_defaults("data", {"max_length": 100}),
        "extract": with_defaults("extract", {"rounds_in_flight": 2}),
    }
    kw = {"config": config, "samples": 1000, "base_shards": 4, "per_token": 10.0}
    rounds, held = decide_rounds(1e6, 300_000, **kw)
    assert rounds == 8  # 2 x 0.95 MB / (0.3 MB - 50 KB held out - 8 KB slack)
    tokens = np.full(rounds, 0.95e6 / 10 / rounds)
    assert peak_tokens(tokens, int(held / 10), in_flight=2) * 10 <= 300_000
    assert peak_tokens(np.array([5, 9, 7]), 3, in_flight=2) == 19
    assert peak_tokens(np.array([5]), 0, in_flight=3) == 5


def test_plan_command_on_the_27b_preset_with_100k_prompts(tmp_path):
    """`python -m draftsmith plan` with the Qwen3.6-27B preset and 100k prompt-only records, for 8 RTX PRO
    6000 on a 8 TB disk: 51.2 KB a token, answers bounded by max_new_tokens, two rounds, GPU-hours from
    estimates."""
    rng = np.random.default_rng(0)
    data = tmp_path / "train.jsonl"
    with data.open("w") as f:
        for i in range(100_000):
            f.write(json.dumps({"id": f"q{i}", "prompt": "word " * int(rng.integers(20, 400))}) + "\n")
    over = tmp_path / "over.yaml"
    over.write_text(
        f"data: {{path: {data}}}\nbench: {{datasets: [{{name: b, path: {data}}}], max_prompts: 40}}\n"
    )
    cmd = [sys.executable, "-m", "draftsmith", "plan", "--configfile", "configs/qwen3.6-27b.yaml", str(over)]
    cmd += [
        "--gpus",
        "8",
        "--gpu",
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "--free",
        "8TB",
        "--json",
    ]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    plan = json.loads(out)
    assert plan["data"]["samples"] == 100_000 and plan["data"]["answer_tokens"] == 2048
    assert plan["bytes_per_token"]["bf16"] == pytest.approx(51_205) and plan["rounds"] == 2
    assert plan["states_bytes"]["bf16"] > 8e12 and plan["gpu_class"] == "RTX PRO 6000 Blackwell"
    assert plan["stages"]["extract, all passes"]["gpu_hours"] == pytest.approx(
        6 * plan["stages"]["extract per epoch"]["gpu_hours"]
    )
    assert "estimate" in plan["stages"]["train per epoch"]["source"]
    # the bench's fp32 check on a 96 GB card: the target in fp32 a layer at a time, under the card's memory
    mem = plan["memory"]
    assert mem["limit_bytes"] == 96 * 10**9 and mem["limit_source"] == "the card"
    assert mem["check_runs"] and "a layer at a time" in mem["check"]
    assert mem["weights_bytes"] < mem["bench_bytes"] < mem["check_bytes"] < mem["limit_bytes"]
    nested = tmp_path / "nested.yaml"  # a nested key merges into the preset's section, as Snakemake merges
    nested.write_text("data: {regenerate: {max_new_tokens: 1024}}\ngpu_memory: 70GB\n")
    cmd_nested = cmd[:7] + [str(nested)] + cmd[7:]
    merged = json.loads(
        subprocess.run(cmd_nested, cwd=REPO, capture_output=True, text=True, check=True).stdout
    )
    assert merged["data"]["answer_tokens"] == 1024 and "regeneration" in merged["stages"]
    assert merged["memory"]["limit_source"] == "gpu_memory 70GB"  # a cap the check would not fit: said so
    assert any("the fp32 check needs about" in n and "fp32_check_prompts: 0" in n for n in merged["notes"])
    reuse = [
        n for n in plan["notes"] if n.startswith("extract.reuse_last_round: true would extract 3.5 passes")
    ]
    assert reuse, plan["notes"]  # two rounds over 6 epochs: what reusing the last round would save, said
    reused = tmp_path / "reuse.yaml"
    reused.write_text("extract: {reuse_last_round: true}\n")
    cut = json.loads(
        subprocess.run(
            cmd[:7] + [str(reused)] + cmd[7:], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    )
    assert cut["extraction_passes"] == 3.5 and not any("reuse_last_round" in n for n in cut["notes"])
    assert cut["stages"]["extract, all passes"]["gpu_hours"] == pytest.approx(
        3.5 * cut["stages"]["extract per epoch"]["gpu_hours"]
    )
    small = subprocess.run(cmd[:-2] + ["400GB"], cwd=REPO, capture_output=True, text=True)
    assert small.returncode == 2 and "fp8" in small.stderr and "smallest round" in small.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB file system (tmpfs), where this process may mount one (root)."""
    where = tmp_path / "disk"
    where.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)]).returncode
    ):
        pytest.skip("mounting a size-limited tmpfs needs root")
    yield where
    subprocess.run(["umount", str(where)], check=False)


def test_writers_started_together_never_die_mid_write(small_disk):
    """Four shard writers of 300 KB each start together on a disk that holds three: those that cannot have
    their room fail as they start, leaving nothing; the others write every byte and close."""
    lengths, width = [100] * 15, 100  # 15 samples x 100 tokens x 100 x bf16 = 300 KB
    writers, errors = {}, {}

    def start(k: int) -> None:
        try:
            writers[k] = ShardWriter(small_disk / f"s{k}.safetensors", lengths, width)
        except OSError as e:
            errors[k] = e

    threads = [threading.Thread(target=start, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # at most three fit; one that would fit can still find the disk full while another's failing reservation
    # holds pages for a moment: either way it fails as it starts
    assert 1 <= len(writers) <= 3 and len(writers) + len(errors) == 4, (writers, errors)
    assert all("disk is full" in str(e) for e in errors.values())
    for w in writers.values():
        for i in range(len(lengths)):
            w.write_sample(i, torch.ones(100, width, dtype=torch.bfloat16), torch.zeros(100), torch.ones(100))
        w.close()
    assert sorted(p.name for p in small_disk.iterdir()) == sorted(f"s{k}.safetensors" for k in writers)


# a rates job's figures, as RESULTS/rates.json holds them (round numbers the tests can price by hand)
def test_the_plan_sizes_answers_by_the_cache_carried_to_a_fresh_machine(tmp_path):
    """Issue 37's second session holds only the answer cache at parse time; the plan reads it, and counts an
    answer file and its cache entry once."""
    from draftsmith.plan.data import measured

    data = with_defaults("data", {"max_length": 1024, "regenerate": {"enabled": True, "max_new_tokens": 512}})
    (tmp_path / "prepared").mkdir()
    prompts = pd.DataFrame({"id": ["a", "b"], "num_tokens": [10, 20], "prompt_len": [10, 20]})
    prompts.to_parquet(tmp_path / "prepared/samples.parquet")
    assert measured(tmp_path, data).answer_tokens == 512  # no answers yet: the bound
    (tmp_path / "answers/cache").mkdir(parents=True)
    answers = pd.DataFrame({"id": ["a", "b"], "num_tokens": [110, 320], "prompt_len": [10, 20]})  # 100, 300
    answers.to_parquet(tmp_path / "answers/cache/shard000.parquet")
    size = measured(tmp_path, data)
    assert size.answer_tokens == 200 and "the mean of 2 cached" in size.source
    os.link(tmp_path / "answers/cache/shard000.parquet", tmp_path / "answers/shard000.parquet")
    assert "the mean of 2 cached" in measured(tmp_path, data).source
    # a shard answered by several regeneration jobs: its cache holds one file a job, beside the joined file
    (tmp_path / "answers/cache/shard000.parquet").unlink()
    answers.iloc[:1].to_parquet(tmp_path / "answers/cache/shard000.j0.parquet")
    answers.iloc[1:].to_parquet(tmp_path / "answers/cache/shard000.j1.parquet")
    assert "the mean of 2 cached" in measured(tmp_path, data).source
    for j in (0, 1):  # the answering jobs' own outputs stay beside the joined file
        os.link(
            tmp_path / f"answers/cache/shard000.j{j}.parquet", tmp_path / f"answers/shard000.j{j}.parquet"
        )
    assert "the mean of 2 cached" in measured(tmp_path, data).source
    for f in (tmp_path / "answers").glob("*.parquet"):
        f.unlink()  # the cache alone, as carried to a fresh machine
    size = measured(tmp_path, data)
    assert "the mean of 2 cached" in size.source and size.answer_tokens == 200


def test_the_bench_is_planned_at_the_answers_each_cut_at_its_own_cap():
    """On the H100 study of 2026-12-05 the bench took 0.65 of its plan: answers of 186 tokens on average
    (32% cut at regeneration's 256) were planned as 186 of the bench's 192, where most end sooner and
    the long ones stop at 192."""
    from draftsmith.plan.hours import bench_answer_share

    share = bench_answer_share({"answer_lengths": [100, 150, 256, 256]}, cap=192)
    assert share == pytest.approx((100 + 150 + 192 * 2) / 4 / 192)
    older = bench_answer_share({"answer_tokens_mean": 190.5}, cap=192)  # a rates file without the lengths
    assert older == pytest.approx(190.5 / 192)
    assert bench_answer_share({"answer_tokens_mean": 400.0}, cap=192) == 1.0


def test_a_small_targets_bench_is_planned_at_its_layers_launches_not_its_parameters():
    """The 40k study's ten-epoch run (SmolLM2-135M, 30 layers, one H100) took 32 times the table's bench
    GPU-hours: scaled by parameters from the 27B, a batch-1 step of a 135M target would take 0.17 ms, where
    its 30 layers' launches take about 5. The 27B's bandwidth-bound rate is left as the table has it."""
    from draftsmith.plan.data import DataSize
    from draftsmith.plan.hours import table_hours

    config = load_config(
        [str(REPO / "configs" / f) for f in ("study-smollm2-40k.yaml", "study-smollm2-40k-10ep.yaml")]
    )
    size = DataSize(43_629, 91.0, 253.0, 344.0, "measured", answered=43_629)

    def bench(shape_file: str) -> dict:
        shape = json.loads((REPO / "configs/shapes" / shape_file).read_text())
        hours = table_hours(
            config,
            size,
            shape,
            12_300_000,
            gpu_name="NVIDIA H100 80GB HBM3",
            gpus=8,
            passes=1.0,
            bench_prompts=80,  # 40 a set
        )
        return hours["bench"]

    small, big = bench("smollm2-135m.json"), bench("qwen3.6-27b.json")
    assert small["rate"] == pytest.approx(1 / (30 * 1.6e-4)) and "30 layers" in small["source"]
    # that run's bench: 108.6 GPU-seconds over its 19,968 planned steps, job starts included
    assert 0.8 < 108.6 / 3600 / small["gpu_hours"] < 1.25
    assert (
        big["rate"]
        == pytest.approx(
            40.0
            * 2.6366e10
            / target_params(json.loads((REPO / "configs/shapes/qwen3.6-27b.json").read_text()))
        )
        and "layers" not in big["source"]
    )


def test_a_small_targets_answers_are_planned_at_their_layers_launches_not_its_parameters():
    """The 40k study's math run decoded 52,089 answers of 245 tokens with SmolLM2-135M (30 layers) in 340 s
    on one H100, where the table scaled by parameters from the 27B said 602,908 new tokens/s, 21 s: each
    answer's admission and decode steps are launched layer by layer. The 27B's rate is left as it is."""
    from draftsmith.plan.data import DataSize
    from draftsmith.plan.hours import table_hours

    files = ("study-smollm2-40k.yaml", "study-smollm2-40k-10ep.yaml", "study-smollm2-40k-math.yaml")
    config = load_config([str(REPO / "configs" / f) for f in files])
    size = DataSize(52_089, 94.0, 245.0, 339.0, "measured")  # nothing cached: every answer decoded

    def regeneration(shape_file: str) -> dict:
        shape = json.loads((REPO / "configs/shapes" / shape_file).read_text())
        hours = table_hours(
            config, size, shape, 12_300_000, gpu_name="NVIDIA H100 80GB HBM3", gpus=8, passes=1.0,
            bench_prompts=80,
        )  # fmt: skip
        return hours["regeneration"]

    small, big = regeneration("smollm2-135m.json"), regeneration("qwen3.6-27b.json")
    assert small["rate"] == pytest.approx(245.0 / (30 * 2.2e-4)) and "245-token answers" in small["source"]
    assert (
        0.8 < 340 / 3600 / small["gpu_hours"] < 1.25
    )  # the math run's decode, the prompts' prefill beside it
    shape = json.loads((REPO / "configs/shapes/qwen3.6-27b.json").read_text())
    assert big["rate"] == pytest.approx(4026.0 * 2.6366e10 / target_params(shape))
    assert "answers (scaled" not in big["source"]
