"""Read the user's data, render the chat template, build loss masks, truncate; one row per sample."""

from __future__ import annotations

import argparse
import logging

from draftsmith.config import section_arg
from draftsmith.core.io import write_json, write_parquet
from draftsmith.core.runtime import setup_logging
from draftsmith.dataset.prepare import BadRecord, prepare
from draftsmith.target.files import resolve_target
from draftsmith.target.load import load_tokenizer


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True, help="model directory, hub id or fetched lock file (tokenizer)")
    p.add_argument("--target-json", default="{}", help="the config's target section (chat template)")
    p.add_argument(
        "--data", required=True, nargs="+", help="JSONL/JSON/Parquet files or `datasets` names, read in order"
    )
    p.add_argument("--data-json", required=True, help="the config's `data` section")
    p.add_argument("--out", required=True, help="samples.parquet")
    p.add_argument("--stats", required=True, help="stats.json")
    args = p.parse_args(argv)
    setup_logging()
    cfg = section_arg(args.data_json, "data")
    tok = load_tokenizer(resolve_target(args.target), section_arg(args.target_json, "target"))
    try:
        samples, stats = prepare(
            args.data,
            tok,
            int(cfg["max_length"]),
            bool(cfg["thinking"]),
            cfg["on_bad_record"],
            cfg["max_samples"],
            cfg["split"],
            regenerate=bool(cfg["regenerate"]["enabled"]),
        )
    except BadRecord as e:
        raise SystemExit(f"prepare: bad input: {e}") from None
    logging.info(
        "prepared %d samples (%d tokens, %d truncated to data.max_length, %d skipped)",
        stats.samples,
        stats.tokens,
        stats.truncated,
        stats.skipped,
    )
    if stats.skipped:
        logging.warning(
            "skipped %d of %d records (data.on_bad_record: skip): %s",
            stats.skipped,
            stats.records,
            ", ".join(f"{k}: {v}" for k, v in sorted(stats.problems.items())),
        )
    write_parquet(samples, args.out)
    write_json(args.stats, vars(stats))


if __name__ == "__main__":
    main()
