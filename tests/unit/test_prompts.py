"""Benchmark prompt files: the common shapes read as chat messages, bad lines named by FILE:LINE."""

import json

import pytest

from draftsmith.config import with_defaults
from draftsmith.dataset.prepare import BadRecord
from draftsmith.dataset.prompts import read_prompts
from draftsmith.preflight import bench_problems


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_common_shapes_become_a_user_turn(tmp_path):
    path = write(
        tmp_path / "p.jsonl",
        [
            {"task_id": "HumanEval/0", "prompt": "def f():"},
            {"question": "2 + 2?", "answer": "4"},  # GSM8K
            {"question_id": 81, "turns": ["first", "second"]},  # MT-Bench
            {"instruction": "sum", "input": "1 2"},  # Alpaca
            {"instruction": "who?", "context": "a passage", "response": "r", "category": "qa"},  # Dolly
            {"instruction": "name one", "context": "", "response": "r"},  # Dolly, no passage
            {
                "id": "c",
                "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
            },
        ],
    )
    got = read_prompts(path)
    assert [r["id"] for r in got] == ["HumanEval/0", "p:2", "81", "p:4", "p:5", "p:6", "c"]
    assert [r["messages"][-1]["content"] for r in got] == [
        "def f():",
        "2 + 2?",
        "first",
        "sum\n\n1 2",
        "who?\n\na passage",  # before, Dolly's passage was dropped and the question asked about nothing
        "name one",
        "u",
    ]
    assert all(r["messages"][-1]["role"] == "user" for r in got)


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"text": "x"}', "p.jsonl:2: no prompt field: a prompt record needs one of messages, prompt"),
        ("{oops", "p.jsonl:2: invalid JSON"),
        ('{"turns": []}', "p.jsonl:2: `turns` must be a non-empty list of strings"),
        ('{"prompt": "a", "id": 1}', "p.jsonl:2: duplicate id '1'"),
    ],
    ids=["no-field", "json", "turns", "duplicate"],
)
def test_a_bad_line_is_named_and_stops_the_bench_before_any_job(tmp_path, bad, message):
    """Before, a raw GSM8K or MT-Bench file failed after training with a bare KeyError, and bad lines were
    dropped silently."""
    path = write(tmp_path / "p.jsonl", [{"prompt": "fine", "id": 1}, bad])
    with pytest.raises(BadRecord) as err:
        read_prompts(path)
    assert str(err.value).startswith(f"{path[: -len('p.jsonl')]}{message}")
    cfg = {"results": str(tmp_path / "results"), "bench": with_defaults("bench", {"datasets": []})}
    cfg["bench"]["datasets"] = [{"name": "mine", "path": path}, {"name": "gone", "path": "no/such.jsonl"}]
    problems = bench_problems(cfg)
    assert problems[0].startswith("bench.datasets[mine].path: ") and message in problems[0]
    assert problems[1] == "bench.datasets[gone].path: no/such.jsonl: no such file"
