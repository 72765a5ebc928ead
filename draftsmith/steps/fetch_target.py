"""Fetch a hub target into this machine's Hugging Face cache, and pin the commit every later job reads.

The lock file it writes (model, revision asked for, commit fetched) is what the other jobs get as `--target`:
each resolves it to the same snapshot in its own machine's cache, offline, so a branch that moves during a run
changes nothing. HF_HOME, HF_HUB_CACHE and HF_HUB_OFFLINE apply as in any Hugging Face tool."""

from __future__ import annotations

import argparse
import logging
import time

from draftsmith.core.io import write_json
from draftsmith.core.runtime import setup_logging
from draftsmith.target.files import hub_snapshot


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="hub id, org/name")
    p.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    p.add_argument("--out", required=True, help="the lock file (JSON)")
    args = p.parse_args(argv)
    setup_logging()
    start = time.perf_counter()
    try:
        snapshot = hub_snapshot(args.model, revision=args.revision, download=True)
    except FileNotFoundError as e:
        raise SystemExit(f"fetch_target: {e}") from None
    files = sorted(f for f in snapshot.rglob("*") if f.is_file())
    size = sum(f.stat().st_size for f in files)
    logging.info(
        "%s at %s: %d files, %.2f GB in %s (%.0f s)",
        args.model,
        snapshot.name,
        len(files),
        size / 1e9,
        snapshot,
        time.perf_counter() - start,
    )
    lock = {"model": args.model, "revision": args.revision, "commit": snapshot.name, "bytes": size}
    write_json(args.out, lock)


if __name__ == "__main__":
    main()
