"""`python -m draftsmith init`: the config it writes for real target shapes, a tiny local model without
padding rows, the demo architecture and a hub id read from an offline cache is valid YAML, passes the schema
and the preflight, and stands on its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, tiny_model
from snakemake.utils import validate
from tokenizers import AddedToken
from transformers import AutoTokenizer

from draftsmith.config import SCHEMA, default_taps
from draftsmith.demo.target import demo_config
from draftsmith.init import DRAFTER_WINDOW, main
from draftsmith.preflight import preflight
from draftsmith.target.mask import eos_ids_on_disk, reserved_ids, template_ids

SHAPES = sorted((REPO / "configs" / "shapes").glob("*.json"))
# The hub ids the presets (configs/*.yaml) write as target.model; a shape without a preset takes its hub id.
NAMES = {
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3.6-27b": "Qwen/Qwen3.6-27B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "qwen3.5-35b-a3b": "Qwen/Qwen3.5-35B-A3B",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
}
# The mask token init takes for a shape alone: z-lab's id of the family, none for Llama (no tokenizer read).
MASKS = {"qwen3-8b": 151669, "qwen3.6-27b": 248070, "qwen3.5-35b-a3b": 248070, "llama-3.1-8b": None,
         "smollm2-135m": None}  # fmt: skip
RESERVED = ("<|reserved_0|>", "<|reserved_1|>")


@pytest.fixture
def inputs(tmp_path) -> list[str]:
    """--data and --prompts on real files: preflight reads every prompt file through."""
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "Write a haiku."}) + "\n")
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n")
    return ["--data", str(tmp_path / "train.jsonl"), "--prompts", str(tmp_path / "prompts.jsonl")]


def init(out: Path, *args: str) -> tuple[dict, str]:
    """Runs init into `out`; the config as the workflow sees it (validated, defaults filled) and the text with
    each comment's lines joined."""
    assert main([*args, "--out", str(out)]) == 0
    text = out.read_text()
    cfg = yaml.safe_load(text)
    validate(cfg, str(SCHEMA))
    return cfg, re.sub(r"\n *# ", " ", text)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda p: p.stem)
