"""`python -m draftsmith init MODEL`: a commented config.yaml for a new target, so that a new model is three
steps: init, put the data in place, run.

MODEL is a local model directory, a hub id (only its config and tokenizer files are fetched; HF_HUB_OFFLINE=1
reads the cache) or a config.json file alone (the shape; `--name` then gives the hub id to write). The config
stands on its own (a --configfile is not merged over the demo's): it writes every key a real target needs
away from the schema's defaults, and the keys a user must look at (mask token, taps, the drafter's layout),
each with a comment saying why. Defaults are read from the schema, never restated here.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.commented_yaml import LAYOUT, SECTION, Notes, flow, render
from draftsmith.config import default_taps, with_defaults
from draftsmith.core.io import write_text
from draftsmith.drafter.config import FULL, SLIDING, DrafterConfig, config_from_target
from draftsmith.preflight import EXPECT_KEYS, has_chat_template, layer_kinds
from draftsmith.target.files import is_hub_id, text_fields

# What init reads of a hub repository: its configs and tokenizer files, never weights.
HUB_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "*.model",
    "*.tiktoken",
    "chat_template.*",
)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")

# The mask token of z-lab's released drafters, by tokenizer family and the model types that share it
# (Qwen3-Next has Qwen3's tokenizer). An id is used only below the target's vocabulary size.
ZLAB_MASK_IDS = {
    "Qwen3": (151669, ("qwen3", "qwen3_moe", "qwen3_next")),
    "Qwen3.5/3.6": (248070, ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")),
}

# z-lab's Qwen3.6-27B drafter: sliding layers, then one full-attention layer, over this window. It is used for
# targets that mix in linear or sliding layers over a long context; a window of 2048 then sees at most a
# thirty-second of it.
DRAFTER_WINDOW = 2048
LONG_CONTEXT = 65536

# The presets' values (configs/*.yaml) where a real target needs other than the schema's small defaults.
MAX_LENGTH = 4096
REGENERATE_NEW_TOKENS = 2048
BENCH_NEW_TOKENS = 512
DDTREE_BUDGETS = [16, 64, 256, 512]

DATA_PLACEHOLDER = "data/train.jsonl"
PROMPTS_PLACEHOLDER = "data/prompts.jsonl"
BENCH_NAME = "heldout"

# The DrafterConfig fields the drafter comment lists: what follows from the target.
SHAPE_FIELDS = ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size")


def fail(message: str) -> SystemExit:
    return SystemExit(f"draftsmith init: {message}")


def warn(message: str) -> None:
    print(f"draftsmith init: {message}", file=sys.stderr)


@dataclass(frozen=True)
class Source:
    """What init read the target from."""

    config: dict  # config.json as written
    directory: Path | None  # its files on this machine (config, tokenizer); None for a config.json alone
    model: str  # target.model to write
    described: str  # for the header


def fetch_hub(repo_id: str, revision: str | None) -> Path:
    """The config and tokenizer files of a hub repository (the cache only under HF_HUB_OFFLINE=1)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(HUB_PATTERNS)))
    except Exception as e:  # offline and not cached, gated, or no such repository / revision
        raise fail(
            f"{repo_id!r} (revision {revision or 'main'}): its config and tokenizer could not be read "
            f"from the hub or the local cache ({type(e).__name__}: {e}). Check the id and --revision; "
            "offline, download it first (`hf download REPO`), or pass a local model directory or a "
            "config.json with --name"
        ) from None


def read_source(spec: str, *, name: str | None, revision: str | None) -> Source:
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".json":
            raise fail(f"{spec}: a file must be a config.json (a model directory or a hub id otherwise)")
        if not name:
            raise fail(f"{spec} gives the shape only: pass --name with the hub id to write as target.model")
        return Source(json.loads(path.read_text()), None, name, f"the shape {spec}")
    if path.is_dir():
        if not (path / "config.json").exists():
            raise fail(f"{spec} has no config.json, so it is not a Hugging Face model directory")
        return Source(
            json.loads((path / "config.json").read_text()), path, name or spec, f"the directory {spec}"
        )
    if spec == "demo":
        raise fail("the embedded demo is what the repository's config.yaml runs; init is for other models")
    if not is_hub_id(spec):
        raise fail(
            f"{spec!r} is neither a model directory, a config.json, nor a hub id such as Qwen/Qwen3-8B"
        )
    directory = fetch_hub(spec, revision)
    at = f" at {revision}" if revision else ""
    config = json.loads((directory / "config.json").read_text())
    return Source(config, directory, name or spec, f"{spec}{at} on the Hugging Face hub")


