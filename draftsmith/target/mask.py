"""The drafter's mask token, chosen from the target's tokenizer before any job runs.

The drafter marks the positions it predicts with one token id; real text must never produce it. A padded
embedding table (Qwen: 151936 rows for 151669 tokens) has rows no text reaches, and the first one is the
choice. A table with no padding (SmolLM2: 49152 rows, 49152 tokens) needs a special token that neither the
chat template nor the tokenizer's own bookkeeping (bos, eos, pad, unk, end of turn) uses: the highest such id
is taken, as reserved tokens sit at the end. The prepared data is checked against the choice by mask_check.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsmith.core.io import write_text

# Where a parse remembers its choice: beside Snakemake's own records in the working directory
PARSE_CACHE = Path(".snakemake") / "draftsmith"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")  # files the choice never reads
# Conversations rendered through the chat template to see which special tokens it writes itself.
_PROBE_CONVERSATIONS = (
    [{"role": "user", "content": "a"}],
    [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ],
)


@dataclass(frozen=True)
class MaskChoice:
    token_id: int | None  # None: nothing free, see `candidates`
    reason: str
    candidates: tuple[int, ...] = ()  # special ids that are not in use, for the user to pick from


def template_ids(tokenizer) -> set[int]:
    """Ids the chat template writes into conversations (role markers, end of turn, thinking tags)."""
    used: set[int] = set()
    if not getattr(tokenizer, "chat_template", None):
        return used
    for msgs in _PROBE_CONVERSATIONS:
        for thinking in (False, True):
            try:
                text = tokenizer.apply_chat_template(
                    msgs, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
                )
            except Exception:  # templates that refuse a system turn or a trailing user turn
                continue
            used.update(tokenizer(text, add_special_tokens=True)["input_ids"])
    return used


def reserved_ids(tokenizer, eos_ids: list[int] = ()) -> set[int]:  # type: ignore[assignment]
    """Ids with a job of their own: bos, eos (every end-of-answer id), pad, unk."""
    ids = {int(i) for i in eos_ids}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            ids.add(int(value))
    return ids


def choose_mask_token(tokenizer, vocab_size: int, eos_ids: list[int] = ()) -> MaskChoice:  # type: ignore[assignment]
    """The first padding row of the embedding table, else the highest special token nothing uses."""
    n = len(tokenizer)
    if n < vocab_size:
        return MaskChoice(n, f"the first padding row ({vocab_size} rows, the tokenizer has {n} tokens)")
    busy = template_ids(tokenizer) | reserved_ids(tokenizer, eos_ids)
    special = sorted(
        int(i)
        for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items()
        if getattr(tok, "special", False) and int(i) < vocab_size
    )
    free = tuple(i for i in special if i not in busy)
    if not free:
        return MaskChoice(
            None,
            f"the vocabulary has no padding row ({vocab_size} rows, {n} tokens) and every special token is "
            "in use (bos, eos, pad or the chat template)",
        )
    mid = free[-1]
    name = tokenizer.convert_ids_to_tokens(mid)
    return MaskChoice(
        mid,
        f"{name!r}, a special token that neither the chat template nor bos/eos/pad use (the vocabulary has "
        f"no padding row: {vocab_size} rows, {n} tokens)",
        free,
    )


def eos_ids_on_disk(target_dir: Path) -> list[int]:
    """The generation config's end-of-answer ids, read without loading the model."""
    path = target_dir / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.exists() else None
    return [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]


def settle_mask_token(target_dir: Path, target_cfg: dict, drafter_setting: object) -> MaskChoice:
    """The mask token a run uses, the same in preflight, mask_check and training: drafter.mask_token_id when
    set, else the preset's target.mask_token_id, else `choose_mask_token` on the target's tokenizer (with the
    configured chat template)."""
    if drafter_setting not in (None, "auto"):
        return MaskChoice(int(str(drafter_setting)), "drafter.mask_token_id")
    if target_cfg.get("mask_token_id") is not None:
        return MaskChoice(int(target_cfg["mask_token_id"]), "target.mask_token_id (the preset's)")
    from draftsmith.target.files import text_config
    from draftsmith.target.load import load_tokenizer

    vocab = int(text_config(target_dir)["vocab_size"])
    tok = load_tokenizer(target_dir, target_cfg)
    return choose_mask_token(tok, vocab, eos_ids_on_disk(Path(target_dir)))


def no_mask_message(choice: MaskChoice) -> str:
    """What to do when nothing is free."""
    listed = ", ".join(str(i) for i in choice.candidates) or "none"
    return (
        f"drafter.mask_token_id: no free id to mark the drafter's positions: {choice.reason}. Set "
        f"drafter.mask_token_id to an id real text never produces (unused special ids: {listed}), or resize "
        "the target's embedding with a spare row"
    )


def _choice_stamp(target_dir: Path, target_cfg: dict) -> str:
    """What `choose_mask_token` reads: the target's files but its weights (tokenizer, configs, template),
    by size and time; the chat template the config names, by content; the settings that pick the tokenizer."""
    files = sorted(p for p in Path(target_dir).iterdir() if p.is_file() and p.suffix not in WEIGHT_SUFFIXES)
    stats: list[object] = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    template = Path(target_cfg.get("chat_template") or "").expanduser()
    if template.is_file():  # no template named: Path("") is the folder "."
        stats.append(template.read_text())
    keys = {k: target_cfg.get(k) for k in ("chat_template", "trust_remote_code")}
    payload = json.dumps([str(Path(target_dir).resolve()), stats, keys], default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def settle_at_parse(
    target_dir: Path, target_cfg: dict, drafter_setting: object, *, cache_dir: Path = PARSE_CACHE
) -> MaskChoice:
    """`settle_mask_token` as a parse of the workflow asks it, remembered for the files it read: loading a
    tokenizer imports Transformers and torch, which took more of every `snakemake` call than the rest of the
    parse. Only the parse's check and notes read it; the mask_check job settles the token again."""
    if drafter_setting not in (None, "auto") or target_cfg.get("mask_token_id") is not None:
        return settle_mask_token(target_dir, target_cfg, drafter_setting)  # no tokenizer read
    path = Path(cache_dir) / f"mask-{_choice_stamp(target_dir, target_cfg)}.json"
    try:
        kept = json.loads(path.read_text())
        return MaskChoice(kept["token_id"], kept["reason"], tuple(kept["candidates"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    choice = settle_mask_token(target_dir, target_cfg, drafter_setting)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(asdict(choice)), tmp=path.with_name(f"{path.name}.{os.getpid()}.partial"))
    except OSError:  # a working directory it cannot write: the next parse settles the token again
        pass
    return choice
