"""Split the prepared samples into shards balanced by token count (deterministic)."""

import argparse
import logging

from draftsmith import data
from draftsmith.cli import setup_logging

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--samples", required=True)
p.add_argument("--out", nargs="+", required=True, help="one parquet path per shard")
args = p.parse_args()
setup_logging()
parts = data.shard(data.read_samples(args.samples), len(args.out))
for df, path in zip(parts, args.out):
    data.write_parquet(df, path)
    logging.info("%s: %d samples, %d tokens", path, len(df), int(df["num_tokens"].sum()))