def tokenizer_dir(source: Source) -> Path | None:
    """The source's directory when it holds a tokenizer."""
    d = source.directory
    return d if d is not None and any((d / f).exists() for f in TOKENIZER_FILES) else None


def chat_template_setting(directory: Path) -> tuple[str, str] | None:
    """A tokenizer without a chat template needs target.chat_template (preflight stops otherwise): ChatML
    when its markers are in the vocabulary, else none at all, as base models are trained."""
    if has_chat_template(directory):
        return None
    from transformers import AutoTokenizer

    try:
        vocab = AutoTokenizer.from_pretrained(str(directory)).get_vocab()
    except Exception:  # unreadable without remote code or a package: the mask choice reports why
        return None
    if "<|im_start|>" in vocab and "<|im_end|>" in vocab:
        return "chatml", "the tokenizer ships no chat template but has ChatML's markers; check it is the one"
    return "plain", "the tokenizer ships no chat template (a base model?): prompt and answer concatenated"


def zlab_mask(top: dict, vocab: int) -> tuple[int, str] | None:
    types = {top.get("model_type"), text_fields(top).get("model_type")}
    for family, (mid, model_types) in ZLAB_MASK_IDS.items():
        if types & set(model_types) and mid < vocab:
            return mid, family
    return None


def choose_mask(source: Source, target: dict, *, flag: int | None) -> tuple[int | None, str]:
    """--mask-token-id, else the tokenizer's choice as the run makes it (`settle_mask_token`), else the id of
    z-lab's drafters of the family; (None, why) when none applies."""
    vocab = int(text_fields(source.config)["vocab_size"])
    if flag is not None:
        if not 0 <= flag < vocab:
            raise fail(f"--mask-token-id {flag} is outside the vocabulary ({vocab} rows)")
        return flag, "set with --mask-token-id"
    zlab = zlab_mask(source.config, vocab)
    directory = tokenizer_dir(source)
    if directory is not None:
        from draftsmith.target.mask import settle_mask_token

        try:
            choice = settle_mask_token(directory, target, "auto")
        except Exception as e:  # a tokenizer that needs remote code or a missing package
            why = f"the tokenizer could not be read ({type(e).__name__}: {e})"
        else:
            if choice.token_id is not None:
                other = zlab is not None and zlab[0] != choice.token_id
                note = f"; z-lab's {zlab[1]} drafters use {zlab[0]}" if zlab and other else ""
                return choice.token_id, f"{choice.reason}{note}"
            listed = ", ".join(map(str, choice.candidates))
            why = choice.reason + (f" (unused special ids: {listed})" if listed else "")
    elif source.directory is None:
        why = "no tokenizer was read: the source is a config.json alone"
    else:
        why = f"{source.directory} has no tokenizer files"
    if zlab is not None:
        return zlab[0], f"the id z-lab's released {zlab[1]} drafters use; {why}"
    return None, why


def target_kinds(top: dict) -> list[str]:
    """Each decoder layer's kind as Transformers reads the config (it fills schedules such as Qwen3.5's
    full_attention_interval); a window with no kinds named slides every layer (Mistral)."""
    text = text_fields(top)
    try:
        from transformers import AutoConfig

        fields = {k: v for k, v in top.items() if k != "model_type"}
        hf = AutoConfig.for_model(top["model_type"], **fields).get_text_config()
        kinds, window = getattr(hf, "layer_types", None), getattr(hf, "sliding_window", None)
    except Exception:  # no model_type, or one this Transformers does not know (remote code)
        kinds = text.get("layer_types")
        window = text.get("sliding_window") if text.get("use_sliding_window", True) else None
    return list(kinds or [SLIDING if window else FULL] * int(text["num_hidden_layers"]))


