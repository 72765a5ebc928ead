"""An exported drafter against what the serving engines' DFlash loaders read and assert (as read from their
code, late 2026; ../shared/README.md summarises it):

- vLLM, vllm/model_executor/models/qwen3_dflash.py (class registered for `DFlashDraftModel`): Qwen3 fields
  plus `target_hidden_size`, `layer_types`, `sliding_window`; tap ids from `eagle_aux_hidden_state_layer_ids`
  as-is, else `dflash_config.target_layer_ids` + 1; q/k/v and gate/up stacked from their separate names;
  embeddings and head optional; it asserts there is no `mask_hidden`.
- SGLang, python/sglang/srt/models/dflash.py and speculative/dflash_utils.py: `dflash_config.block_size` (else
  16), `target_layer_ids`, `mask_token_id` (some versions the string `mask_token`), `num_target_layers`; `fc`
  sized from the drafter's hidden size; unknown weight names silently ignored (so a wrong name loses a
  weight).
"""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from draftsmith.drafter.config import FULL, SLIDING, drafter_config
from draftsmith.drafter.model import Drafter
from draftsmith.drafter.zlab import export, save_zlab

V, H, TAPS, TARGET_LAYERS = 96, 64, [1, 2, 4], 8
LAYER_WEIGHTS = [
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
]


@pytest.fixture(params=["full", "sliding_and_full"])
def exported(request, tmp_path):
    kinds = [FULL, FULL] if request.param == "full" else [SLIDING, FULL]
    cfg = drafter_config(
        {"hidden_size": H, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "intermediate_size": 128, "vocab_size": V, "rope_theta": 5e5},
        TAPS, num_layers=2, num_target_layers=TARGET_LAYERS, mask_token_id=V - 1, block_size=8,
        layer_types=kinds, sliding_window=4 if SLIDING in kinds else None,
    )  # fmt: skip
    out = save_zlab(Drafter(cfg), tmp_path / "drafter", torch.bfloat16, mask_token="<|mask|>")
    return cfg, json.loads((out / "config.json").read_text()), load_file(out / "model.safetensors")


def test_config_fields_the_engines_read(exported):
    cfg, c, _ = exported
    assert c["architectures"] == ["DFlashDraftModel"] and c["model_type"] == "qwen3"
    assert c["head_dim"] == 16 and c["hidden_act"] == "silu" and c["attention_bias"] is False
    assert c["num_hidden_layers"] == len(c["layer_types"]) == 2
    sliding = SLIDING in c["layer_types"]
    assert c["use_sliding_window"] is sliding and (c["sliding_window"] is not None) is sliding
    d = c["dflash_config"]
    assert d["target_layer_ids"] == TAPS == sorted(TAPS) and max(TAPS) < TARGET_LAYERS - 1
    assert c["eagle_aux_hidden_state_layer_ids"] == [t + 1 for t in TAPS]  # HF hidden_states indices
    assert c["num_target_layers"] == TARGET_LAYERS and c["target_hidden_size"] == H
    assert d["block_size"] == c["block_size"] == 8  # SGLang reads the first, z-lab and vLLM the second
    assert 0 <= d["mask_token_id"] < c["vocab_size"] and d["mask_token"] == "<|mask|>"
    assert c["rope_theta"] == c["rope_parameters"]["rope_theta"] == 5e5


def test_weights_the_engines_load(exported):
    cfg, _, weights = exported
    want = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    want |= {f"layers.{i}.{name}" for i in range(cfg.num_layers) for name in LAYER_WEIGHTS}
    assert set(weights) == want  # no embedding, head or mask_hidden tensor; nothing SGLang would drop
    assert weights["fc.weight"].shape == (H, len(TAPS) * H)
    assert all(w.dtype == torch.bfloat16 for w in weights.values())


def test_export_names_the_mask_token_of_the_target_tokenizer(attention_target, tmp_path):
    """The export step writes the token's string where the mask id is one of the tokenizer's tokens."""
    tok = AutoTokenizer.from_pretrained(attention_target)
    text = json.loads((attention_target / "config.json").read_text())
    mid = len(tok) - 1  # a real token of this tokenizer
    cfg = drafter_config(text, [1, 2], num_layers=1, num_target_layers=text["num_hidden_layers"],
                         mask_token_id=mid, block_size=4)  # fmt: skip
    final = tmp_path / "train" / "final"
    save_zlab(Drafter(cfg), final, torch.float32)
    out = export(tmp_path / "train", tmp_path / "drafter", tokenizer=tok)
    d = json.loads((out / "config.json").read_text())["dflash_config"]
    assert d["mask_token"] == tok.convert_ids_to_tokens(mid) and d["mask_token_id"] == mid
