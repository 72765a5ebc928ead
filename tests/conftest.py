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


def tiny_model(kind: str, vocab: int, layers: int = 8, hidden: int = 64, seed: int = 0, **overrides):
    """A tiny target with random weights, of either family: `hybrid` (Qwen3.5: Gated DeltaNet + full attention,
    one full-attention layer in four) or `attention` (Qwen3: full attention only)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

    fields = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    if kind == "hybrid":
        fields.update(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                      linear_value_head_dim=16)
        return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{**fields, **overrides})).eval()
    return Qwen3ForCausalLM(Qwen3Config(**{**fields, **overrides})).eval()


def build_target(path: Path, tokenizer, kind: str = "hybrid", layers: int = 8, hidden: int = 64, seed: int = 0):
    """`tiny_model` saved as a Hugging Face model directory with the tokenizer beside it."""
    vocab = (len(tokenizer) // 64 + 1) * 64
    model = tiny_model(kind, vocab, layers, hidden, seed, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def hybrid_target(tmp_path_factory, tokenizer):
    return build_target(tmp_path_factory.mktemp("hybrid"), tokenizer, "hybrid")


@pytest.fixture(scope="session")
def attention_target(tmp_path_factory, tokenizer):
    return build_target(tmp_path_factory.mktemp("attention"), tokenizer, "attention")
