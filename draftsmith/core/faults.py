"""Fault drills: environment switches that put a real job into a real failure, for tests and fire drills.

Nothing here fakes a component. Each switch makes the job meet a failure where the real one would strike, so
the recovery path that runs afterwards is the production one:

  DRAFTSMITH_OOM_TOKENS=N     an extraction batch of more than N padded tokens raises torch.OutOfMemoryError
                              from inside the batch loop, as the CUDA allocator would with too little memory
  DRAFTSMITH_FREE_BYTES=N     the disk-space preflight sees N free bytes instead of the real figure
  DRAFTSMITH_PAUSE_AT=POINT   the first job to reach POINT (e.g. `extract:shard001`, `bench:1`) writes its pid
                              to DRAFTSMITH_PAUSE_FILE and waits until that file changes: a test can SIGKILL
                              it mid-write, or start a second run against it. One pause per drill: a job that
                              finds the file already there (a retry of the killed one) goes on.
  DRAFTSMITH_DAMAGE_AT=NAME   the extraction job writing the shard file NAME (e.g. `shard001.r2.safetensors`)
                              zeroes its last 64 bytes once it is complete, as a failing disk or writer would;
                              validation must catch it. Once per drill, like the pause
                              (DRAFTSMITH_PAUSE_FILE's folder keeps a mark).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from draftsmith.core.io import write_text


def check_oom(padded_tokens: int) -> None:
    """Raises the allocator's own error when the emulated memory limit is set and this batch is over it."""
    limit = os.environ.get("DRAFTSMITH_OOM_TOKENS")
    if limit and padded_tokens > int(limit):
        import torch  # here: the workflow's parse reads free_bytes, and torch would double its time

        raise torch.OutOfMemoryError(
            f"CUDA out of memory (emulated by DRAFTSMITH_OOM_TOKENS={limit}): a batch of {padded_tokens} "
            "padded tokens does not fit"
        )


def free_bytes(path: str | Path) -> int:
    """Free bytes on the file system of `path` (or DRAFTSMITH_FREE_BYTES when set)."""
    forced = os.environ.get("DRAFTSMITH_FREE_BYTES")
    if forced:
        return int(forced)
    import shutil

    p = Path(path)
    while not p.exists():  # the output folder may not exist yet: ask its nearest existing parent
        p = p.parent
    return shutil.disk_usage(p).free


def pause(point: str, poll: float = 0.05) -> None:
    """Holds the first job at `point` until DRAFTSMITH_PAUSE_FILE, which it writes its pid into, changes."""
    if os.environ.get("DRAFTSMITH_PAUSE_AT") != point:
        return
    flag = Path(os.environ["DRAFTSMITH_PAUSE_FILE"])
    if flag.exists():
        return
    mine = f"{os.getpid()}\n"
    write_text(flag, mine)
    while flag.exists() and flag.read_text() == mine:
        time.sleep(poll)


DAMAGED_BYTES = 64


def damage(path: str | Path) -> None:
    """Zeroes the tail of a finished shard file when DRAFTSMITH_DAMAGE_AT names it (the first time only)."""
    path = Path(path)
    if os.environ.get("DRAFTSMITH_DAMAGE_AT") != path.name:
        return
    mark = Path(os.environ.get("DRAFTSMITH_PAUSE_FILE", str(path) + ".pause")).with_suffix(".damaged")
    if mark.exists():
        return
    write_text(mark, f"{path}\n")
    with path.open("r+b") as f:
        f.seek(-DAMAGED_BYTES, os.SEEK_END)
        f.write(bytes(DAMAGED_BYTES))
