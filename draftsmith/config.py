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


def model_problems(config: dict) -> list[str]:
    """target.model must be a directory with a config.json, or a .gguf file, when it is a local path."""
    from draftsmith.target.files import is_hub_id

    model = config["target"]["model"]
    if model == "demo" or is_hub_id(model):
        return []
    path = Path(model).expanduser()
    if model.endswith(".gguf"):
        return (
            []
            if path.is_file() or made_by_a_job(model, config)
            else [f"target.model: {model!r}: no such file"]
        )
    if not path.is_dir():
        return [
            f"target.model: {model!r} does not exist (no such directory); give a local Hugging Face model "
            "directory, a .gguf file or a hub id such as Qwen/Qwen3-8B"
        ]
    if not (path / "config.json").exists():
        return [f"target.model: {model!r} has no config.json, so it is not a Hugging Face model directory"]
    return []


def parse_time_target(target: dict) -> Path | None:
    """The target's directory when its files are on this machine already: a local directory, or a hub id in
    the Hugging Face cache (read offline). None for the demo and GGUF files (built by a job) and for hub ids
    not fetched yet (the probe and mask_check jobs check those, before any extraction)."""
    from draftsmith.target.files import hub_snapshot, is_hub_id

    model = target["model"]
    if model == "demo" or model.endswith(".gguf"):
        return None
    if is_hub_id(model):
        try:
            path = hub_snapshot(model, revision=target["revision"])
        except FileNotFoundError:
            return None
    else:
        path = Path(model).expanduser()
    return path if (path / "config.json").exists() else None


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


def demo_problems(config: dict) -> list[str]:
    """A real target with the demo's data or prompts: values a config left at the demo's and that nothing
    builds for another model."""
    model = config["target"]["model"]
    if model == "demo":
        return []
    problems = []
    if "demo" in data_sources(config):
        problems.append(
            f"data.path: 'demo' (the default) is the demo's data, made only with the demo target, but "
            f"target.model is {model!r}: set data.path to your records (.jsonl or .parquet: messages, "
            "prompt/response, or prompts only with data.regenerate.enabled); `python -m draftsmith init` "
            "writes a config with every such key"
        )
    for d in config["bench"]["datasets"]:
        if d["path"] == "demo":
            problems.append(
                f"bench.datasets: {d['name']!r} has path 'demo' (the default: the demo's held-out prompts), "
                f"but target.model is {model!r}: give your prompt files (see docs/configuration.md)"
            )
    return problems


DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


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


def data_problems(config: dict) -> list[str]:
    """The training records must exist before anything runs (a `datasets` name is read by prepare)."""
    problems = []
    sources = data_sources(config)
    for k, path in enumerate(sources):
        key = "data.path" if isinstance(config["data"]["path"], str) else f"data.path[{k}]"
        if path == "demo" and len(sources) > 1:
            problems.append(
                f"{key}: 'demo' is the demo's whole data set: it cannot be mixed with other files"
            )
        elif path == "demo" or made_by_a_job(path, config) or Path(path).is_file():
            continue
        elif Path(path).suffix in DATA_SUFFIXES:
            problems.append(
                f"{key}: {path}: no such file (put your records there, or point data.path at them)"
            )
    return problems


def bench_problems(config: dict) -> list[str]:
    """Every bench prompt file on this machine read through, so a bad line stops the run now, not after
    training. Files a job makes (under `results`) and `datasets` names are read by the bench job."""
    from draftsmith.dataset.prompts import prompt_file_problems

    problems = []
    for d in config["bench"]["datasets"]:
        path, key = d["path"], f"bench.datasets[{d['name']}].path"
        if path == "demo" or made_by_a_job(path, config):
            continue
        if Path(path).is_file():
            problems += prompt_file_problems(path, key=key)
        elif Path(path).suffix in DATA_SUFFIXES:
            problems.append(f"{key}: {path}: no such file")
    return problems


def has_chat_template(target_dir: Path) -> bool:
    """Whether the saved tokenizer brings a chat template (in its config, or as a file beside it)."""
    if (target_dir / "chat_template.jinja").exists() or (target_dir / "chat_template.json").exists():
        return True
    tok_cfg = target_dir / "tokenizer_config.json"
    return tok_cfg.exists() and bool(json.loads(tok_cfg.read_text()).get("chat_template"))


def template_problems(config: dict, target_dir: Path) -> list[str]:
    """Base models and converted checkpoints often have no chat template: the user names one or says none."""
    from draftsmith.target.load import NAMED_TEMPLATES

    setting = config["target"]["chat_template"]
    if setting is None:
        if has_chat_template(target_dir):
            return []
        return [
            f"target.chat_template: {config['target']['model']!r} has no chat template (a base model or a "
            "converted checkpoint). Set target.chat_template to a Jinja file of its family's template, to "
            "`chatml` (for tokenizers with <|im_start|>/<|im_end|>), or to `plain` (no template: prompt and "
            "answer concatenated, as base models are trained)"
        ]
    if setting not in NAMED_TEMPLATES and not Path(setting).expanduser().is_file():
        return [f"target.chat_template: {setting!r} is neither {', '.join(NAMED_TEMPLATES)} nor a file"]
    return []


def mask_problems(config: dict, target_dir: Path, notes: list[str]) -> list[str]:
    """The mask token settled now (`target.mask.settle_mask_token`), or a stop that names candidates."""
    from draftsmith.target.mask import no_mask_message, settle_mask_token

    choice = settle_mask_token(target_dir, config["target"], config["drafter"]["mask_token_id"])
    if choice.token_id is None:
        return [no_mask_message(choice)]
    notes.append(f"mask token {choice.token_id}: {choice.reason}")
    return []


def preflight(config: dict, notes: list[str] | None = None) -> list[str]:
    """Every problem found without loading weights: at parse time for targets whose files are here (local, or
    cached from the hub); the probe and mask_check jobs repeat the target checks for the others. `notes`
    collects the choices made (the mask token)."""
    from draftsmith.target.files import text_config

    notes = [] if notes is None else notes
    problems = model_problems(config) + demo_problems(config)
    problems += data_problems(config) + bench_problems(config)
    target_dir = None if problems else parse_time_target(config["target"])
    if target_dir is None:
        return problems
    problems += target_problems(config, text_config(target_dir)) + template_problems(config, target_dir)
    return problems or mask_problems(config, target_dir, notes)


def problems_message(problems: list[str]) -> str:
    return "config preflight failed (fix config.yaml or the --configfile you passed):\n  " + "\n  ".join(
        problems
    )
