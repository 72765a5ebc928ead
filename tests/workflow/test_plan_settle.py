"""The rounds of a run whose first parse could only estimate the data: the plan rule weighs them on the prepared
shards and the answers already cached, keeps that count, and stops the run when the DAG was built with another;
the next parse plans the kept count."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import yaml
from conftest import job_counts, make_workflow, snakemake

RECORDS = 24
BUDGET = 260_000  # bytes: three rounds of the 24 samples at their bound, one at their cached answers' length


def _short_data(root: Path) -> dict:
    """Prompts of a few tokens whose bound (prompt plus 64 new tokens) reaches max_length, estimated or not."""
    data = root / "short.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": f"def f{i}(x):"}) + "\n" for i in range(RECORDS))
    )
    regen = {"enabled": True, "max_new_tokens": 64, "checks": {"enabled": False}}
    return {"path": str(data), "max_length": 64, "regenerate": regen}


def test_a_dag_built_from_an_estimate_is_stopped_and_replanned_on_the_prepared_shards(tmp_path, tokenizer):
    config = make_workflow(
        tmp_path, tokenizer, extract={"shards": 2, "disk_budget": BUDGET}, data=_short_data(tmp_path)
    )
    cfg = yaml.safe_load(config.read_text())
    # the samples' ids and prompt lengths, prepared apart; their answers cached, four tokens each, as an
    # earlier session's answers are carried to a fresh machine
    scratch = dict(cfg, results=str(tmp_path / "scratch"))
    (tmp_path / "scratch.yaml").write_text(yaml.safe_dump(scratch))
    snakemake("--configfile", str(tmp_path / "scratch.yaml"), "--until", "shard")
    res = tmp_path / "results"
    (res / "answers/cache").mkdir(parents=True)
    for shard in sorted((tmp_path / "scratch/shards").glob("*.parquet")):
        df = pd.read_parquet(shard, columns=["id", "prompt_len"])
        df.assign(num_tokens=df["prompt_len"] + 4).to_parquet(res / f"answers/cache/{shard.stem}.parquet")

    dry = snakemake("-n", "--configfile", str(config)).stdout
    assert job_counts(dry).get("extract_round", 0) > 0, dry[-2000:]  # the estimate: every sample at its bound
    assert not (res / "plan/rounds.json").exists()  # an estimate is not kept
    run = snakemake("--configfile", str(config), "--until", "plan", check=False)
    log = (res / "logs/plan.log").read_text()
    assert run.returncode != 0 and "weighed on the prepared shards, the rounds are 1" in log, log[-2000:]
    assert json.loads((res / "plan/rounds.json").read_text())["rounds"] == 1
    assert not list(res.glob("rounds/e*/*.safetensors"))

    again = snakemake("-n", "--configfile", str(config)).stdout
    counts = job_counts(again)
    assert "extract_round" not in counts and counts.get("extract", 0) == 2, counts
    snakemake("--configfile", str(config), "--until", "plan")
    assert json.loads((res / "plan.json").read_text())["rounds"] == 1


def test_a_subset_refused_in_the_bounds_rounds_names_the_answers_first_way(tmp_path, tokenizer):
    """train.max_samples is refused in rounds; where the rounds rest on the answers' bound, the refusal says that
    decoding the answers first may leave one round, and with them known the same config runs in one round."""
    config = make_workflow(
        tmp_path,
        tokenizer,
        extract={"shards": 2, "disk_budget": BUDGET},
        data=_short_data(tmp_path),
        train={"max_samples": 12},
    )
    refused = snakemake("-n", "--configfile", str(config), check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "train.max_samples / train.max_steps: not used in" in said, said[-3000:]
    assert "sized at the answers' bound" in said and "`snakemake answers`" in said

    # the answers known (four tokens each, as `snakemake answers` would leave them in the cache)
    cfg = yaml.safe_load(config.read_text())
    scratch = dict(cfg, results=str(tmp_path / "scratch"), train=dict(cfg["train"], max_samples=None))
    (tmp_path / "scratch.yaml").write_text(yaml.safe_dump(scratch))
    snakemake("--configfile", str(tmp_path / "scratch.yaml"), "--until", "shard")
    cache = Path(cfg["results"]) / "answers/cache"
    cache.mkdir(parents=True)
    for shard in sorted((tmp_path / "scratch/shards").glob("*.parquet")):
        df = pd.read_parquet(shard, columns=["id", "prompt_len"])
        df.assign(num_tokens=df["prompt_len"] + 4).to_parquet(cache / f"{shard.stem}.parquet")
    shutil.copytree(tmp_path / "scratch/prepared", Path(cfg["results"]) / "prepared")
    shutil.copytree(tmp_path / "scratch/shards", Path(cfg["results"]) / "shards")
    counts = job_counts(snakemake("-n", "--configfile", str(config)).stdout)
    assert "extract_round" not in counts and counts.get("extract", 0) == 2, counts
