"""The drafter's shape (DrafterConfig), built in one place from a Hugging Face config and the drafter's
settings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftsmith.target.files import text_fields
from draftsmith.target.mask import MaskChoice, no_mask_message, settle_mask_token

FULL, SLIDING = "full_attention", "sliding_attention"


def layer_types_problems(layer_types: list[str], num_layers: int, sliding_window: int | None) -> list[str]:
    """What is wrong with a drafter's layer kinds, by their drafter.* keys: DrafterConfig refuses them, and
    preflight names them at parse time (training would meet them only after extraction)."""
    problems = []
    if layer_types and len(layer_types) != num_layers:
        problems.append(
            f"drafter.layer_types: {len(layer_types)} kinds for drafter.num_layers {num_layers}: give one "
            "kind a layer, or null for full attention throughout"
        )
    if bad := sorted(set(layer_types) - {FULL, SLIDING}):
        problems.append(f"drafter.layer_types: unknown kinds {bad}; use {FULL!r} or {SLIDING!r}")
    if SLIDING in layer_types and not sliding_window:
        problems.append(
            "drafter.sliding_window: null, and drafter.layer_types has sliding_attention layers: give the "
            "window in tokens (2048 in z-lab's Qwen3.6 drafters)"
        )
    return problems


@dataclass
class DrafterConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_layer_ids: list[int]
    num_target_layers: int
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 40960
    layer_types: list[str] = field(default_factory=list)  # filled with FULL when empty
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            self.layer_types = [FULL] * self.num_layers
        if problems := layer_types_problems(self.layer_types, self.num_layers, self.sliding_window):
            raise ValueError("; ".join(problems))

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> DrafterConfig:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def rope_theta_of(cfg: dict) -> float:
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta")
    return float(theta or 1e6)


def resolve_mask_token_id(setting: object, preset: int | None, vocab_size: int, target_dir=None) -> int:
    """Config value, else the preset's (the id z-lab's drafters use), else the target tokenizer's free id
    (`target.mask.choose_mask_token`: a padding row, or a special token nothing uses)."""
    if setting not in (None, "auto"):
        mid = int(str(setting))
    elif preset is not None:
        mid = int(preset)
    else:
        choice = _free_id(target_dir, vocab_size)
        if choice.token_id is None:
            raise ValueError(no_mask_message(choice))
        mid = choice.token_id
    if not 0 <= mid < vocab_size:
        raise ValueError(f"mask_token_id {mid} outside the target's vocabulary of {vocab_size}")
    return mid


def _free_id(target_dir: str | Path | None, vocab_size: int) -> MaskChoice:
    """The choice preflight makes for a target with the default `target` section."""
    if target_dir is None or not (Path(target_dir) / "tokenizer_config.json").exists():
        return MaskChoice(None, f"the target has no tokenizer saved to choose from ({vocab_size} rows)")
    from draftsmith.config import with_defaults

    return settle_mask_token(Path(target_dir), with_defaults("target"), "auto")


def drafter_config(
    fields: dict,
    taps: list[int],
    *,
    num_layers: int,
    num_target_layers: int,
    mask_token_id: int,
    block_size: int,
    intermediate_size: int | None = None,
    layer_types: list[str] | None = None,
    sliding_window: int | None = None,
) -> DrafterConfig:
    """The one place a DrafterConfig is assembled. `fields` are Hugging Face text-config fields (the target's,
    or a z-lab checkpoint's own): hidden size, heads, KV heads, head_dim, vocabulary, norm epsilon and RoPE
    come from them; the drafter's depth, block, mask token and layer kinds from the caller."""
    hidden = int(fields["hidden_size"])
    heads = int(fields["num_attention_heads"])
    return DrafterConfig(
        hidden_size=hidden,
        num_layers=int(num_layers),
        num_heads=heads,
        num_kv_heads=int(fields.get("num_key_value_heads", heads)),
        head_dim=int(fields.get("head_dim") or hidden // heads),
        intermediate_size=int(intermediate_size or fields["intermediate_size"]),
        vocab_size=int(fields["vocab_size"]),
        target_layer_ids=[int(x) for x in taps],
        num_target_layers=int(num_target_layers),
        mask_token_id=int(mask_token_id),
        block_size=int(block_size),
        rms_norm_eps=float(fields.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta_of(fields),
        max_position_embeddings=int(fields.get("max_position_embeddings", 40960)),
        layer_types=list(layer_types or []),
        sliding_window=sliding_window,
    )


def config_from_target(
    target_config: dict,
    taps: list[int],
    section: dict,
    preset_mask_token_id: int | None = None,
    target_dir: str | Path | None = None,
) -> DrafterConfig:
    """Drafter shapes follow the target (hidden, heads, head_dim, intermediate) unless the `drafter` section
    says."""
    t = text_fields(target_config)
    inter = section["intermediate_size"]  # auto: the target's
    return drafter_config(
        t,
        taps,
        num_layers=section["num_layers"],
        num_target_layers=t["num_hidden_layers"],
        mask_token_id=resolve_mask_token_id(
            section["mask_token_id"], preset_mask_token_id, int(t["vocab_size"]), target_dir
        ),
        block_size=section["block_size"],
        intermediate_size=None if inter == "auto" else inter,
        layer_types=section["layer_types"],
        sliding_window=section["sliding_window"],
    )
