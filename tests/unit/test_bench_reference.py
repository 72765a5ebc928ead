"""The target's answers to the bench prompts, decoded once by a reference job and read by each drafter's bench
job: the records must be the ones a bench job that decodes them itself writes, and a reference made for
other prompts or settings must be refused, naming the file."""

import json

import pytest
from conftest import save_untrained_drafter

from draftsmith.config import with_defaults
from draftsmith.speculative.bench import run_bench
from draftsmith.speculative.reference import run_reference

TIMINGS = ("ar_seconds", "seconds")  # a reference job's decode is timed in that job


def _prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    texts = ["def main():", "import os", "x = 1", "for i in range(3):"]
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(texts)))
    return path


def _records(path):
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_bench_on_the_reference_writes_what_a_bench_decoding_itself_writes(
    attention_target, tmp_path, temperature
):
    save_untrained_drafter(attention_target, tmp_path / "drafter")
    prompts = _prompts(tmp_path)
    bench = with_defaults("bench", {"max_new_tokens": 10, "methods": ["ar", "dflash", "ddtree"],
                                    "ddtree_budgets": [4], "real_loop": False, "warmup": 1,
                                    "fp32_check_prompts": 0, "temperature": temperature})  # fmt: skip
    tcfg = with_defaults("target", {"model": str(attention_target)})
    where = {"prompts_path": str(prompts), "part": 1, "parts": 2, "dataset": "d", "gpus": 0, "bench": bench}
    where["target_cfg"] = tcfg
    ref = tmp_path / "reference.jsonl"
    assert run_reference(str(attention_target), out_path=str(ref), **where) == 2  # prompts 1 and 3
    rows = [json.loads(x) for x in ref.read_text().splitlines()]
    assert [r["index"] for r in rows[1:]] == [0, 1] and all(len(r["greedy"]) == 10 for r in rows[1:])
    assert all((r["sampled"] is not None) == (temperature > 0) for r in rows[1:])
    assert not (tmp_path / "reference.jsonl.partial").exists()

    drafter = str(tmp_path / "drafter")
    own, read = tmp_path / "own.jsonl", tmp_path / "read.jsonl"
    run_bench(str(attention_target), drafter, out_path=str(own), **where)
    run_bench(str(attention_target), drafter, out_path=str(read), reference_path=str(ref), **where)
    got, want = _records(read), _records(own)
    assert len(got) == 2 * 3 and got == want
    ar = [json.loads(x) for x in read.read_text().splitlines() if json.loads(x)["method"] == "ar"]
    assert [r["ar_seconds"] for r in ar] == [r["ar_seconds"] for r in rows[1:]]  # the reference's clock


def test_a_reference_made_otherwise_is_refused_naming_its_file(attention_target, tmp_path):
    save_untrained_drafter(attention_target, tmp_path / "drafter")
    prompts = _prompts(tmp_path)
    bench = with_defaults("bench", {"max_new_tokens": 6, "methods": ["dflash"], "real_loop": False,
                                    "warmup": 0, "fp32_check_prompts": 0})  # fmt: skip
    tcfg = with_defaults("target", {"model": str(attention_target)})
    where = {
        "prompts_path": str(prompts),
        "part": 0,
        "parts": 1,
        "dataset": "d",
        "gpus": 0,
        "target_cfg": tcfg,
    }
    ref = tmp_path / "reference.jsonl"
    run_reference(str(attention_target), out_path=str(ref), bench=bench, **where)
    drafter, out = str(tmp_path / "drafter"), str(tmp_path / "out.jsonl")
    longer = {**bench, "max_new_tokens": 7}
    missing = str(tmp_path / "no-drafter")  # refused from the file's first line, before any model loads
    with pytest.raises(ValueError, match="reference.jsonl: the target's answers were made for another"):
        run_bench(
            str(attention_target), missing, out_path=out, reference_path=str(ref), bench=longer, **where
        )
    with pytest.raises(ValueError, match="real_loop: the real loops are timed against this job's own decode"):
        real = {**bench, "real_loop": True}
        run_bench(str(attention_target), missing, out_path=out, reference_path=str(ref), bench=real, **where)
    # tampered tokens (another tokenizer's): refused too, naming the prompt
    rows = [json.loads(x) for x in ref.read_text().splitlines()]
    rows[2]["prompt_ids"] = rows[2]["prompt_ids"][:-1]
    ref.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="reference.jsonl: prompt 1 was tokenized otherwise"):
        run_bench(str(attention_target), drafter, out_path=out, reference_path=str(ref), bench=bench, **where)
    # a method or budget change keeps the reference: it holds no drafter setting
    run_reference(str(attention_target), out_path=str(ref), bench=bench, **where)
    fine = {**bench, "methods": ["dflash", "ddtree"], "ddtree_budgets": [4]}
    assert run_bench(
        str(attention_target), drafter, out_path=out, reference_path=str(ref), bench=fine, **where
    )
