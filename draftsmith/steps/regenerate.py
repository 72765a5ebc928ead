"""Regenerate one shard's answers with the target (or every jobs-th of its samples, one of data.regenerate's
jobs_per_shard), once for the whole run (training in rounds): every round's extraction reads them, and no
round decodes again."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from draftsmith.config import section_arg
from draftsmith.core.gpu_pool import acquire
from draftsmith.core.io import link_or_copy, read_json, read_samples, write_json
from draftsmith.core.runtime import set_threads, setup_logging
from draftsmith.dataset.answers import AnswersRejected, judge
from draftsmith.dataset.regenerate import regenerate_into
from draftsmith.engine.memory import NoRoomForAnswers
from draftsmith.plan.rounds import job_rows
from draftsmith.target.files import resolve_target
from draftsmith.target.load import eos_ids_of, load_configured_target


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True)
    p.add_argument("--shard", required=True, help="prepared shard (parquet)")
    p.add_argument("--probe", required=True)
    p.add_argument("--target-json", required=True)
    p.add_argument("--data-json", required=True)
    p.add_argument("--job", type=int, default=0, help="which of the shard's --jobs answers its rows here")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--budget-div", type=int, default=1, help="Snakemake's retry halves the slots")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True, help="the answered samples (parquet); a .json stamp beside it")
    args = p.parse_args(argv)
    setup_logging()
    set_threads(args.threads)
    tcfg, dcfg = section_arg(args.target_json, "target"), section_arg(args.data_json, "data")
    samples, out = read_samples(args.shard), Path(args.out)
    samples = samples.iloc[job_rows(len(samples), args.job, args.jobs)].reset_index(drop=True)
    slots = max(1, int(dcfg["regenerate"]["batch_size"]) // max(1, args.budget_div))
    # the answers are made in a cache beside the output: Snakemake deletes a failed job's outputs, and a shard
    # whose answers fail a check must keep them for the rerun with another threshold. A job's file is named by
    # its share too, so that another count of jobs writes beside it: its jobs find their answers there
    cache = out.parent / "cache" / (out.name if args.jobs == 1 else f"{out.stem}.of{args.jobs}.parquet")
    with acquire(read_json(args.probe)["gpus_per_copy"]) as devices:
        model, tok, _ = load_configured_target(resolve_target(args.target), devices, tcfg)
        try:
            answered, stats = regenerate_into(
                model, tok, samples, cache, target=tcfg, data=dcfg, slots=slots, results=out.parent.parent
            )
            judged = judge(answered, tok, eos_ids_of(model, tok), data=dcfg, shard=out.stem)
        except torch.OutOfMemoryError as e:
            sys.exit(
                f"regeneration: out of memory with {slots} slots ({e}); set data.regenerate.batch_size lower"
            )
        except (NoRoomForAnswers, NotImplementedError, AnswersRejected) as e:
            sys.exit(f"regeneration: {e}")
    link_or_copy(cache, out)
    stats_json = None if stats is None else asdict(stats)
    write_json(
        out.with_suffix(".json"),
        {**read_json(cache.with_suffix(".json")), "stats": stats_json, "judged": judged},
    )
    logging.info("%s: %d answers, %d tokens", out, len(answered), int(answered["num_tokens"].sum()))


if __name__ == "__main__":
    main()
