"""Regenerate one shard's answers with the target, once for the whole run (training in rounds): every
round's extraction reads them, and no round decodes again."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from draftsmith.config import section_arg
from draftsmith.core.gpu_pool import acquire
from draftsmith.core.io import read_json, read_samples, write_json
from draftsmith.core.runtime import set_threads, setup_logging
from draftsmith.dataset.regenerate import regenerate_into
from draftsmith.engine.memory import NoRoomForAnswers
from draftsmith.target.files import resolve_target
from draftsmith.target.load import load_configured_target


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True)
    p.add_argument("--shard", required=True, help="prepared shard (parquet)")
    p.add_argument("--probe", required=True)
    p.add_argument("--target-json", required=True)
    p.add_argument("--data-json", required=True)
    p.add_argument("--budget-div", type=int, default=1, help="Snakemake's retry halves the slots")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True, help="the answered samples (parquet); a .json stamp beside it")
    args = p.parse_args(argv)
    setup_logging()
    set_threads(args.threads)
    tcfg, dcfg = section_arg(args.target_json, "target"), section_arg(args.data_json, "data")
    samples, out = read_samples(args.shard), Path(args.out)
    slots = max(1, int(dcfg["regenerate"]["batch_size"]) // max(1, args.budget_div))
    with acquire(read_json(args.probe)["gpus_per_copy"]) as devices:
        model, tok, _ = load_configured_target(resolve_target(args.target), devices, tcfg)
        try:
            answered, stats = regenerate_into(model, tok, samples, out, target=tcfg, data=dcfg, slots=slots)
        except torch.OutOfMemoryError as e:
            sys.exit(
                f"regeneration: out of memory with {slots} slots ({e}); set data.regenerate.batch_size lower"
            )
        except (NoRoomForAnswers, NotImplementedError) as e:
            sys.exit(f"regeneration: {e}")
    stamp = out.with_suffix(".json")
    write_json(stamp, {**read_json(stamp), "stats": None if stats is None else asdict(stats)})
    logging.info("%s: %d answers, %d tokens", out, len(answered), int(answered["num_tokens"].sum()))


if __name__ == "__main__":
    main()