def drafter_layout(top: dict, num_layers: int) -> tuple[dict, str]:
    """The drafter's layer kinds, as z-lab's released drafters: sliding layers and one full one for a hybrid
    target of long context (the Qwen3.6-27B drafter), full attention otherwise."""
    mixed = sorted(set(target_kinds(top)) - {FULL})
    context = text_fields(top).get("max_position_embeddings")
    if not mixed:
        return (
            {},
            "layer_types: every layer full attention (the schema's null), as the target is attention only",
        )
    if context is None or int(context) < LONG_CONTEXT:
        span = "no context length in config.json" if context is None else f"a context of {context} positions"
        return {}, (
            "layer_types: every layer full attention (the schema's null): the target mixes in "
            f"{', '.join(mixed)} layers but has {span}, below the {LONG_CONTEXT} from which init gives a "
            "hybrid the sliding layout of z-lab's Qwen3.6-27B drafter"
        )
    kinds = [SLIDING] * (num_layers - 1) + [FULL]
    return {"layer_types": kinds, "sliding_window": DRAFTER_WINDOW}, (
        f"layer_types: sliding layers then one full one, window {DRAFTER_WINDOW}: the layout of z-lab's "
        f"Qwen3.6-27B drafter, for a target that mixes in {', '.join(mixed)} layers over {context} positions"
    )


def shape_note(source: Source, taps: list[int], drafter: dict, mask: int | None) -> tuple[str, bool]:
    """The drafter's shape as training derives it from the target (`config_from_target`), and whether this
    config.json gives it."""
    section = with_defaults("drafter", drafter)
    try:  # the shape does not depend on the mask token: 0 stands in for one not chosen yet
        cfg: DrafterConfig = config_from_target(source.config, taps, section, 0 if mask is None else mask)
    except KeyError as e:
        missing = e.args[0]
        hint = (
            "a mixture of experts has no dense one: set drafter.intermediate_size, or training stops"
            if missing == "intermediate_size"
            else "training derives the shape from the target's own config.json; check that it has one"
        )
        return f"the drafter's shape cannot be derived: the config has no {missing!r}; {hint}", False
    shape = ", ".join(f"{f} {getattr(cfg, f)}" for f in SHAPE_FIELDS)
    return f"the drafter's shape, derived from the target (draftsmith/drafter/config.py): {shape}", True


