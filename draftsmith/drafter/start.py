"""A training's start from an earlier drafter (`train.init_from`) instead of random weights.

What it is for: more epochs or more data on a drafter already trained (an earlier run's export, or a published
DFlash drafter), without paying again for the epochs it has. The drafter must have the shape this config
builds: preflight compares what the config and the target's config.json say at parse time (before any
extraction), and the training job compares every field of the built DrafterConfig before its first step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.config import resolve_taps

if TYPE_CHECKING:
    from draftsmith.drafter.model import Drafter

KEY = "train.init_from"
FILES = ("config.json", "model.safetensors")  # z-lab's format, as the export rule writes it
TRAINED_HERE = (
    "drafter",
    "train",
    "rounds",
    "study",
)  # a run's folders that its trainings and exports rewrite
# Fields no weight depends on: a serving limit, which a start from another run's drafter may set otherwise.
FREE_FIELDS = ("max_position_embeddings",)


def start_files(path: str | None) -> list[str]:
    """The files a training that starts from `path` reads (its inputs: new weights there train again)."""
    return [str(Path(path) / name) for name in FILES] if path else []


def start_problems(
    config: dict, text_cfg: dict | None = None, *, mask_token_id: int | None = None
) -> list[str]:
    """What is wrong with `train.init_from`, by what the config says and, where the target's config.json is
    here (`text_cfg`), by the target's depth, width and taps, and by the settled mask token where known."""
    # a partial config (a hand run's) has no train section
    path = (config.get("train") or {}).get("init_from")
    if not path:
        return []
    folder = Path(path)
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        return [
            f"{KEY}: {path} has no {' and no '.join(missing)}: give a drafter folder in z-lab's format (an "
            "earlier run's results/.../drafter, or a published DFlash drafter), or null for a random start"
        ]
    results = Path(config["results"]).resolve()
    if any(folder.resolve().is_relative_to(results / name) for name in TRAINED_HERE):
        return [
            f"{KEY}: {path} lies in what this run's training replaces ({', '.join(TRAINED_HERE)} under "
            f"{config['results']}): copy it out first (cp -r {path} inputs/start-drafter) and point {KEY} "
            "there"
        ]
    try:
        theirs = json.loads((folder / "config.json").read_text())
        dflash = theirs["dflash_config"]
    except (ValueError, KeyError) as err:
        return [f"{KEY}: {folder / 'config.json'} is not a DFlash drafter's config ({err!r})"]
    d = config["drafter"]
    pairs = [
        ("drafter.num_layers", d["num_layers"], theirs.get("num_hidden_layers")),
        ("drafter.block_size", d["block_size"], theirs.get("block_size")),
    ]
    if text_cfg is not None:
        layers = int(text_cfg["num_hidden_layers"])
        pairs += [
            ("the target's hidden_size", text_cfg.get("hidden_size"), theirs.get("hidden_size")),
            ("the target's num_hidden_layers", layers, theirs.get("num_target_layers")),
        ]
        try:
            pairs.append(("taps", resolve_taps(layers, config["taps"]), dflash.get("target_layer_ids")))
        except ValueError:  # taps that fit no drafter: preflight's taps check names them
            pass
    if mask_token_id is not None:
        pairs.append(("the drafter's mask token", mask_token_id, dflash.get("mask_token_id")))
    return [
        f"{KEY}: {key} is {ours} here, and {theirs_value} in {path}: start from a drafter of this shape, or "
        "null for a random start"
        for key, ours, theirs_value in pairs
        if ours != theirs_value
    ]


def start_from(model: Drafter, path: str | Path) -> None:
    """Copies the drafter's weights at `path` into `model` (cast to its dtype); stops, naming every field that
    differs, when it is not the drafter this config builds (the mask token and layer kinds included)."""
    from safetensors.torch import load_file

    from draftsmith.drafter.zlab import config_from_zlab

    folder = Path(path)
    theirs = config_from_zlab(json.loads((folder / "config.json").read_text())).to_json()
    ours = model.cfg.to_json()
    differ = [
        f"{k} {ours[k]} here, {theirs[k]} there"
        for k in ours
        if k not in FREE_FIELDS and ours[k] != theirs[k]
    ]
    if differ:
        raise SystemExit(f"{KEY}: {path} is another drafter's shape ({'; '.join(differ)})")
    model.load_state_dict(load_file(str(folder / FILES[1])))
    print(f"{KEY}: training starts from the weights in {path}", file=sys.stderr)
