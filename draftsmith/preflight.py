"""Config checks that need the target's config.json but no weights: run when the workflow is parsed (local
targets) and again by the probe job (hub targets), so a wrong key stops the run before any job starts.

The schema catches unknown keys and wrong types; these catch values that are well-formed but wrong for this
target: tap layers it does not have, a mask token outside its vocabulary, a preset written for another model.
Each message names the config key and says what to do.
"""

from __future__ import annotations

import json
from pathlib import Path

EXPECT_KEYS = ("num_hidden_layers", "hidden_size", "vocab_size")


def looks_local(model: str) -> bool:
    """A hub id is `org/name`; anything else (absolute, relative, deeper) is meant as a directory on this machine."""
    return model.startswith(("/", ".", "~")) or model.count("/") != 1 or Path(model).exists()


def model_problems(model: str) -> list[str]:
    """target.model must be a directory with a config.json when it is a local path."""
    if model == "demo" or not looks_local(model):
        return []
    path = Path(model).expanduser()
    if not path.is_dir():
        return [f"target.model: {model!r} does not exist (no such directory); give a local Hugging Face model "
                "directory or a hub id such as Qwen/Qwen3-8B"]
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


def target_problems(config: dict, text_cfg: dict) -> list[str]:
    """Values of the config that contradict the target's own config.json."""
    problems: list[str] = []
    model = config["target"]["model"]
    layers, vocab = int(text_cfg["num_hidden_layers"]), int(text_cfg["vocab_size"])
    expect = config["target"].get("expect") or {}
    for key in EXPECT_KEYS:
        if key in expect and int(expect[key]) != int(text_cfg.get(key, -1)):
            problems.append(
                f"target.expect.{key}: the preset is for a model with {key} = {expect[key]}, but {model!r} has "
                f"{text_cfg.get(key)}: this preset is for a different model. Copy the preset of this model from "
                "configs/, or write its shape into target.expect (and check mask_token_id, taps and the drafter)"
            )
    taps = config["taps"].get("layers", "auto")
    if taps != "auto":
        bad = [int(t) for t in taps if not 0 <= int(t) < layers]
        if bad:
            problems.append(f"taps.layers: {bad} out of range, {model!r} has {layers} decoder layers (ids 0.."
                            f"{layers - 1}); use ids below {layers} or `auto`")
    masks = [("target.mask_token_id", config["target"].get("mask_token_id")),
             ("drafter.mask_token_id", config["drafter"].get("mask_token_id"))]
    for key, mid in masks:
        if isinstance(mid, int) and not 0 <= mid < vocab:
            problems.append(f"{key}: {mid} is outside the vocabulary of {model!r} ({vocab} rows), so it belongs to "
                            "another model's preset; set this model's mask token, or null/auto to pick a free row")
    return problems


def check(config: dict) -> list[str]:
    """Every problem found without loading weights (local targets; hub targets are checked by the probe)."""
    model = config["target"]["model"]
    problems = model_problems(model)
    if problems:
        return problems
    cfgs = local_configs(model)
    return target_problems(config, cfgs[1]) if cfgs else []


def report(problems: list[str]) -> str:
    return "config preflight failed (fix config.yaml or the --configfile you passed):\n  " + "\n  ".join(problems)
