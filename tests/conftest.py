"""Shared fixtures: tiny real targets (Hugging Face models built from configs, random weights, a real tokenizer)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tokenizer():
    from draftsmith import demo

    texts = [demo.read_text(p) for p in demo.split_files()[0][:40]]
    return demo.train_tokenizer(texts, vocab_size=400)


def build_target(path: Path, tokenizer, kind: str = "hybrid", layers: int = 8, hidden: int = 64, seed: int = 0):
    """A tiny target of either architecture family: `hybrid` (Qwen3.5: Gated DeltaNet + full attention) or
    `attention` (Qwen3: full attention only)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

    vocab = (len(tokenizer) // 64 + 1) * 64
    common = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    if kind == "hybrid":
        cfg = Qwen3_5TextConfig(
            **common, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16,
        )
        model = Qwen3_5ForCausalLM(cfg)
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def hybrid_target(tmp_path_factory, tokenizer):
    return build_target(tmp_path_factory.mktemp("hybrid"), tokenizer, "hybrid")


@pytest.fixture(scope="session")
def attention_target(tmp_path_factory, tokenizer):
    return build_target(tmp_path_factory.mktemp("attention"), tokenizer, "attention")
