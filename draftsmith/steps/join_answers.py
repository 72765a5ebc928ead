"""Join a shard's answers from the jobs that answered it (data.regenerate.jobs_per_shard): the rows in the
shard's order, and one stamp whose statistics are the jobs' together, as one job answering the whole shard
writes."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pandas as pd

from draftsmith.core.io import read_json, read_samples, write_json, write_parquet
from draftsmith.core.logs import setup_logging
from draftsmith.dataset.answers import combined


def join(shard: pd.DataFrame, parts: list[pd.DataFrame], *, name: str) -> pd.DataFrame:
    """The jobs' answers in the shard's order; raises when they are not each of the shard's samples once."""
    out = pd.concat(parts, ignore_index=True)
    if sorted(out["id"]) != sorted(shard["id"]) or not out["id"].is_unique:
        raise SystemExit(
            f"join_answers: the answers of {name}'s {len(parts)} jobs ({len(out)} samples) are not its "
            f"{len(shard)} samples, each once; delete RESULTS/answers/{name}.j*.parquet and run again"
        )
    return out.set_index("id", drop=False).loc[shard["id"]].reset_index(drop=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shard", required=True, help="the prepared shard (parquet): its samples, in order")
    p.add_argument("--answers", nargs="+", required=True, help="the jobs' answers (parquet)")
    p.add_argument("--out", required=True, help="the shard's answers (parquet); a .json stamp beside it")
    args = p.parse_args(argv)
    setup_logging()
    out = Path(args.out)
    shard = pd.read_parquet(args.shard, columns=["id"])  # its order: the samples' tokens are in the answers
    answers = join(shard, [read_samples(f) for f in args.answers], name=out.stem)
    stamps = [read_json(Path(f).with_suffix(".json")) for f in args.answers]
    write_parquet(answers, out)
    write_json(
        out.with_suffix(".json"),
        {"answers": len(answers), "jobs": stamps, "judged": combined([s["judged"] for s in stamps])},
    )
    logging.info("%s: %d answers from %d jobs", out, len(answers), len(stamps))


if __name__ == "__main__":
    main()
