"""Write the plan (RESULTS/plan.json and its table) with the prepared data measured, and check that every
round fits the disk budget before any round is extracted."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from draftsmith.core.io import write_json, write_text
from draftsmith.core.logs import setup_logging
from draftsmith.plan.cli import bench_prompts
from draftsmith.plan.data import read_shards
from draftsmith.plan.plan import PlanError, make_plan, pin, read_probe, render, unpin
from draftsmith.plan.rounds import peak_tokens, round_tokens


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config-json", required=True, help="the validated config")
    p.add_argument("--paths", nargs="*", default=[], help="the training files, as jobs read them")
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--gpu-name", default="")
    p.add_argument("--shards", nargs="+", required=True, help="the prepared shards")
    p.add_argument("--rounds", type=int, required=True, help="the rounds the DAG was built with")
    p.add_argument("--out", required=True)
    p.add_argument("--md", required=True)
    args = p.parse_args(argv)
    setup_logging()
    config = json.loads(args.config_json)
    shards = read_shards(config, args.shards, base_shards=len(args.shards))
    # the probe's GPU over the parse's reading: a login node's parse finds none, a job runs after the probe
    gpu_name = next((g["name"] for g in read_probe(config).get("gpus", [])), None) or args.gpu_name or None
    try:
        plan = make_plan(
            config,
            paths=args.paths,
            gpus=args.gpus,
            gpu_name=gpu_name,
            base_shards=len(args.shards),
            bench_prompts=bench_prompts(config),
            shards=shards,
        )
    except PlanError as e:
        unpin(config)
        sys.exit(f"plan: {e}")
    if plan["rounds"] != args.rounds:
        pin(config, plan)  # the next parse plans these; a round's extraction of this DAG stops on them
        sys.exit(
            f"plan: the workflow was planned with {args.rounds} round(s) from an estimate of the data (it "
            f"was not prepared when the run started); weighed on the prepared shards, the rounds are "
            f"{plan['rounds']}. Rerun snakemake: it plans them; no round has been extracted yet, and what is "
            "done is kept"
        )
    if "bytes_per_token" in plan:
        frames, answered = shards or ([], None)
        rounds, held = round_tokens(frames, config, rounds=int(plan["rounds"]), answered=answered)
        per_token = plan["bytes_per_token"][plan["storage"]]
        plan["round_bytes"] = [int(t * per_token) for t in rounds]
        plan["heldout_bytes"] = int(held * per_token)
        in_flight = int(config["extract"]["rounds_in_flight"])
        worst = int(peak_tokens(rounds, held, in_flight=in_flight) * per_token)
        plan["peak_bytes"] = worst
        if worst > plan["budget_bytes"]:
            unpin(config)
            sys.exit(
                f"plan: measured on the prepared data, the {in_flight} largest round(s) "
                "(extract.rounds_in_flight) and the held-out samples take "
                f"{worst / 1e9:.3f} GB but extract.disk_budget gives {plan['budget_bytes'] / 1e9:.3f} GB "
                "(the "
                "rounds were planned from an estimate). Rerun snakemake: it plans again from the measured "
                "data; nothing has been extracted yet"
            )
    pin(config, plan)
    logging.info("plan:\n%s", render(plan))
    write_json(args.out, plan)
    write_text(args.md, "# The run's plan\n\n" + render(plan) + "\n")


if __name__ == "__main__":
    main()
