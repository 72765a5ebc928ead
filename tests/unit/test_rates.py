"""The rates job on a GPU listed twice (two slots): both copies are timed at once and their throughputs added
per GPU, and the plan reads the figures. On the CPU the rounds workflow test runs the same job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO, build_target

from draftsmith.config import with_defaults
from draftsmith.plan.hours import node_rates
from draftsmith.plan.timing import synthetic_samples

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="times copies sharing a GPU")


def test_two_slots_of_one_gpu_are_timed_together(tmp_path, tokenizer):
    target = build_target(tmp_path / "target", tokenizer, "attention", layers=8, hidden=64)
    res = tmp_path / "results"
    res.mkdir()
    env = dict(os.environ, DRAFTSMITH_GPUS="0,0", DRAFTSMITH_GPU_POOL=str(tmp_path / "pool"))
    extract = json.dumps(with_defaults("extract", {"token_budget": 4096}))
    regen = {"enabled": True, "batch_size": 16}
    data = json.dumps(with_defaults("data", {"max_length": 256, "regenerate": regen}))
    subprocess.run([sys.executable, "-m", "draftsmith.steps.probe", "--target", str(target), "--extract-json",
                    extract, "--taps-json", "{}", "--max-length", "256", "--out", str(res / "probe.json")],
                   check=True, cwd=REPO, env=env)  # fmt: skip
    train = json.dumps({"anchors_per_seq": 8, "token_budget": 2048, "dtype": "bf16"})
    drafter = json.dumps({"num_layers": 1, "block_size": 4})
    samples = synthetic_samples(24, 48, prompt=32, vocab=len(tokenizer))  # prompts as a prepared shard holds
    samples.to_parquet(res / "shard000.parquet")
    args = ["--target", str(target), "--probe", str(res / "probe.json"), "--samples",
            str(res / "shard000.parquet"), "--target-json", "{}", "--data-json", data, "--extract-json",
            extract, "--drafter-json", drafter, "--train-json", train]  # fmt: skip
    subprocess.run([sys.executable, "-m", "draftsmith.steps.rates", *args, "--out", str(res / "rates.json")],
                   check=True, cwd=REPO, env=env)  # fmt: skip
    timed = node_rates({"results": str(res), "plan": {"rates": "node"}})
    assert timed is not None and timed["rates"]["copies"] == 2 and len(timed["per_copy"]) == 2
    per_copy = [c["extract_tokens_s"] for c in timed["per_copy"]]
    assert timed["rates"]["extract_tokens_s"] == pytest.approx(sum(per_copy))  # one GPU: added
    for key in ("regenerate_new_tokens_s", "answer_tokens_mean", "bench_tokens_s", "load_s", "train_start_s"):
        assert timed["rates"][key] > 0, key
    assert 0 < timed["rates"]["train_end_s"] < 60  # the timing process's exit, after its result
    lengths = timed["rates"]["answer_lengths"]  # one a prompt answered, as long as the mean says
    assert len(lengths) == 20 and sum(lengths) / 20 == pytest.approx(timed["rates"]["answer_tokens_mean"])
    assert timed["rates"]["load_s"] == pytest.approx(sum(c["load_s"] for c in timed["per_copy"]) / 2)
    assert timed["device"] != "cpu"
