"""A training's checkpoints, kept per run key in OUT/checkpoints/<key>/step_*.pt.

Snakemake deletes the train rule's outputs before a rerun, but not checkpoints/: a job rerun after a change
(train.lr, more epochs, train.init_from, a re-merge, a drafter setting) would resume the earlier run's last
checkpoint, and with the same step count train nothing. The key is a hash of what decides the steps, so such a
job starts afresh, while a killed one (same settings, same data) resumes its own run. Each checkpoint keeps
the run's metrics.csv beside it, which Snakemake deletes with the other outputs before it reruns the job.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftsmith.config import content_hash
from draftsmith.core.io import atomic
from draftsmith.drafter.start import FILES
from draftsmith.plan.sizes import CHECKPOINTS_KEPT

if TYPE_CHECKING:
    from draftsmith.drafter.config import DrafterConfig
    from draftsmith.drafter.model import Drafter

CHECKPOINTS = "checkpoints"  # the folder under the training's out dir
METRICS = "metrics.csv"  # the run's metrics as of its newest checkpoint, beside it
# train keys no step depends on: a run killed and rerun with another value still resumes
FREE_TRAIN_KEYS = ("checkpoint_every",)
START_WEIGHTS = FILES[1]  # model.safetensors of train.init_from's drafter


def run_key(dataset: str | Path, tcfg: dict, cfg: DrafterConfig, *, target: Path) -> str:
    """What decides the run's steps: the train settings (the world size included), the drafter, the merged
    dataset (its manifest and when it was written: a re-merge may write the same text for other states), the
    target's weights (the frozen embedding and head; another target of the same shape keeps the manifest) and
    the weights train.init_from starts from (replaced in place, they keep their path)."""
    manifest = Path(dataset)
    head = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(target.glob("*.safetensors"))]
    settings = {k: v for k, v in tcfg.items() if k not in FREE_TRAIN_KEYS}
    start = None
    if tcfg.get("init_from"):
        weights = (Path(tcfg["init_from"]) / START_WEIGHTS).stat()
        start = [str(tcfg["init_from"]), weights.st_size, weights.st_mtime_ns]
    data = [manifest.read_text(), manifest.stat().st_mtime_ns]
    return content_hash(settings, cfg.to_json(), data, start, [str(target), head])


def drop_other_runs(out: Path, key: str) -> None:
    """Removes every checkpoint of another key (and the unkeyed step_*.pt of earlier versions): they can
    never be resumed by this run, and a 27B target's drafter takes 23 GB a checkpoint. Rank 0 only; the other
    ranks read their own key's folder alone."""
    root = out / CHECKPOINTS
    others = sorted(p for p in root.iterdir() if p.name != key) if root.is_dir() else []
    for p in others:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    if others:
        own = latest_checkpoint(root / key)
        then = f"resumes from its own {own.name}" if own else "starts afresh"
        names = ", ".join(p.name for p in others)
        print(
            f"train: removed the checkpoints of another configuration or data ({names} in {root}); this "
            f"training (run key {key}) {then}",
            file=sys.stderr,
        )


def checkpoint_bytes(out: Path) -> int:
    """What the checkpoints under `out` take on disk (each key's folder, any leftover of a killed write)."""
    return sum(f.stat().st_size for f in (out / CHECKPOINTS).rglob("*") if f.is_file())


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = sorted(ckpt_dir.glob("step_*.pt"))
    return found[-1] if found else None


def save_checkpoint(
    ckpt_dir: Path,
    step: int,
    model: Drafter,
    opt: torch.optim.Optimizer,
    *,
    metrics: Path,
    keep: int = CHECKPOINTS_KEPT,
) -> None:
    """Writes step `step`'s weights and optimiser state; keeps the newest `keep`, the older ones removed
    before the write, so that the disk never holds more than `keep` (what check_disk and the plan count: a 27B
    target's drafter takes 23 GB a checkpoint) and a write killed midway leaves the one before. The run's
    `metrics` (rows up to this step) are copied first, so a resume restores them after Snakemake deleted the
    job's outputs."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    found = sorted(ckpt_dir.glob("step_*.pt"))
    for old in found[: max(0, len(found) - (keep - 1))]:
        old.unlink()
    with atomic(ckpt_dir / METRICS) as tmp:
        shutil.copyfile(metrics, tmp)
    path = ckpt_dir / f"step_{step:08d}.pt"
    with atomic(path) as tmp:
        state = {
            "step": step,
            "model": model.state_dict(),
            "opt": opt.state_dict(),
            "cfg": model.cfg.to_json(),
        }
        torch.save(state, tmp)


def resume(ckpt_dir: Path, model: Drafter, opt: torch.optim.Optimizer, *, device: torch.device) -> int:
    """Loads the latest checkpoint into the model and optimiser (before DDP wraps the model); returns its
    step, 0 where there is none."""
    last = latest_checkpoint(ckpt_dir)
    if last is None:
        return 0
    state = torch.load(last, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return int(state["step"])
