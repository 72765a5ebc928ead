"""`python -m draftsmith plan --configfile F`: the run's plan, printed before anything runs (the same table
`snakemake -n` prints), for this machine or for the node it names."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def merge_into(config: dict, values: dict) -> None:
    """`values` over `config`, nested sections key by key (as Snakemake merges several --configfile)."""
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            merge_into(config[key], value)
        else:
            config[key] = value


def load_config(files: list[str]) -> dict:
    """The config files merged in order (later keys over earlier ones at every depth, as Snakemake merges
    several --configfile), checked against the schema and completed with its defaults."""
    import jsonschema
    import yaml

    from draftsmith.config import _fill, _schema

    config: dict = {}
    for f in files:
        merge_into(config, yaml.safe_load(Path(f).read_text()) or {})
    try:
        jsonschema.validate(config, _schema())
    except jsonschema.ValidationError as e:
        where = ".".join(str(k) for k in e.absolute_path) or "the config"
        raise SystemExit(f"plan: {where}: {e.message} ({', '.join(files)})") from None
    return _fill(_schema(), config)


def local_file(config: dict, path: str, demo: str) -> str:
    """Where the workflow reads a configured file: the demo's, a URL's fetched copy, or the path itself."""
    from draftsmith.config import is_url
    from draftsmith.dataset.fetch import fetched_name

    if path == "demo":
        return f"{config['results']}/demo/data/{demo}"
    return f"{config['results']}/inputs/web/{fetched_name(path)}" if is_url(path) else path


def bench_prompts(config: dict) -> int:
    """Bench prompts on this machine now, capped by bench.max_prompts (0 for files not here yet)."""
    from draftsmith.plan.data import count_records

    cap = config["bench"]["max_prompts"]
    counts = [
        count_records(local_file(config, d["path"], "prompts.jsonl"))[0] for d in config["bench"]["datasets"]
    ]
    return sum(min(n, cap) if cap else n for n in counts)


def data_files(config: dict) -> list[str]:
    """The training files as the workflow reads them (a URL's copy once fetched; the demo's once built)."""
    from draftsmith.config import data_sources

    return [local_file(config, p, "train.jsonl") for p in data_sources(config)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m draftsmith plan", description=__doc__)
    p.add_argument("--configfile", nargs="+", default=["config.yaml"], help="config files, merged in order")
    p.add_argument("--gpus", type=int, default=None, help="GPUs of the node (default: those visible here)")
    p.add_argument("--gpu", default=None, help="the GPU's name, for its rates (e.g. 'RTX PRO 6000', 'H200')")
    p.add_argument(
        "--free", default=None, help="free space of the results disk, e.g. 20TB (default: measured here)"
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    a = p.parse_args(argv)
    import os

    from draftsmith.core.gpu_pool import gpu_names, visible_gpus
    from draftsmith.core.units import parse_size
    from draftsmith.plan.data import read_shards, shard_files
    from draftsmith.plan.plan import PlanError, make_plan, render

    config = load_config(a.configfile)
    if a.free is not None:
        os.environ["DRAFTSMITH_FREE_BYTES"] = str(parse_size(a.free, key="--free"))
    gpus = len(visible_gpus()) if a.gpus is None else a.gpus
    name = a.gpu or next(iter(gpu_names()), None) or ("unknown GPU" if gpus else None)
    ext = config["extract"]
    shards = (
        int(ext["shards"])
        if ext["shards"] != "auto"
        else (gpus or int(ext["cpu_slots"])) * int(ext["shards_per_slot"])
    )
    prompts = bench_prompts(config)
    try:
        plan = make_plan(
            config,
            paths=data_files(config),
            gpus=gpus,
            gpu_name=name,
            base_shards=shards,
            bench_prompts=prompts,
            shards=read_shards(config, shard_files(config["results"], shards), base_shards=shards),
        )
    except PlanError as e:
        print(f"plan: {e}", file=sys.stderr)
        return 2
    print(json.dumps(plan, indent=2, default=str) if a.json else render(plan))
    return 0
