"""Read the user's data, render the chat template, build loss masks, truncate; one row per sample."""

import argparse
import logging

from transformers import AutoTokenizer

from draftsmith import data, store
from draftsmith.cli import json_arg, setup_logging

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--target", required=True, help="model directory or hub id (for its tokenizer)")
p.add_argument("--revision", default=None)
p.add_argument("--data", required=True, help="JSONL/Parquet path or a `datasets` name")
p.add_argument("--data-json", required=True, help="the config's `data` section")
p.add_argument("--out", required=True, help="samples.parquet")
p.add_argument("--stats", required=True, help="stats.json")
args = p.parse_args()
setup_logging()
cfg = json_arg(args.data_json)
tok = AutoTokenizer.from_pretrained(args.target, revision=args.revision)
try:
    samples, stats = data.prepare(
        args.data, tok, int(cfg["max_length"]), bool(cfg["thinking"]), cfg.get("on_bad_record", "error"),
        cfg.get("max_samples"), cfg.get("split", "train"),
    )
except data.BadRecord as e:
    raise SystemExit(f"prepare: bad input: {e}") from None
logging.info("prepared %d samples (%d tokens, %d truncated, %d skipped)", stats.samples, stats.tokens,
             stats.truncated, stats.skipped)
data.write_parquet(samples, args.out)
store.write_json(args.stats, vars(stats))
