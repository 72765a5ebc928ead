"""The embedded demo: a tiny target built for real (few steps), loaded back the way the pipeline loads a hub
model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftsmith.demo.data import MAX_SAMPLE_TOKENS, build_demo_data, rendered_length, split_files
from draftsmith.demo.target import END_THINK, EOT, IM_END, IM_START, THINK, build_demo_target, demo_config

TINY = dict(
    steps=3, text_bytes=120_000, vocab_size=500, hidden_size=64, num_layers=4, seq_len=64, batch_size=2
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    info = build_demo_target(root / "target", seed=0, threads=2, **TINY)
    build_demo_data(root / "target", root / "data", seed=0, n_train=24, n_prompts=4)
    return root, info


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_split_is_stable_and_disjoint():
    train, held = split_files()
    assert train and held and not set(train) & set(held)
    assert 0.03 < len(held) / (len(train) + len(held)) < 0.2
    assert all(
        "site-packages" not in f and not f.startswith(("test/", "idlelib/", "lib2to3/")) for f in train + held
    )
    assert split_files() == (train, held)


def test_target_loads_like_a_hub_model(built):
    root, info = built
    tok = AutoTokenizer.from_pretrained(root / "target")
    model = AutoModelForCausalLM.from_pretrained(root / "target")
    cfg = model.config
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert {"linear_attention", "full_attention"} <= set(cfg.layer_types)
    assert cfg.vocab_size % 128 == 0 and cfg.vocab_size > len(tok)  # unused ids past the tokenizer
    assert tok.eos_token == IM_END and tok.pad_token == EOT
    assert cfg.eos_token_id == model.generation_config.eos_token_id == tok.convert_tokens_to_ids(IM_END)
    assert cfg.pad_token_id == tok.pad_token_id
    for marker in (IM_START, IM_END, THINK, END_THINK, EOT):
        assert tok.convert_ids_to_tokens(tok(marker, add_special_tokens=False)["input_ids"]) == [marker]
    ids = tok("def f(x):\n    return x\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], cfg.vocab_size) and torch.isfinite(logits).all()
    saved = json.loads((root / "target" / "demo_info.json").read_text())
    assert saved["steps"] == TINY["steps"] and saved["loss_end"] < saved["loss_start"]
    assert not (root / "target.partial").exists()


def test_full_size_config_has_eight_hybrid_layers(built):
    tok = AutoTokenizer.from_pretrained(built[0] / "target")
    cfg = demo_config(tok)
    assert cfg.num_hidden_layers == 8 and cfg.layer_types.count("full_attention") == 2
    assert cfg.layer_types[3] == cfg.layer_types[7] == "full_attention"
    # the shape the plan reads at parse time, without importing the builder, is the one it builds
    from draftsmith.demo.shape import DEMO_SHAPE

    built_shape = {
        k: getattr(cfg, k) for k in DEMO_SHAPE if k != "vocab_size"
    }  # the vocabulary: the tokenizer's
    assert built_shape == {k: v for k, v in DEMO_SHAPE.items() if k != "vocab_size"}


@pytest.mark.parametrize("thinking", [True, False, None])
def test_chat_template_prompt_is_prefix_of_conversation(built, thinking):
    tok = AutoTokenizer.from_pretrained(built[0] / "target")
    kw = {} if thinking is None else {"enable_thinking": thinking}
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Continue:\nimport os"},
    ]
    answer = {"role": "assistant", "content": "import sys\n"}
    prompt = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True, **kw)
    full = tok.apply_chat_template(history + [answer], tokenize=False, **kw)
    assert full.startswith(prompt)
    assert full[len(prompt) :] == "import sys\n<|im_end|>\n"
    think = "<think>\n\n</think>\n\n" if thinking is False else ""
    assert prompt.endswith("<|im_start|>assistant\n" + think)
    assert "<|im_start|>assistant\n" + think + "Hello.<|im_end|>\n<|im_start|>user\n" in prompt


def test_data_files(built):
    root, _ = built
    tok = AutoTokenizer.from_pretrained(root / "target")
    train, prompts = read_jsonl(root / "data" / "train.jsonl"), read_jsonl(root / "data" / "prompts.jsonl")
    assert len(train) == 24 and len(prompts) == 4
    assert len({r["id"] for r in train + prompts}) == 28
    held = set(split_files()[1])
    for r in train:
        user, assistant = r["messages"]
        assert user["role"] == "user" and assistant["role"] == "assistant" and assistant["content"].strip()
        assert user["content"].startswith("Continue this Python file (")
        relpath = user["content"].split("(", 1)[1].split(")", 1)[0]
        assert relpath not in held
        assert rendered_length(tok, r["messages"]) <= MAX_SAMPLE_TOKENS
    relpaths = [p["messages"][0]["content"].split("(", 1)[1].split(")", 1)[0] for p in prompts]
    assert all(len(p["messages"]) == 1 and p["messages"][0]["role"] == "user" for p in prompts)
    assert set(relpaths) <= held and len(set(relpaths)) == len(relpaths)
    assert not list((root / "data").glob("*.partial"))


def test_same_seed_same_build(built, tmp_path):
    root, info = built
    again = build_demo_target(tmp_path / "target", seed=0, threads=2, **TINY)
    assert again["loss_start"] == info["loss_start"] and again["loss_end"] == info["loss_end"]
    a, b = (
        load_file(root / "target" / "model.safetensors"),
        load_file(tmp_path / "target" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (root / "target" / "tokenizer.json").read_bytes() == (
        tmp_path / "target" / "tokenizer.json"
    ).read_bytes()
    build_demo_data(root / "target", tmp_path / "data", seed=0, n_train=24, n_prompts=4)
    for name in ("train.jsonl", "prompts.jsonl"):
        assert (root / "data" / name).read_bytes() == (tmp_path / "data" / name).read_bytes()
    build_demo_data(root / "target", tmp_path / "other", seed=1, n_train=24, n_prompts=4)
    assert (tmp_path / "other" / "train.jsonl").read_bytes() != (root / "data" / "train.jsonl").read_bytes()