def test_shape_configs_stand_on_their_own(shape, tmp_path, inputs, capsys):
    cfg, text = init(tmp_path / "config.yaml", str(shape), "--name", NAMES[shape.stem], *inputs)
    top = json.loads(shape.read_text())
    fields = top.get("text_config", top)
    assert preflight(cfg) == []
    assert cfg["target"]["model"] == NAMES[shape.stem]
    assert cfg["target"]["expect"] == {
        k: fields[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size")
    } | {"layer_kinds": ["full_attention", "linear_attention"] if "qwen3_5" in fields["model_type"] else
         ["full_attention"]}  # fmt: skip
    assert cfg["taps"]["layers"] == default_taps(fields["num_hidden_layers"])
    assert cfg["target"]["mask_token_id"] == MASKS[shape.stem]
    if MASKS[shape.stem] is None:
        assert "SET THIS" in text and "mask_token_id is null" in capsys.readouterr().err
    assert cfg["data"]["path"] != "demo" and cfg["bench"]["datasets"][0]["path"] == inputs[-1]
    assert cfg["data"]["regenerate"]["enabled"] is True
    if shape.stem == "qwen3.6-27b":  # a hybrid of 262144 positions: z-lab's Qwen3.6-27B drafter layout
        assert cfg["drafter"]["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
        assert cfg["drafter"]["sliding_window"] == DRAFTER_WINDOW
    else:
        assert cfg["drafter"]["layer_types"] is None and cfg["drafter"]["sliding_window"] is None


def test_qwen3_8b_comments_derive_the_drafter_shape(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths, as a user writes them
    (tmp_path / "shape.json").write_text((REPO / "configs/shapes/qwen3-8b.json").read_text())
    _, text = init(Path("config.yaml"), "shape.json", "--name", "Qwen/Qwen3-8B")
    assert all(len(line) <= 110 for line in Path("config.yaml").read_text().splitlines())
    assert "hidden_size 4096, num_heads 32, num_kv_heads 8, head_dim 128, intermediate_size 12288" in text
    assert "z-lab's released Qwen3 drafters" in text


@pytest.fixture(scope="module")
def unpadded_target(tmp_path_factory, tokenizer) -> Path:
    """A tiny model whose embedding has a row per token and none to spare (as SmolLM2), with two unused
    special tokens."""
    root = tmp_path_factory.mktemp("unpadded")
    tokenizer.save_pretrained(root / "tokenizer")
    tok = AutoTokenizer.from_pretrained(root / "tokenizer")  # a copy: the session's tokenizer stays as it is
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in RESERVED], special_tokens=True)
    model = tiny_model(
        "attention", len(tok), layers=8, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    return root / "target"


def test_unpadded_vocabulary_takes_an_unused_special_token(unpadded_target, tmp_path, inputs):
    cfg, text = init(tmp_path / "config.yaml", str(unpadded_target), *inputs)
    tok = AutoTokenizer.from_pretrained(unpadded_target)
    mask = cfg["target"]["mask_token_id"]
    assert len(tok) == cfg["target"]["expect"]["vocab_size"]  # no padding row to take
    assert mask == tok.convert_tokens_to_ids(RESERVED[-1])
    assert mask not in template_ids(tok) | reserved_ids(tok, eos_ids_on_disk(unpadded_target))
    assert "a special token that neither the chat template nor bos/eos/pad use" in text
    assert cfg["target"]["model"] == str(unpadded_target) and cfg["results"] == "results/target"
    assert preflight(cfg) == []


def test_demo_architecture_takes_a_padding_row_and_full_attention(tmp_path, tokenizer, inputs):
    """The demo's hybrid (Gated DeltaNet + full attention) of 4096 positions: its config and tokenizer are
    what init reads (the weights are not)."""
    target = tmp_path / "demo-target"
    demo_config(tokenizer).save_pretrained(target)
    tokenizer.save_pretrained(target)
    cfg, text = init(tmp_path / "config.yaml", str(target), *inputs)
    assert cfg["target"]["mask_token_id"] == len(tokenizer)  # the first padding row
    assert "the first padding row" in text
    assert cfg["drafter"]["layer_types"] is None and "mixes in linear_attention layers" in text
    assert cfg["data"]["max_length"] == 4096
    assert preflight(cfg) == []


def test_refuses_to_overwrite_without_force(tmp_path, inputs):
    out, shape = tmp_path / "config.yaml", str(REPO / "configs/shapes/qwen3-8b.json")
    out.write_text("mine\n")
    with pytest.raises(SystemExit, match="exists; pass --force"):
        main([shape, "--name", "Qwen/Qwen3-8B", "--out", str(out)])
    assert out.read_text() == "mine\n"
    cfg, _ = init(
        out, shape, "--name", "Qwen/Qwen3-8B", "--force", "--mask-token-id", "151700", "--gpus", "8"
    )
    assert cfg["target"]["mask_token_id"] == 151700 and cfg["train"]["gpus"] == 8
    with pytest.raises(SystemExit, match="--name"):
        main([shape, "--out", str(tmp_path / "other.yaml")])


def test_hub_id_from_the_offline_cache(unpadded_target, tmp_path):
    """A hub id read through huggingface_hub from its cache (HF_HUB_OFFLINE=1), at a pinned revision, by the
    `python -m draftsmith init` command."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in unpadded_target.iterdir():
        if f.suffix != ".safetensors":  # init reads configs and tokenizer files only
            (snapshot / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"))
    run = [sys.executable, "-m", "draftsmith", "init", "someone/tiny", "--revision", commit]
    proc = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert cfg["target"]["model"] == "someone/tiny" and cfg["target"]["revision"] == commit
    tok = AutoTokenizer.from_pretrained(unpadded_target)
    assert cfg["target"]["mask_token_id"] == tok.convert_tokens_to_ids(RESERVED[-1])
    usage = subprocess.run([sys.executable, "-m", "draftsmith"], capture_output=True, text=True, cwd=REPO)
    assert usage.returncode == 2 and "init" in usage.stderr


def test_gpus_from_the_flag_or_the_machine(tmp_path, inputs, monkeypatch, capsys):
    """--gpus sets train.gpus; without it, the GPUs visible here; with none, 1 and a comment that says so."""
    shape, name = str(REPO / "configs/shapes/qwen3-8b.json"), NAMES["qwen3-8b"]
    cfg, _ = init(tmp_path / "a.yaml", shape, "--name", name, "--gpus", "8", *inputs)
    assert cfg["train"]["gpus"] == 8
    monkeypatch.setenv("DRAFTSMITH_GPUS", "0,1,2,3")
    cfg, _ = init(tmp_path / "b.yaml", shape, "--name", name, *inputs)
    assert cfg["train"]["gpus"] == 4
    monkeypatch.setenv("DRAFTSMITH_GPUS", "")
    cfg, text = init(tmp_path / "c.yaml", shape, "--name", name, *inputs)
    assert cfg["train"]["gpus"] == 1 and "NO GPU WAS VISIBLE" in text
    assert "no GPU visible here" in capsys.readouterr().err


def test_a_large_target_gets_the_presets_slots_and_shards(tmp_path, inputs):
    big, _ = init(
        tmp_path / "big.yaml", str(REPO / "configs/shapes/qwen3.6-27b.json"), "--name", "Q/27B", *inputs
    )
    assert big["data"]["regenerate"]["batch_size"] == 128 and big["extract"]["shards_per_slot"] == 4
    assert big["data"]["regenerate"]["enabled"] is True  # merged into the section, not over it
    small, _ = init(
        tmp_path / "small.yaml", str(REPO / "configs/shapes/smollm2-135m.json"), "--name", "S/s", *inputs
    )
    assert (
        small["data"]["regenerate"]["batch_size"] == 64 and small["extract"]["shards_per_slot"] == 2
    )  # defaults


def test_without_out_it_suggests_a_new_file_not_force(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("results: results\n")  # the repository's demo config
    with pytest.raises(SystemExit) as stop:
        main([str(REPO / "configs/shapes/qwen3.6-27b.json"), "--name", "Qwen/Qwen3.6-27B"])
    assert "--out qwen3.6-27b.yaml" in str(stop.value) and "demo config" in str(stop.value)
    assert (tmp_path / "config.yaml").read_text() == "results: results\n"
