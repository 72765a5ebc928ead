"""The workflow config as code reads it: schema defaults, tap resolution, the content hash, and preflight.

The schema (workflow/schemas/config.schema.yaml) is the only place defaults live: Snakemake fills them when it
validates the config, and a step run by hand fills the sections it is given from the same schema
(`with_defaults`). Code reads config values; it never restates a default. The preflight checks need the
target's config.json but no weights: they run when the workflow is parsed (local targets) and again in the
probe job (hub targets), so a wrong key stops the run before any job starts."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from pathlib import Path

SCHEMA = Path(__file__).resolve().parent.parent / "workflow" / "schemas" / "config.schema.yaml"


@functools.cache
def _schema() -> dict:
    import yaml

    return yaml.safe_load(SCHEMA.read_text())


def _fill(schema: dict, values: dict) -> dict:
    """`values` with every key the schema gives a default for, nested objects included."""
    out = dict(values)
    for key, prop in (schema.get("properties") or {}).items():
        if key not in out and "default" in prop:
            out[key] = copy.deepcopy(prop["default"])
        if isinstance(out.get(key), dict) and prop.get("properties"):
            out[key] = _fill(prop, out[key])
    return out


def with_defaults(section: str, values: dict | None = None) -> dict:
    """A config section completed with the schema's defaults, as Snakemake's validation completes it."""
    return _fill(_schema()["properties"][section], values or {})


def section_arg(text: str | None, section: str) -> dict:
    """A step's `--<section>-json` argument: the rule passes the validated section, a hand run may pass
    part."""
    return with_defaults(section, json.loads(text) if text else {})


def default_taps(num_layers: int, num_taps: int = 5) -> list[int]:
    """Evenly spaced layer ids from 1 to N-3, as the DFlash drafters do (Qwen3-8B: 1, 9, 17, 25, 33)."""
    if num_taps == 1:
        return [num_layers // 2]
    start, end = 1, num_layers - 3
    if end <= start:
        raise ValueError(
            f"a target with {num_layers} layers is too shallow for {num_taps} evenly spaced taps"
        )
    span = end - start
    taps = [int(round(start + i * span / (num_taps - 1))) for i in range(num_taps)]
    if len(set(taps)) != len(taps):
        raise ValueError(
            f"{num_taps} taps between layers 1 and {end} would repeat a layer ({taps}); set taps.layers "
            "explicitly or lower taps.count"
        )
    return taps


def taps_out_of_range(taps: list[int], num_layers: int) -> list[int]:
    """The tap ids that name no decoder layer of a target with `num_layers` layers (ids 0..num_layers-1)."""
    return [int(t) for t in taps if not 0 <= int(t) < num_layers]


def resolve_taps(num_layers: int, taps_cfg: dict) -> list[int]:
    """`taps.layers: auto` gives the DFlash default; `include_last` adds the last decoder layer."""
    layers = taps_cfg["layers"]
    if layers == "auto":
        taps = default_taps(num_layers, int(taps_cfg["count"]))
    else:
        taps = [int(x) for x in layers]
        bad = taps_out_of_range(taps, num_layers)
        if bad:
            raise ValueError(
                f"taps.layers {bad} out of range: the target has {num_layers} decoder layers "
                f"(0..{num_layers - 1})"
            )
    if taps_cfg["include_last"] and num_layers - 1 not in taps:
        taps = taps + [num_layers - 1]
    return taps


def content_hash(*parts: object) -> str:
    """Hash of everything that determines the bytes of an output; shards of one dataset must agree on it."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


EXPECT_KEYS = ("num_hidden_layers", "hidden_size", "vocab_size")


def looks_local(model: str) -> bool:
    """A hub id is `org/name`; anything else (absolute, relative, deeper) is meant as a directory on this
    machine."""
    return model.startswith(("/", ".", "~")) or model.count("/") != 1 or Path(model).exists()


def model_problems(model: str) -> list[str]:
    """target.model must be a directory with a config.json when it is a local path."""
    if model == "demo" or not looks_local(model):
        return []
    path = Path(model).expanduser()
    if not path.is_dir():
        return [
            f"target.model: {model!r} does not exist (no such directory); give a local Hugging Face model "
            "directory or a hub id such as Qwen/Qwen3-8B"
        ]
    if not (path / "config.json").exists():
        return [f"target.model: {model!r} has no config.json, so it is not a Hugging Face model directory"]
    return []


def local_configs(model: str) -> tuple[dict, dict] | None:
    """(config.json, its text part) of a local target, or None when it is not local or not there yet."""
    path = Path(model).expanduser() / "config.json"
    if model == "demo" or not path.exists():
        return None
    top = json.loads(path.read_text())
    return top, top.get("text_config", top)


# Why no tap may read the last decoder layer: the engines capture each tap as the input of the next layer
UNSERVED_LAST = (
    "no serving engine captures the last layer's output (vLLM takes a tap as the input of layer id + 1, "
    "SGLang indexes layers[id + 1]), so a drafter trained on it would be served without it. Set "
    "taps.include_last: false and use tap ids below the last layer (`auto` gives the DFlash default)"
)


def target_problems(config: dict, text_cfg: dict) -> list[str]:
    """Values of the config that contradict the target's own config.json."""
    problems: list[str] = []
    model = config["target"]["model"]
    layers, vocab = int(text_cfg["num_hidden_layers"]), int(text_cfg["vocab_size"])
    expect = config["target"]["expect"] or {}
    for key in EXPECT_KEYS:
        if key in expect and int(expect[key]) != int(text_cfg.get(key, -1)):
            problems.append(
                f"target.expect.{key}: the preset is for a model with {key} = {expect[key]}, but {model!r} "
                f"has {text_cfg.get(key)}: this preset is for a different model. Copy the preset of this "
                "model from configs/, or write its shape into target.expect (and check mask_token_id, taps "
                "and the drafter)"
            )
    taps = config["taps"]["layers"]
    if taps != "auto":
        bad = taps_out_of_range(taps, layers)
        if bad:
            problems.append(
                f"taps.layers: {bad} out of range, {model!r} has {layers} decoder layers (ids 0.."
                f"{layers - 1}); use ids below {layers} or `auto`"
            )
        elif layers - 1 in taps:
            problems.append(
                f"taps.layers: {layers - 1} is the last decoder layer of {model!r}; {UNSERVED_LAST}"
            )
        elif list(taps) != sorted(set(taps)):
            problems.append(
                f"taps.layers: {list(taps)} must be increasing without repeats: the serving engines "
                "concatenate the taps in layer order"
            )
    if config["taps"]["include_last"]:
        problems.append(f"taps.include_last: true; {UNSERVED_LAST}")
    masks = [
        ("target.mask_token_id", config["target"]["mask_token_id"]),
        ("drafter.mask_token_id", config["drafter"]["mask_token_id"]),
    ]
    for key, mid in masks:
        if isinstance(mid, int) and not 0 <= mid < vocab:
            problems.append(
                f"{key}: {mid} is outside the vocabulary of {model!r} ({vocab} rows), so it belongs to "
                "another model's preset; set this model's mask token, or null/auto to pick a free row"
            )
    return problems


def preflight(config: dict) -> list[str]:
    """Every problem found without loading weights (local targets; hub targets are checked by the probe)."""
    model = config["target"]["model"]
    problems = model_problems(model)
    if problems:
        return problems
    cfgs = local_configs(model)
    return target_problems(config, cfgs[1]) if cfgs else []


def problems_message(problems: list[str]) -> str:
    return "config preflight failed (fix config.yaml or the --configfile you passed):\n  " + "\n  ".join(
        problems
    )
