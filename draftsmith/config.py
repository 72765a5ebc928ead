"""The workflow config as code reads it: schema defaults, tap resolution, the content hash, where data lives.

The schema (workflow/schemas/config.schema.yaml) is the only place defaults live: Snakemake fills them when it
validates the config, and a step run by hand fills the sections it is given from the same schema
(`with_defaults`). Code reads config values; it never restates a default. The checks of a config against its
target and files are in `draftsmith.preflight`."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from pathlib import Path

SCHEMA = Path(__file__).resolve().parent.parent / "workflow" / "schemas" / "config.schema.yaml"

# the bench settings the target's own answers to the bench prompts depend on (speculative/reference.py): a
# change to any other bench key (methods, budgets, block size) keeps them
BENCH_REFERENCE_KEYS = ("max_new_tokens", "temperature", "thinking", "max_prompts", "warmup")


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


def made_by_a_job(path: str, config: dict) -> bool:
    """A file under `results` (the demo's data, a URL's copy) is an output of the workflow, not the user's."""
    return is_url(path) or Path(path).resolve().is_relative_to(Path(config["results"]).resolve())


def is_url(path: str) -> bool:
    """A data or prompt file on the web: the fetch_data job downloads it once into results/inputs/web."""
    return path.startswith(("https://", "http://"))


def data_sources(config: dict) -> list[str]:
    """`data.path` as a list (one file, or several read in order)."""
    path = config["data"]["path"]
    return [path] if isinstance(path, str) else list(path)
