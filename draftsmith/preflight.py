"""Preflight: every problem of a config that can be known without loading weights, found when the workflow is
parsed (local targets, files on this machine) and again in the probe job (hub targets), so a wrong key stops
the run before any job starts. The checks read the target's config.json, its tokenizer files and the first
records of the data files."""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.config import data_sources, made_by_a_job, taps_out_of_range

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
    kinds = sorted(set(expect.get("layer_kinds") or []))
    if kinds and kinds != layer_kinds(text_cfg):
        problems.append(
            f"target.expect.layer_kinds: the preset is for a model whose layers are {', '.join(kinds)}, but "
            f"{model!r} has {', '.join(layer_kinds(text_cfg))}: its drafter and settings were chosen for "
            "the other. Copy the preset of this model from configs/, or write one with `python -m draftsmith "
            "init`"
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
FIRST_RECORDS = 100  # records of each data file read at parse time
LISTED_LINES = 10  # bad lines a problem names before it counts the rest


def template_fields_problems(templates: list[str]) -> list[str]:
    """data.templates must be format strings that name a field each (a template without one would make
    every record the same prompt)."""
    import string

    problems = []
    for k, template in enumerate(templates):
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as e:
            why = str(e)
        else:
            if fields and all(fields):
                continue
            why = "a field must be named ('{}' is not)" if fields else "it names no field"
        problems.append(
            f"data.templates[{k}]: {template!r}: {why}; write the record's fields in braces, as in "
            "'{Body} {Question}'"
        )
    return problems


def data_problems(config: dict) -> list[str]:
    """The training records must exist before anything runs (a `datasets` name is read by prepare)."""
    problems = template_fields_problems(config["data"].get("templates") or [])
    if problems:
        return problems
    sources = data_sources(config)
    for k, path in enumerate(sources):
        key = "data.path" if isinstance(config["data"]["path"], str) else f"data.path[{k}]"
        if path == "demo" and len(sources) > 1:
            problems.append(
                f"{key}: 'demo' is the demo's whole data set: it cannot be mixed with other files"
            )
        elif path == "demo" or made_by_a_job(path, config):
            continue
        elif Path(path).is_file():
            problems += first_records_problems(path, key=key, data=config["data"])
        elif Path(path).suffix in DATA_SUFFIXES:
            problems.append(
                f"{key}: {path}: no such file (put your records there, or point data.path at them)"
            )
    return problems


def first_records_problems(path: str, *, key: str, data: dict) -> list[str]:
    """The first records of a training file read as prepare will read them: records of no known shape (a
    `{"text": ...}` corpus, say) and, with regeneration off, prompts without answers stop the run now, named
    by FILE:LINE, instead of in prepare."""
    from draftsmith.dataset.prepare import BadRecord, iter_records, to_messages

    bad, prompt_only, seen = [], [], 0
    try:
        for source, line, rec in iter_records(path):
            if seen == FIRST_RECORDS:
                break
            seen += 1
            try:
                if isinstance(rec, Exception):
                    raise rec
                msgs = to_messages(rec, data.get("templates") or ())
            except BadRecord as e:
                bad.append(f"{source}:{line}: {e}")
                continue
            if msgs[-1]["role"] != "assistant":
                prompt_only.append(f"{source}:{line}")
    except (BadRecord, OSError, ValueError) as e:
        return [f"{key}: {e}"]
    problems = []
    if bad and (data["on_bad_record"] == "error" or len(bad) == seen):
        problems.append(f"{key}: {listed(bad)}")
    if prompt_only and not data["regenerate"]["enabled"]:
        problems.append(
            f"{key}: {listed([f'{w}: a prompt without an answer' for w in prompt_only])}; with "
            "data.regenerate.enabled false there is nothing to train on: set it to true (the target writes "
            "the answers) or give records with answers"
        )
    return problems


def listed(lines: list[str]) -> str:
    """Up to LISTED_LINES of `lines`, and how many more."""
    more = len(lines) - LISTED_LINES
    return "; ".join(lines[:LISTED_LINES]) + (f"; and {more} more" if more > 0 else "")


def expect_problems(config: dict) -> list[str]:
    """A hub target not fetched yet, checked against the preset's `target.expect` (taps, mask tokens)."""
    expect = config["target"]["expect"] or {}
    if not {"num_hidden_layers", "vocab_size"} <= set(expect):
        return []
    return target_problems(config, {**expect, "layer_types": expect.get("layer_kinds")})


def layer_kinds(text_cfg: dict) -> list[str]:
    """The kinds of a target's decoder layers, sorted: its config's `layer_types`; else linear and full
    attention where it gives a `full_attention_interval` (Qwen3-Next and Qwen3.5 configs without the list);
    else full attention."""
    if text_cfg.get("layer_types"):
        return sorted(set(text_cfg["layer_types"]))
    if int(text_cfg.get("full_attention_interval") or 1) > 1:
        return ["full_attention", "linear_attention"]
    return ["full_attention"]


def drafter_problems(config: dict) -> list[str]:
    """The drafter's layer kinds against its own depth and window (`layer_types_problems`)."""
    from draftsmith.drafter.config import layer_types_problems

    d = config["drafter"]
    return layer_types_problems(d["layer_types"] or [], int(d["num_layers"]), d["sliding_window"])


def serving_notes(config: dict) -> list[str]:
    """What an engine will serve otherwise than draftsmith trains it: vLLM 0.22 runs sliding DFlash layers as
    full attention, so a window shorter than the contexts trained on is one it does not keep
    (docs/serving.md measures what that costs)."""
    from draftsmith.drafter.config import SLIDING

    d, length = config["drafter"], int(config["data"]["max_length"])
    window = d["sliding_window"]
    if SLIDING not in (d["layer_types"] or []) or not window or int(window) >= length:
        return []
    return [
        f"drafter.sliding_window {window} is shorter than data.max_length {length}: vLLM 0.22 serves sliding "
        f"DFlash layers as full attention, so past {window} tokens of context they see what training never "
        "showed them, and accept less (docs/serving.md); SGLang and z-lab's package keep the window. For "
        "vLLM, set drafter.layer_types to full layers, or drafter.sliding_window to data.max_length"
    ]


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


def thinking_problems(config: dict) -> list[str]:
    """The bench renders its prompts with the training data's thinking switch, unless told otherwise."""
    bench, thinking = config["bench"], config["data"]["thinking"]
    if bool(bench["thinking"]) == bool(thinking) or bench["thinking_unlike_data"]:
        return []
    return [
        f"bench.thinking: {bench['thinking']}, and the training answers are rendered with data.thinking: "
        f"{thinking}. A drafter trained one way and served the other accepts little (z-lab/dflash #133): set "
        "both alike, or bench.thinking_unlike_data: true to compare them on purpose"
    ]


def has_chat_template(target_dir: Path) -> bool:
    """Whether the saved tokenizer brings a chat template (in its config, or as a file beside it)."""
    if (target_dir / "chat_template.jinja").exists() or (target_dir / "chat_template.json").exists():
        return True
    tok_cfg = target_dir / "tokenizer_config.json"
    return tok_cfg.exists() and bool(json.loads(tok_cfg.read_text()).get("chat_template"))


def template_problems(config: dict, target_dir: Path) -> list[str]:
    """Base models and converted checkpoints often have no chat template: the user names one or says none."""
    from draftsmith.target.templates import NAMED_TEMPLATES

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
    from draftsmith.target.mask import no_mask_message, settle_at_parse

    choice = settle_at_parse(target_dir, config["target"], config["drafter"]["mask_token_id"])
    if choice.token_id is None:
        return [no_mask_message(choice)]
    notes.append(f"mask token {choice.token_id}: {choice.reason}")
    return []


def preflight(config: dict, notes: list[str] | None = None) -> list[str]:
    """Every problem found without loading weights: at parse time for targets whose files are here (local, or
    cached from the hub); the probe, mask_check and start_check jobs repeat the target checks for the others.
    `notes` collects the choices made (the mask token)."""
    from draftsmith.drafter.start import start_problems
    from draftsmith.target.files import text_config

    notes = [] if notes is None else notes
    notes += serving_notes(config)
    problems = model_problems(config) + demo_problems(config) + drafter_problems(config)
    problems += data_problems(config) + bench_problems(config) + thinking_problems(config)
    target_dir = None if problems else parse_time_target(config["target"])
    if target_dir is None:
        return problems + start_problems(config) or expect_problems(config)
    text_cfg = text_config(target_dir)
    problems += target_problems(config, text_cfg) + template_problems(config, target_dir)
    problems += start_problems(config, text_cfg)
    return problems or mask_problems(config, target_dir, notes)


def problems_message(problems: list[str]) -> str:
    return "config preflight failed (fix config.yaml or the --configfile you passed):\n  " + "\n  ".join(
        problems
    )
