"""Finding and loading the target the same way in every job: local directories, hub ids read from an offline
Hugging Face cache laid out as the hub lays it, the fetch job's lock file; the mask token settled from the
tokenizer before any job; the chat template a user names; the compute dtype on this CPU."""

import json

import pytest
import torch
from conftest import build_target, hub_cache
from tokenizers import AddedToken

from draftsmith.config import with_defaults
from draftsmith.core.runtime import cpu_computes_bf16, resolve_dtype
from draftsmith.preflight import preflight
from draftsmith.steps import fetch_target
from draftsmith.target.files import is_hub_id, resolve_target, text_config
from draftsmith.target.load import load_tokenizer
from draftsmith.target.mask import choose_mask_token, settle_mask_token

REPO_ID = "draftsmith-test/tiny-hybrid"


@pytest.fixture(scope="module")
def target(tmp_path_factory, tokenizer):
    return build_target(tmp_path_factory.mktemp("t") / "model", tokenizer, "hybrid", layers=8, hidden=32)


@pytest.fixture
def offline_cache(tmp_path, target, monkeypatch):
    cache = tmp_path / "hub"
    snapshot = hub_cache(cache, REPO_ID, target)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    return snapshot


def full_config(**sections) -> dict:
    cfg = {k: with_defaults(k, sections.get(k, {})) for k in ("target", "data", "taps", "drafter", "bench")}
    return {"results": "results", **cfg}


def test_hub_ids_and_paths_are_told_apart(tmp_path, target):
    assert is_hub_id("Qwen/Qwen3-8B") and not is_hub_id("demo")
    assert not is_hub_id(str(target)) and not is_hub_id("./a/b") and not is_hub_id("x/y.gguf/z")


def test_hub_id_resolves_to_the_cached_snapshot_offline(offline_cache, tmp_path):
    """Every job resolves the fetch job's lock file to the snapshot of the commit it fetched, offline."""
    lock = tmp_path / "lock.json"
    fetch_target.main(["--model", REPO_ID, "--out", str(lock)])
    pinned = json.loads(lock.read_text())
    assert pinned["commit"] == offline_cache.name and pinned["model"] == REPO_ID
    assert resolve_target(lock) == offline_cache == resolve_target(REPO_ID)
    assert text_config(resolve_target(lock))["num_hidden_layers"] == 8


def test_a_hub_id_missing_from_the_offline_cache_names_the_cache(offline_cache, tmp_path):
    with pytest.raises(SystemExit, match="not available from the hub.*HF_HUB_CACHE"):
        fetch_target.main(["--model", "nobody/nothing", "--out", str(tmp_path / "x.json")])


def test_preflight_reads_a_cached_hub_target_at_parse_time(offline_cache):
    """Preflight checks hub targets already in the cache, as it checks local ones."""
    cfg = full_config(target={"model": REPO_ID}, taps={"layers": [1, 7]}, data={"path": "x"})
    cfg["bench"]["datasets"] = []
    problems = preflight(cfg)
    assert len(problems) == 1 and "7 is the last decoder layer" in problems[0]


def no_padding_target(path, tokenizer, extra_special=()):
    """A target whose embedding has exactly one row per token (SmolLM2-like): no padding row is free."""
    tok = type(tokenizer).from_pretrained(str(build_target(path / "src", tokenizer)))
    tok.add_special_tokens(
        {"additional_special_tokens": [AddedToken(t, special=True) for t in extra_special]}
    )
    cfg = json.loads((path / "src" / "config.json").read_text())
    from transformers import AutoConfig, AutoModelForCausalLM

    model_cfg = AutoConfig.for_model(**{**cfg, "vocab_size": len(tok)})
    AutoModelForCausalLM.from_config(model_cfg).save_pretrained(path / "model")
    tok.save_pretrained(path / "model")
    return path / "model"


def test_mask_token_is_a_padding_row_when_there_is_one(target):
    choice = settle_mask_token(target, with_defaults("target"), "auto")
    tok = load_tokenizer(target, with_defaults("target"))
    assert choice.token_id == len(tok) < text_config(target)["vocab_size"]


