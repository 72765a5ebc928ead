"""Data preparation: chat rendering and loss masks, errors that name file and line, deterministic shards."""

import json

import numpy as np
import pytest
from conftest import BAD, GOOD

from draftsmith.dataset.prepare import BadRecord, prepare
from draftsmith.dataset.shard import assign_shards


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_loss_mask_covers_assistant_turns_only(tokenizer, tmp_path):
    rec = {
        "id": "a",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "say hi"},
            {"role": "assistant", "content": "hi there"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "hello again"},
        ],
    }
    path = write_jsonl(tmp_path / "d.jsonl", [rec, {"prompt": "p?", "response": "r!"}])
    df, stats = prepare(str(path), tokenizer, max_length=512, thinking=False)
    assert stats.samples == 2 and df["id"].tolist() == ["a", "d:2"]
    ids, mask = df["input_ids"][0], df["loss_mask"][0].astype(bool)
    trained = tokenizer.decode(ids[mask])
    assert "hi there" in trained and "hello again" in trained
    assert "say hi" not in trained and "be brief" not in trained and "again<" not in trained.split("hello")[0]
    # prompt_len marks the start of the last assistant turn
    assert mask[df["prompt_len"][0]] and not mask[df["prompt_len"][0] - 1]


def test_bad_records_name_file_and_line(tokenizer, tmp_path):
    path = write_jsonl(
        tmp_path / "bad.jsonl",
        [
            {"prompt": "ok", "response": "fine"},
            "{not json",
            {"messages": [{"role": "user", "content": "no answer"}]},
            {"text": "neither format"},
            {"messages": [{"role": "wizard", "content": "x"}]},
        ],
    )
    with pytest.raises(BadRecord, match=r"bad\.jsonl:2: invalid JSON"):
        prepare(str(path), tokenizer, 512, False)
    df, stats = prepare(str(path), tokenizer, 512, False, on_bad_record="skip")
    assert len(df) == 1 and stats.skipped == 4 and stats.records == 5


def test_truncation_is_counted(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "x", "response": "word " * 400}])
    df, stats = prepare(str(path), tokenizer, max_length=64, thinking=False)
    assert stats.truncated == 1 and df["num_tokens"][0] == 64


def test_shards_balanced_and_deterministic():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 1000, size=200).tolist()
    ids = [f"id{i}" for i in range(200)]
    a = assign_shards(lengths, ids, 4)
    assert a == assign_shards(lengths, ids, 4)
    loads = [sum(n for n, s in zip(lengths, a) if s == k) for k in range(4)]
    assert max(loads) - min(loads) <= max(lengths)
    # order of the input does not matter: same id -> same shard
    perm = rng.permutation(200)
    b = assign_shards([lengths[i] for i in perm], [ids[i] for i in perm], 4)
    assert all(b[j] == a[i] for j, i in enumerate(perm))


def test_prompt_only_records_are_samples_when_the_target_writes_the_answers(tokenizer, tmp_path):
    """Before, prompt-only data was refused (`no assistant turn to train on`) even with regeneration on."""
    rows = [
        {"id": "p", "prompt": "write a haiku"},
        {
            "id": "m",
            "messages": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}],
        },
        {"id": "full", "prompt": "q", "response": "a"},
    ]
    path = write_jsonl(tmp_path / "prompts.jsonl", rows)
    with pytest.raises(BadRecord, match=r"prompts\.jsonl:1: no assistant turn.*data\.regenerate\.enabled"):
        prepare(str(path), tokenizer, 512, False)
    df, stats = prepare(str(path), tokenizer, 512, False, regenerate=True)
    assert stats.samples == 3 and df["id"].tolist() == ["p", "m", "full"]
    for k in (0, 1):  # the whole sample is the prompt, ending in the template's generation prompt
        ids = df["input_ids"][k]
        assert df["prompt_len"][k] == len(ids) and not df["loss_mask"][k].any()
        messages = [{"role": "user", "content": "write a haiku"}] if k == 0 else rows[1]["messages"]
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        assert tokenizer.decode(ids) == text
    assert df["loss_mask"][2].any()  # a record with an answer keeps it until the target replaces it


