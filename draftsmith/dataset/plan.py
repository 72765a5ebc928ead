"""What an extraction job settles before it loads the model: length-sorted batches under the token budget, the
tokens it will write, and whether they fit on the disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from draftsmith.core.faults import free_bytes
from draftsmith.core.io import tmp_path
from draftsmith.dataset.shard_sizes import hidden_value_bytes, shard_bytes


def make_batches(lengths: list[int] | np.ndarray, token_budget: int) -> list[list[int]]:
    """Length-sorted batches whose padded size (rows x longest) stays within the token budget.

    Greedy filling pads badly where lengths are sparse (a log-uniform 64..8192 mix wastes ~20% at a 64k budget
    on a few hundred samples), so the cut points are chosen by dynamic programming over the sorted lengths,
    minimising padded tokens plus a per-batch cost: a small fixed overhead, and a floor that charges tiny
    batches as if they were budget/16 tokens (small matmuls run below peak; on an H200 a 27B body already runs
    at full speed on one 4096-token row, so a 64k budget's floor of 4096 costs nothing). Longest first, so an
    out-of-memory batch shows up in the first seconds, not at the end. One sample longer than the budget forms
    its own batch.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    sl = lengths[order]
    n = len(sl)
    overhead, floor = max(1, token_budget // 256), token_budget // 16
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    cut = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):  # best[j]: cheapest split of the j longest samples; the last batch is sl[i:j]
        shortest = max(int(sl[j - 1]), 1)
        i = np.arange(max(0, j - token_budget // shortest - 1), j)
        rows = j - i
        padded = rows * sl[i]  # sl[i] is the batch's longest
        cost = best[i] + np.maximum(padded, floor) + overhead
        cost[(padded > token_budget) & (rows > 1)] = np.inf
        k = int(np.argmin(cost))
        best[j], cut[j] = cost[k], i[k]
    batches: list[list[int]] = []
    j = n
    while j > 0:
        batches.append([int(x) for x in order[cut[j] : j]])
        j = int(cut[j])
    return batches[::-1]


def check_disk_space(
    out_path: str | Path, tokens: int, num_samples: int, taps: int, hidden: int, storage: str
) -> int:
    """Stops before any GPU work when the shard cannot fit on its disk; returns the estimated bytes.

    A shard's size is known before it is computed (tokens x taps x hidden x bytes per element, plus ids, mask
    and offsets), so a full disk is a message at the start instead of a crash hours in.
    """
    need = shard_bytes(tokens, num_samples, taps * hidden, storage)
    out_path = Path(out_path)
    free = free_bytes(out_path.parent)
    stale = tmp_path(out_path)  # a killed attempt's partial file is replaced, so its blocks count as free
    if stale.exists():
        free += stale.stat().st_blocks * 512
    if need > free:
        raise OSError(
            f"not enough disk space for {out_path}: it needs {need} bytes ({need / 1e9:.2f} GB = {tokens} "
            f"tokens x {taps} taps x {hidden} hidden x {hidden_value_bytes(storage)} bytes, plus ids and "
            f"index) but {out_path.parent} has {free} bytes ({free / 1e9:.2f} GB) free; free space or point "
            "`results` at a larger disk (or use extract.storage: fp8, half the bytes), then rerun snakemake"
        )
    return need
