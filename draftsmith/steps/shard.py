"""Split the prepared samples into shards balanced by token count (deterministic)."""

from __future__ import annotations

import argparse
import logging

from draftsmith.core.io import read_samples, write_parquet
from draftsmith.core.logs import setup_logging
from draftsmith.dataset.shard import shard


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--samples", required=True)
    p.add_argument("--out", nargs="+", required=True, help="one parquet path per shard")
    args = p.parse_args(argv)
    setup_logging()
    parts = shard(read_samples(args.samples), len(args.out))
    for df, path in zip(parts, args.out):
        write_parquet(df, path)
        logging.info("%s: %d samples, %d tokens", path, len(df), int(df["num_tokens"].sum()))


if __name__ == "__main__":
    main()