def test_a_prompt_that_fills_max_length_leaves_no_room_for_an_answer(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "word " * 200}])
    with pytest.raises(BadRecord, match="the prompt fills max_length=32: no room for an answer"):
        prepare(str(path), tokenizer, 32, False, regenerate=True)


def test_prepare_stops_when_the_tokenizer_is_another_models(tokenizer, tmp_path):
    """A tokenizer whose ids run past the target's embedding rows would fail inside the first extraction as an
    index error; the prepare step names config.json and the sample instead, and writes nothing."""
    from conftest import build_target

    from draftsmith.steps.prepare import main

    target = build_target(tmp_path / "target", tokenizer, "attention", layers=2)
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "say hi " * 20, "response": "hi there " * 20}])
    args = ["--target", str(target), "--data", str(data), "--data-json", "{}"]
    main([*args, "--out", str(tmp_path / "ok.parquet"), "--stats", str(tmp_path / "ok.json")])
    assert (tmp_path / "ok.parquet").exists()  # its own tokenizer passes
    cfg = json.loads((target / "config.json").read_text())
    cfg["vocab_size"] = 64  # the tokenizer's ids go up to about 400
    (target / "config.json").write_text(json.dumps(cfg))
    named = r"sample d:1 has token id \d+, but .*config\.json gives vocab_size 64"
    with pytest.raises(SystemExit, match=named):
        main([*args, "--out", str(tmp_path / "bad.parquet"), "--stats", str(tmp_path / "bad.json")])
    assert not (tmp_path / "bad.parquet").exists()


def test_repeated_records_and_the_benchs_prompts_are_left_out_and_counted(tokenizer, tmp_path):
    from draftsmith.dataset.overlap import BenchScreen

    question = "Natalia sold clips to 48 of her friends in April and then she sold half as many clips in May"
    rows = [
        {"id": "a", "prompt": "write  a haiku"},
        {"id": "b", "prompt": "write a haiku", "response": "old pond"},  # the same prompt, whitespace aside
        {"id": "c", "question": question + ". How many clips did she sell?"},  # the bench's, word for word
        {"id": "d", "prompt": "Solve: " + question.lower() + ", and explain."},  # 13 of its words in a row
        {"id": "e", "prompt": "Natalia sold clips to 48 of her friends"},  # 8 words: phrasing, not the prompt
        {"id": "f", "prompt": "write a limerick"},
    ]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    screen = BenchScreen([[{"role": "user", "content": question + ".  How many clips did she sell?"}]])
    df, stats = prepare(str(path), tokenizer, 512, False, regenerate=True, dedupe=True, screen=screen)
    assert df["id"].tolist() == ["a", "e", "f"]
    assert (stats.duplicates, stats.bench_overlap, stats.samples, stats.records) == (1, 2, 3, 6)
    # without regeneration a record's answer is part of the sample: the same prompt, another answer, is kept
    answered = [{"prompt": "q", "response": r} for r in ("a", "b", "a")]
    df, stats = prepare(str(write_jsonl(tmp_path / "qa.jsonl", answered)), tokenizer, 512, False, dedupe=True)
    assert df["id"].tolist() == ["qa:1", "qa:2"] and stats.duplicates == 1
    df, stats = prepare(str(path), tokenizer, 512, False, regenerate=True)
    assert len(df) == 6 and (stats.duplicates, stats.bench_overlap) == (0, 0)  # both off by default

    # regeneration rewrites the last answer only: an earlier one still tells two conversations apart
    def chat(first: str) -> list[dict]:
        said = [("user", "hi"), ("assistant", first), ("user", "and?"), ("assistant", "x")]
        return [{"role": r, "content": c} for r, c in said]

    turns = [chat(a) for a in ("1", "2", "1")]
    chats = write_jsonl(tmp_path / "chats.jsonl", [{"messages": t} for t in turns])
    df, stats = prepare(str(chats), tokenizer, 512, False, regenerate=True, dedupe=True)
    assert len(df) == 2 and stats.duplicates == 1


