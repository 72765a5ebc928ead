"""Merge validated shards into one training dataset (a manifest indexing the shard files, no copies)."""

from __future__ import annotations

import argparse
import logging

from draftsmith.core.io import read_json
from draftsmith.core.runtime import setup_logging
from draftsmith.dataset.merge import merge


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--manifests", nargs="+", required=True)
    p.add_argument("--validations", nargs="+", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    setup_logging()
    bad = [v for v in args.validations if not read_json(v).get("ok")]
    if bad:
        raise SystemExit(f"merge: shards failed validation: {bad}")
    try:
        merged = merge(args.manifests, args.out)
    except ValueError as e:
        raise SystemExit(f"merge: {e}") from None
    logging.info(
        "merged %d shards: %d samples, %d tokens",
        merged["num_shards"],
        merged["total_samples"],
        merged["total_tokens"],
    )


if __name__ == "__main__":
    main()
