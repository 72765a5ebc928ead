"""Small helpers the thin entry points in scripts/ share."""

from __future__ import annotations

import json
import logging
import sys


def setup_logging(verbose: bool = False) -> None:
    """One readable log per job: Snakemake redirects stderr into the rule's log file."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def json_arg(text: str) -> dict | list:
    return json.loads(text) if text else {}


def set_threads(threads: int | None) -> None:
    """CPU jobs share the machine: each uses only the threads Snakemake gave it."""
    if threads:
        import torch

        torch.set_num_threads(threads)