def test_records_of_other_shapes_take_the_first_template_whose_fields_they_have(tokenizer, tmp_path):
    """Public math sets keep their question in fields of their own (SVAMP's `Body` and `Question`, MathQA's
    `Problem`); data.templates makes their prompts without a converted copy of the file."""
    rows = [
        {"ID": "chal-1", "Body": "Jack had 8 pens.", "Question": "How many are left if he gives 3 away?"},
        {"Problem": "a train covers 36 km in 0.5 hours . its speed ?", "options": "a ) 72 , b ) 18"},
        {"text": "a document"},
    ]
    path = write_jsonl(tmp_path / "math.jsonl", rows)
    templates = ["{Body} {Question}", "{Problem}\n\nOptions: {options}"]
    with pytest.raises(BadRecord, match=r"math\.jsonl:3: record has neither .*data\.templates"):
        prepare(str(path), tokenizer, 512, False, regenerate=True, templates=templates)
    df, stats = prepare(
        str(path), tokenizer, 512, False, regenerate=True, templates=templates, on_bad_record="skip"
    )
    assert stats.samples == 2 and stats.skipped == 1
    prompts = ["Jack had 8 pens. How many are left if he gives 3 away?", templates[1].format_map(rows[1])]
    for k, prompt in enumerate(prompts):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )
        assert tokenizer.decode(df["input_ids"][k]) == text
    # a known shape comes first: GSM8K's `question` is read as before, whatever the templates
    gsm = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "1 + 1?", "Body": "x", "Question": "y"}])
    df, _ = prepare(str(gsm), tokenizer, 512, False, regenerate=True, templates=templates)
    assert "1 + 1?" in tokenizer.decode(df["input_ids"][0]) and "x y" not in tokenizer.decode(
        df["input_ids"][0]
    )


# bad data (issue 6): moved from tests/workflow/test_faults.py, whose CLI test goes on from here
@pytest.mark.parametrize("kind", list(BAD))
def test_bad_record_names_file_line_and_problem(tmp_path, tokenizer, kind):
    """6. Each kind of bad record stops prepare at its file and line, with the problem and what to do."""
    line, problem = BAD[kind]
    path = tmp_path / "data.jsonl"
    path.write_text(f"{GOOD}\n{line}\n")
    with pytest.raises(BadRecord) as e:
        prepare(str(path), tokenizer, 128, False)
    assert str(e.value).startswith(f"{path}:2: ") and problem in str(e.value)
    assert "data.on_bad_record: skip" in str(e.value)


def test_long_and_empty_data(tmp_path, tokenizer):
    """6. Longer than max_length: truncated and counted (an error only when no assistant token is left); an
    empty data set: an error naming the file."""
    path = tmp_path / "long.jsonl"
    path.write_text(
        json.dumps({"prompt": "x = 1\n" * 10, "response": "y = 2\n" * 200})
        + "\n"
        + json.dumps({"prompt": "x = 1\n" * 200, "response": "y"})
        + "\n"
    )
    with pytest.raises(BadRecord, match=rf"{path}:2: no assistant token left within max_length=64"):
        prepare(str(path), tokenizer, 64, False)
    samples, stats = prepare(str(path), tokenizer, 64, False, on_bad_record="skip")
    assert len(samples) == 1 and stats.truncated == 2 and stats.skipped == 1
    assert samples["num_tokens"].max() == 64
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(BadRecord, match=rf"{empty}: the data set is empty"):
        prepare(str(empty), tokenizer, 64, False)
