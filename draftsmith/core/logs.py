"""What every step sets up first, without torch: one log per job, JSON arguments, an exit without teardown.
The steps that only move files and tables import this rather than draftsmith.core.runtime, so that they start
in well under a second instead of paying torch's import (about 2 s of a CPU core) in every job."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, NoReturn


def setup_logging(verbose: bool = False) -> None:
    """One readable log per job: Snakemake redirects stderr into the rule's log file."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def exit_now(code: int) -> NoReturn:
    """Ends a job whose outputs are complete without Python's teardown: freeing the CUDA context, collecting
    the model and joining Inductor's worker pool took seconds a job on a GPU, and a run in rounds chains its
    training jobs one after another. The logs are flushed first; Inductor's workers end themselves when their
    parent goes."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def json_arg(text: str) -> Any:
    return json.loads(text) if text else {}