def test_mask_token_without_padding_rows_is_an_unused_special_token(tmp_path, tokenizer):
    """Before, a vocabulary with no padding row passed every check and training failed after extraction."""
    model = no_padding_target(tmp_path, tokenizer, extra_special=("<|reserved_0|>", "<|reserved_1|>"))
    notes: list[str] = []
    cfg = full_config(target={"model": str(model)}, data={"path": "x"})
    cfg["bench"]["datasets"] = []
    assert preflight(cfg, notes) == []
    tok = load_tokenizer(model, with_defaults("target"))
    chosen = tok.convert_tokens_to_ids("<|reserved_1|>")
    assert notes == [f"mask token {chosen}: {choose_mask_token(tok, len(tok)).reason}"]
    assert "'<|reserved_1|>'" in notes[0]
    # the template's own markers and eos/pad are never chosen
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True)
    assert chosen not in rendered and chosen not in (tok.eos_token_id, tok.pad_token_id)


def test_no_free_mask_token_stops_preflight_naming_the_key(tmp_path, tokenizer):
    model = no_padding_target(tmp_path, tokenizer)
    cfg = full_config(target={"model": str(model)}, data={"path": "x"})
    cfg["bench"]["datasets"] = []
    problems = preflight(cfg)
    assert len(problems) == 1 and problems[0].startswith("drafter.mask_token_id: no free id"), problems
    cfg["drafter"]["mask_token_id"] = 5
    assert preflight(cfg) == []


def test_a_target_without_chat_template_is_named_and_a_template_can_be_given(tmp_path, tokenizer, target):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in target.iterdir():
        (bare / f.name).write_bytes(f.read_bytes())
    tok_cfg = json.loads((bare / "tokenizer_config.json").read_text())
    tok_cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    cfg = full_config(target={"model": str(bare)}, data={"path": "x"})
    cfg["bench"]["datasets"] = []
    problems = preflight(cfg)
    assert len(problems) == 1 and problems[0].startswith("target.chat_template:"), problems
    for setting in ("chatml", "plain"):
        cfg["target"]["chat_template"] = setting
        assert preflight(cfg) == []
    cfg["target"]["chat_template"] = "chatml"
    tok = load_tokenizer(bare, cfg["target"])
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    cfg["target"]["chat_template"] = str(template)
    assert preflight(cfg) == []
    tok = load_tokenizer(bare, cfg["target"])
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[user] hi\n"


def test_auto_dtype_is_bf16_where_the_cpu_computes_it_and_fp32_where_exactness_matters():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == (torch.bfloat16 if cpu_computes_bf16() else torch.float32)
    assert resolve_dtype("auto", cpu, exact=True) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("fp32", cpu) == torch.float32


def test_a_parse_remembers_the_mask_choice_for_the_files_it_read(tmp_path, tokenizer):
    """Every `snakemake` call settles the mask token at parse time; loading the tokenizer for it imported
    Transformers and torch, 2.9 of a dry run's 5.0 s on a tiny local target. The choice is kept per the
    target's files and settings; a changed tokenizer file or chat template settles it again."""
    from draftsmith.target.mask import settle_at_parse

    model = no_padding_target(tmp_path, tokenizer, extra_special=("<|reserved_0|>", "<|reserved_1|>"))
    cfg, cache = with_defaults("target"), tmp_path / "cache"
    first = settle_at_parse(model, cfg, "auto", cache_dir=cache)
    assert first == settle_mask_token(model, cfg, "auto") and first.token_id is not None
    (kept,) = cache.glob("mask-*.json")
    kept.write_text(json.dumps({"token_id": 7, "reason": "kept", "candidates": []}))  # what a parse reads
    assert settle_at_parse(model, cfg, "auto", cache_dir=cache).reason == "kept"
    assert settle_at_parse(model, cfg, 5, cache_dir=cache).token_id == 5  # a setting needs no tokenizer
    chatml = {**cfg, "chat_template": "chatml"}
    assert settle_at_parse(model, chatml, "auto", cache_dir=cache).reason != "kept"
    config_file = model / "tokenizer_config.json"
    config_file.write_text(config_file.read_text() + "\n")
    assert settle_at_parse(model, cfg, "auto", cache_dir=cache) == first
    blocked = tmp_path / "file"
    blocked.write_text("")  # a cache folder that cannot be made: the choice all the same
    assert settle_at_parse(model, cfg, "auto", cache_dir=blocked / "cache") == first
