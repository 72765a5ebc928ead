"""The training's metrics: one CSV row a step, flushed at once so that a killed run keeps it."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import torch

if TYPE_CHECKING:
    from tqdm import tqdm


def metrics_columns(block_size: int) -> list[str]:
    return ["step", "epoch", "lr", "loss", "grad_norm", "tokens", "elapsed_s"] + [
        f"acc_{k}" for k in range(1, block_size)
    ]


def reopen_metrics(path: Path, columns: list[str], resume_step: int, *, kept: Path | None = None):
    """Keeps rows up to the resumed step (a killed run may have logged past its last checkpoint), read from
    the copy `kept` with the checkpoints where there is one: Snakemake deletes metrics.csv before a rerun."""
    rows = []
    source = kept if kept is not None and kept.exists() else path
    if resume_step > 0 and source.exists():
        with source.open() as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
    f = path.open("w", newline="")
    w = csv.DictWriter(f, fieldnames=columns)
    w.writeheader()
    w.writerows(rows)
    f.flush()
    return f, w


def log_step(
    metrics: tuple[TextIO, csv.DictWriter],
    bar: tqdm,
    *,
    block_size: int,
    step: int,
    epoch: int,
    lr: float,
    stats: torch.Tensor,
    gnorm: torch.Tensor,
    t0: float,
) -> None:
    """Rank 0's metrics row for a step, flushed at once so that a killed run keeps it."""
    mfile, mwriter = metrics
    B = block_size
    acc = (stats[1 : 1 + B] / stats[1 + B : 1 + 2 * B].clamp_min(1)).tolist()
    row = {
        "step": step,
        "epoch": epoch,
        "lr": lr,
        "loss": float(stats[0]),
        "grad_norm": float(gnorm),
        "tokens": int(stats[-1].item()),
        "elapsed_s": round(time.time() - t0, 3),
    }
    row.update({f"acc_{k}": acc[k] for k in range(1, B)})
    mwriter.writerow(row)
    mfile.flush()
    bar.set_postfix(loss=f"{row['loss']:.3f}", acc1=f"{acc[1]:.3f}")