def short_name(model: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", Path(model.rstrip("/")).name.lower()) or "target"


def known_to_transformers(top: dict) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return top.get("model_type") in CONFIG_MAPPING_NAMES


def target_section(source: Source, args: argparse.Namespace, warnings: list[str]) -> tuple[dict, Notes]:
    text = text_fields(source.config)
    target: dict = {"model": source.model}
    notes = {"model": f"read from {source.described}"}
    if args.revision:
        target["revision"] = args.revision
    target["dtype"] = with_defaults("target")["dtype"]
    notes["dtype"] = "auto: bf16 on a GPU; fp32 on a CPU without native bf16"
    target["trust_remote_code"] = False
    kind = source.config.get("model_type")
    notes["trust_remote_code"] = (
        f"Transformers has the code of model_type {kind!r}"
        if known_to_transformers(source.config)
        else f"Transformers does not know model_type {kind!r}: set true to run the repository's own code"
    )
    directory = tokenizer_dir(source)
    if directory is not None:
        template = chat_template_setting(directory)
        if template is not None:
            target["chat_template"] = template[0]
            notes["chat_template"] = f"{template[1]}; or a Jinja file of the model family's template"
            warnings.append(f"target.chat_template: {template[0]}: {template[1]}")
    mask, why = choose_mask(source, with_defaults("target", dict(target)), flag=args.mask_token_id)
    target["mask_token_id"] = mask
    if mask is None:
        notes["mask_token_id"] = (
            f"SET THIS: no mask token chosen ({why}). Give an id real text never produces: a padding row "
            "of the embedding (ids from the tokenizer's size up to vocab_size), or an unused special token. "
            "Left null, the run picks one from the target's tokenizer and stops if none is free"
        )
        warnings.append(f"target.mask_token_id is null ({why}): set it in the written file")
    else:
        notes["mask_token_id"] = f"the drafter's mask token: {why}"
    target["expect"] = {k: int(text[k]) for k in EXPECT_KEYS} | {"layer_kinds": layer_kinds(text)}
    notes["expect"] = "the shape this config is for: a target whose config.json differs stops the run"
    return target, notes


def taps_section(source: Source) -> tuple[dict, Notes]:
    layers = int(text_fields(source.config)["num_hidden_layers"])
    try:
        taps = default_taps(layers, int(with_defaults("taps")["count"]))
    except ValueError as e:  # a target too shallow for distinct taps between 1 and N-3
        raise fail(f"init writes the DFlash default taps, which this target cannot have: {e}") from None
    return {"layers": taps}, {
        "layers": f"the DFlash default for {layers} layers ({len(taps)} ids evenly spaced from 1 to N-3, "
        "what `auto` gives), written out so that this drafter's taps are in the file"
    }


def drafter_section(
    source: Source, taps: list[int], mask: int | None, warnings: list[str]
) -> tuple[dict, Notes]:
    defaults = with_defaults("drafter")
    drafter = {k: defaults[k] for k in ("num_layers", "block_size", "mask_token_id")}
    notes = {
        "num_layers": "layers and block size of z-lab's Qwen3-8B and Qwen3.6-27B drafters",
        "mask_token_id": "auto: target.mask_token_id",
    }
    layout, notes[LAYOUT] = drafter_layout(source.config, int(drafter["num_layers"]))
    drafter.update(layout)
    notes[SECTION], derived = shape_note(source, taps, drafter, mask)
    if not derived:
        warnings.append(f"drafter: {notes[SECTION]}")
    return drafter, notes


def data_section(source: Source, args: argparse.Namespace) -> tuple[dict, Notes]:
    context = text_fields(source.config).get("max_position_embeddings")
    data = {
        "path": args.data,
        "max_length": min(MAX_LENGTH, int(context)) if context else MAX_LENGTH,
        "thinking": False,
        "regenerate": {"enabled": True, "max_new_tokens": REGENERATE_NEW_TOKENS},
    }
    return data, {
        "path": 'JSONL or Parquet, a record a line: {"messages": [{role, content}, ...]} or {"prompt", '
        '"response"}; with regenerate on, prompt-only records will do (the target writes the answers)',
        "max_length": "tokens per sample after the chat template; longer ones are truncated and counted",
        "thinking": "the chat template's enable_thinking switch: it changes acceptance a lot",
        "regenerate": "train on the target's own answers (what the drafter will have to predict)",
    }


def bench_section(args: argparse.Namespace) -> tuple[dict, Notes]:
    bench = {
        "datasets": [{"name": BENCH_NAME, "path": args.prompts}],
        "max_new_tokens": BENCH_NEW_TOKENS,
        "ddtree_budgets": DDTREE_BUDGETS,
    }
    return bench, {
        "datasets": "prompt files (messages, prompt, question, turns or instruction records)",
        "max_new_tokens": "tokens per benchmark answer, and DDTree's node budgets, as the presets",
    }


LARGE_TARGET = 1e9  # parameters from which a target gets the presets' regeneration slots and shards a GPU
LARGE_SLOTS, LARGE_SHARDS_PER_SLOT = 128, 4  # as configs/qwen3-8b.yaml and configs/qwen3.6-27b.yaml


def train_section(args: argparse.Namespace, warnings: list[str]) -> tuple[dict, Notes]:
    """train.gpus: --gpus, else the GPUs visible here; with none visible, 1 and a comment to set it."""
    from draftsmith.core.gpu_pool import visible_gpus

    if args.gpus is not None:
        return {"gpus": args.gpus}, {"gpus": "GPUs for DDP training on one node (--gpus)"}
    seen = len(visible_gpus())
    if seen:
        return {"gpus": seen}, {"gpus": f"GPUs for DDP training on one node: the {seen} visible here"}
    warnings.append(
        "no GPU visible here: train.gpus is 1; set it to the GPUs of the node that will train (--gpus)"
    )
    return {"gpus": 1}, {
        "gpus": "NO GPU WAS VISIBLE where init ran: set this to the GPUs of the node that trains (--gpus N)"
    }


def size_sections(source: Source) -> dict[str, int]:
    """Regeneration slots and shards a GPU for a large target, as its presets have them."""
    from draftsmith.plan.plan import target_params

    if target_params(text_fields(source.config)) < LARGE_TARGET:
        return {}
    return {"batch_size": LARGE_SLOTS, "shards_per_slot": LARGE_SHARDS_PER_SLOT}


def build(source: Source, args: argparse.Namespace) -> tuple[dict, dict[str, Notes], list[str]]:
    """The config, each section's comments (by key; SECTION for the section, LAYOUT for the drafter's layer
    kinds) and the warnings for stderr."""
    warnings: list[str] = []
    target, target_notes = target_section(source, args, warnings)
    taps, taps_notes = taps_section(source)
    drafter, drafter_notes = drafter_section(source, taps["layers"], target["mask_token_id"], warnings)
    data, data_notes = data_section(source, args)
    bench, bench_notes = bench_section(args)
    train, train_notes = train_section(args, warnings)
    sized = size_sections(source)
    config: dict[str, Any] = {
        "results": f"results/{short_name(source.model)}",
        "target": target,
        "taps": taps,
        "drafter": drafter,
        "data": data,
        "train": train,
        "bench": bench,
    }
    if sized:  # the presets' slots and shards a GPU for a large target
        config["data"]["regenerate"]["batch_size"] = sized["batch_size"]
        config["extract"] = {"shards_per_slot": sized["shards_per_slot"]}
    order = ("results", "target", "taps", "drafter", "data", "extract", "train", "bench")
    config = {k: config[k] for k in order if k in config}
    notes = {
        "target": target_notes,
        "taps": taps_notes,
        "drafter": drafter_notes,
        "data": data_notes,
        "train": train_notes,
        "extract": {
            "shards_per_slot": "shards a GPU: smaller reruns after a failure, as large targets' presets"
        },
        "bench": bench_notes,
    }
    return config, notes, warnings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m draftsmith init",
        description="Write a commented config.yaml for a new target model.",
    )
    p.add_argument(
        "model", help="a local model directory, a hub id, or a config.json (shape only; needs --name)"
    )
    p.add_argument("--out", default="config.yaml", help="the file to write (default: config.yaml)")
    p.add_argument("--force", action="store_true", help="replace --out when it exists")
    p.add_argument("--revision", help="hub revision (branch, tag or commit), written as target.revision")
    p.add_argument("--name", help="the hub id to write as target.model (required with a config.json)")
    p.add_argument("--mask-token-id", type=int, help="the drafter's mask token (else chosen, see the file)")
    p.add_argument("--gpus", type=int, help="GPUs for training (train.gpus)")
    p.add_argument("--data", default=DATA_PLACEHOLDER, help=f"training records (default: {DATA_PLACEHOLDER})")
    p.add_argument(
        "--prompts", default=PROMPTS_PLACEHOLDER, help=f"bench prompts (default: {PROMPTS_PLACEHOLDER})"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists() and not args.force:
        if any(a == "--out" or a.startswith("--out=") for a in argv):
            raise fail(f"{out} exists; pass --force to replace it, or --out PATH to write another file")
        suggest = f"{short_name(args.name or args.model)}.yaml"
        raise fail(
            f"{out} exists (without --out, init writes config.yaml: the repository's demo config); write a "
            f"new file with --out {suggest}, and run it with `snakemake --configfile {suggest}` (--force "
            f"replaces {out})"
        )
    source = read_source(args.model, name=args.name, revision=args.revision)
    config, notes, warnings = build(source, args)
    gpus, where = (args.gpus, "") if args.gpus else ("N", " (N: the node's GPUs)")
    header = [
        f"draftsmith config for {source.model}, written by `python -m draftsmith init {shlex.join(argv)}`.",
        "Keys not written take the schema's defaults (workflow/schemas/config.schema.yaml describes every "
        "key; docs/configuration.md maps them).",
        f"Next: put training records in {args.data} and benchmark prompts in {args.prompts}, then run{where}",
        f"  snakemake --configfile {shlex.quote(str(out))} --cores 8 --resources gpu={gpus}",
    ]
    write_text(out, render(config, notes, header))
    for w in warnings:
        warn(w)
    target = config["target"]
    warn(
        f"wrote {out} for {source.model}: {target['expect']['num_hidden_layers']} layers, taps "
        f"{config['taps']['layers']}, mask token {flow(target['mask_token_id'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
