"""The target's answers judged before extraction: a random-weight target's real answers are stopped, with the
statistic, its threshold, some answers and the key; the loop measure, the template's markers and the thinking
switch read as documented; a check turned off knowingly lets the same answers through."""

import json

import numpy as np
import pandas as pd
import pytest

from draftsmith.config import with_defaults
from draftsmith.dataset.answers import (
    CAUSES,
    CHECKED,
    ENV,
    NGRAM,
    WINDOW,
    AnswersRejected,
    answer_flags,
    judge,
    loops,
    template_markers,
)
from draftsmith.dataset.regenerate import regenerate
from draftsmith.target.load import eos_ids_of, load_target

DATA = with_defaults("data", {"max_length": 96, "regenerate": {"enabled": True, "max_new_tokens": 24}})


def rendered(tokenizer, texts: list[str]) -> pd.DataFrame:
    rows = []
    for i, text in enumerate(texts):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        rows.append({"id": f"q{i}", "input_ids": np.asarray(ids, np.int32), "prompt_len": len(ids),
                     "loss_mask": np.zeros(len(ids), np.uint8)})  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def noise(hybrid_target, tokenizer):
    """What a random-weight target really answers to six prompts under its chat template."""
    model, _ = load_target(hybrid_target, [], "fp32")
    samples = rendered(tokenizer, ["def main():", "import os", "class A:", "x = 1", "print(", "for i in"])
    answered, _ = regenerate(model, tokenizer, samples, 24, 0.0, 96, 6, seed=0)
    return answered, eos_ids_of(model, tokenizer)


def test_a_random_weight_target_is_stopped_with_its_answers_shown(noise, tokenizer, monkeypatch):
    answered, eos = noise
    monkeypatch.setenv(ENV, json.dumps({"enabled": False}))  # knowingly: the statistics, no stop
    stats = judge(answered, tokenizer, eos, data=DATA, shard="shard007")
    assert stats["answers"] == 6 and sum(stats["histogram"]["counts"]) == 6
    assert stats["cut"] >= 0.5  # noise rarely says it is done
    monkeypatch.delenv(ENV)  # the defaults
    with pytest.raises(AnswersRejected) as stop:
        judge(answered, tokenizer, eos, data=DATA, shard="shard007")
    text = str(stop.value)
    assert "answers of shard007 judged before extraction (6 answers): stopped" in text
    defaults = with_defaults("data")["regenerate"]["checks"]
    failed = [n for n in CHECKED if stats[n] is not None and stats[n] > defaults[f"max_{n}"]]
    assert failed
    for name in failed:  # each failed check: its share, its threshold, the causes, answers that did it
        line = f"- {name}: {stats[name]:.1%} of the answers, above data.regenerate.checks.max_{name} = "
        assert line in text and f"Likely: {CAUSES[name]}" in text
        assert f"    {stats['ids'][name][0]}: '" in text
    assert "data.regenerate.checks.enabled: false" in text
    monkeypatch.setenv(ENV, json.dumps({f"max_{name}": None for name in CHECKED}))  # each check off
    assert judge(answered, tokenizer, eos, data=DATA, shard="shard007")["cut"] == stats["cut"]


def test_a_loop_is_a_run_seen_twice_within_the_window():
    run = list(range(100, 100 + NGRAM))
    assert loops(run + [7] + run)
    assert not loops(list(range(WINDOW * 2)))
    assert not loops(run[:-1] + [7] + run[:-1])  # one token short of the run
    assert not loops(run + list(range(1000, 1000 + WINDOW)) + run[1:])  # the first run is out of the window


def test_markers_come_from_the_template_and_answers_are_read_for_them(tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    think, end_think = (tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>"))
    markers = template_markers(tokenizer, [eos])
    assert start in markers.turn and eos not in markers.turn
    assert (markers.think_open, markers.think_close) == (think, end_think)
    words = tokenizer("a plain answer")["input_ids"]
    plain = answer_flags(words + [eos], room=64, markers=markers, thinking=False)
    assert plain == {"ended": True, "cut": False, "empty": False, "repeats": False, "new_turn": False,
                     "thinking_mismatch": False}  # fmt: skip
    assert answer_flags(words + [start] + words, room=64, markers=markers, thinking=False)["new_turn"]
    thought = [think] + words + [end_think] + words + [eos]
    assert answer_flags(thought, room=64, markers=markers, thinking=False)["thinking_mismatch"]
    assert not answer_flags(thought, room=64, markers=markers, thinking=True)["thinking_mismatch"]
    assert answer_flags(words + [eos], room=64, markers=markers, thinking=True)["thinking_mismatch"]
    assert answer_flags(words, room=len(words), markers=markers, thinking=False)["cut"]
    assert answer_flags([eos], room=64, markers=markers, thinking=False)["empty"]


def test_a_shards_answers_join_in_its_order_and_a_missing_one_is_refused_with_the_files_to_delete():
    from draftsmith.steps.join_answers import join

    shard = pd.DataFrame({"id": ["a", "b", "c"], "n": [1, 2, 3]})
    parts = [shard.iloc[[0, 2]], shard.iloc[[1]]]  # every 2nd sample each
    joined = join(shard, parts, name="shard000")
    assert joined["id"].tolist() == ["a", "b", "c"] and joined["n"].tolist() == [1, 2, 3]
    with pytest.raises(SystemExit, match=r"shard000's 2 jobs .* RESULTS/answers/shard000\.j\*\.parquet"):
        join(shard, [shard.iloc[[0, 2]], shard.iloc[[0]]], name="shard000")
