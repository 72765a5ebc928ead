"""Download one data or prompt file named by URL in the config (data.path, bench.datasets[].path)."""

from __future__ import annotations

import argparse
import logging

from draftsmith.core.runtime import setup_logging
from draftsmith.dataset.fetch import download


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    setup_logging()
    try:
        sha = download(a.url, a.out)
    except OSError as e:
        raise SystemExit(f"fetch_data: {e}") from None
    logging.info("fetched %s -> %s (sha256 %s)", a.url, a.out, sha)


if __name__ == "__main__":
    main()
