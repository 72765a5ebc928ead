"""Training a DFlash drafter on stored target hidden states.

Read top to bottom: anchors -> packed batch -> chunked loss -> one training step -> data plan -> the loop
(checkpoints, metrics, DDP) -> held-out evaluation -> throughput benchmark. Checkpoints are kept per run key
(drafter/checkpoints.py): a killed run resumes, a run of other settings or data starts afresh.

Every sequence contributes up to `anchors_per_seq` blocks, all in one forward/backward: the block-sparse mask
(drafter.mask_mod_for) lets each block see its sequence's context strictly before its anchor and nothing of
the other blocks. Anchors are drawn per (seed, epoch, sample), so a resumed run sees exactly the batches it
would have seen without the interruption.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
import torch

from draftsmith.core.distributed import launch, setup_device, wrap_ddp
from draftsmith.core.gpu_memory import job_memory
from draftsmith.core.io import write_json
from draftsmith.core.runtime import resolve_dtype
from draftsmith.dataset.merge import MergedDataset
from draftsmith.drafter.batches import (
    Batch,
    fit_plan,
    load_batch,
    plan_epoch,
    split_indices,
    subset_indices,
)
from draftsmith.drafter.checkpoints import (
    CHECKPOINTS,
    METRICS,
    checkpoint_bytes,
    drop_other_runs,
    resume,
    run_key,
    save_checkpoint,
)
from draftsmith.drafter.config import DrafterConfig, config_from_target
from draftsmith.drafter.evaluate import evaluate, plot_curves
from draftsmith.drafter.loss import auto_gamma, block_loss, position_weights
from draftsmith.drafter.metrics import log_step, metrics_columns, reopen_metrics
from draftsmith.drafter.model import Drafter, build_masks, uses_flex
from draftsmith.drafter.start import start_from
from draftsmith.drafter.zlab import save_zlab
from draftsmith.plan.sizes import CHECKPOINT_BYTES_PER_PARAM, CHECKPOINTS_KEPT, EXPORT_BYTES_PER_PARAM
from draftsmith.target.files import load_target_head


def run(
    module: str,
    argv: list[str],
    dataset: str,
    target: str,
    out: str,
    drafter_section: dict,
    train_section: dict,
    preset_mask_token_id: int | None,
) -> int:
    """The step's body: takes `train.gpus` devices from the pool; with two or more, re-runs `module` under
    torchrun on them (one process per GPU, rank 0 writes); inside torchrun, or with one device or none, trains
    in place."""
    return launch(
        module,
        argv,
        int(train_section["gpus"]),
        lambda: train(dataset, target, out, drafter_section, train_section, preset_mask_token_id),
    )


def lr_at(step: int, total: int, warmup: int, lr: float) -> float:
    """Linear warm-up, then cosine to zero."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def check_disk(out: Path, model: Drafter, *, checkpoints: bool) -> None:
    """Stops before the first step when the results disk cannot hold what training writes: checkpoints of a
    27B target's drafter are 23 GB each, and a full disk would end the job only after its steps were spent."""
    params = sum(p.numel() for p in model.parameters())
    per_param = EXPORT_BYTES_PER_PARAM + (CHECKPOINT_BYTES_PER_PARAM * CHECKPOINTS_KEPT if checkpoints else 0)
    need = params * per_param
    have = shutil.disk_usage(out).free + checkpoint_bytes(out)  # the run's own are replaced as it goes
    if need > have:
        raise SystemExit(
            f"train: {out} has {have / 1e9:.1f} GB free, and training a drafter of {params / 1e9:.2f}B "
            f"parameters writes up to {need / 1e9:.1f} GB ({CHECKPOINTS_KEPT} checkpoints of "
            f"{params * CHECKPOINT_BYTES_PER_PARAM / 1e9:.1f} GB and the fp32 export). Free space there, "
            "point `results` at a larger disk, or set train.checkpoint_every: 0 in the config (no "
            "checkpoints, no resume)."
        )


@dataclass
class TrainingRun:
    """What the steps of one training run share: the process's place in the job, the data, the model, the
    plan."""

    rank: int
    world: int
    device: torch.device
    dtype: torch.dtype
    tcfg: dict
    ds: MergedDataset
    cfg: DrafterConfig
    pos_w: torch.Tensor
    embed: torch.Tensor
    head: torch.Tensor
    model: Drafter
    opt: torch.optim.Optimizer
    plan_args: tuple[np.ndarray, np.ndarray, int, int, int, int]  # plan_epoch's arguments before the epoch
    held_idx: np.ndarray
    steps_per_epoch: int
    total: int
    warmup: int


def train(
    dataset: str | Path,
    target_dir: str | Path,
    out_dir: str | Path,
    drafter_section: dict,
    train_section: dict,
    preset_mask_token_id: int | None = None,
    stop_after: int | None = None,
) -> dict:
    """Trains (or resumes) a drafter; writes final/, metrics.csv, curves.png, summary.json on rank 0.

    `stop_after` ends the process-equivalent early after that step (tests use it to simulate a kill).
    """
    out = Path(out_dir)
    run = _set_up(
        dataset,
        Path(target_dir),
        drafter_section=drafter_section,
        tcfg=train_section,
        preset_mask_token_id=preset_mask_token_id,
    )
    key = run_key(dataset, run.tcfg, run.cfg, target=Path(target_dir))
    ckpt_dir = out / CHECKPOINTS / key
    if run.rank == 0:
        drop_other_runs(out, key)
    step = start = resume(ckpt_dir, run.model, run.opt, device=run.device)
    if start and run.rank == 0:
        print(f"train: resuming at step {start} of {run.total} from {ckpt_dir}", file=sys.stderr)
    every = int(run.tcfg["checkpoint_every"])  # 0: no checkpoints
    ddp = wrap_ddp(run.model, run.device) if run.world > 1 else run.model
    metrics = None
    if run.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        check_disk(out, run.model, checkpoints=every > 0)
        columns = metrics_columns(run.cfg.block_size)
        metrics = reopen_metrics(out / METRICS, columns, step, kept=ckpt_dir / METRICS)
    from tqdm import tqdm

    bar = tqdm(total=run.total, initial=step, desc="train", disable=run.rank != 0, dynamic_ncols=True)
    autocast = torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.dtype == torch.bfloat16)
    t0, tokens_seen = time.time(), 0
    for step, epoch, lr, stats, gnorm in run_steps(run, ddp, autocast=autocast, start=start):
        tokens_seen += int(stats[-1].item())
        if metrics is not None:
            log_step(
                metrics,
                bar,
                block_size=run.cfg.block_size,
                step=step,
                epoch=epoch,
                lr=lr,
                stats=stats,
                gnorm=gnorm,
                t0=t0,
            )
        bar.update(1)
        if every and (step % every == 0 or step == run.total):
            _checkpoint(ckpt_dir, run, step=step, metrics=out / METRICS)
        if stop_after is not None and step >= stop_after:
            break
    bar.close()
    elapsed = time.time() - t0
    return _finish(out, run, metrics=metrics, step=step, tokens_seen=tokens_seen, elapsed=elapsed)


def sample_ids(ds: MergedDataset) -> list[str]:
    """The samples' ids in the dataset's order; a manifest written by hand without them (benchmarks, tests)
    gets its shard's number and the row."""
    shards = ds.manifest["shards"]
    ids = [
        i
        for k, s in enumerate(shards)
        for i in s.get("sample_ids", [f"{k}:{j}" for j in range(s["num_samples"])])
    ]
    if len(ids) != len(ds):
        raise ValueError(
            f"{ds.manifest_path}: {len(ids)} sample ids for {len(ds)} samples; merge the shards again"
        )
    return ids


def _set_up(
    dataset: str | Path,
    target_dir: Path,
    *,
    drafter_section: dict,
    tcfg: dict,
    preset_mask_token_id: int | None,
) -> TrainingRun:
    """Loads the dataset and the target's embedding and head, builds the drafter and plans the steps; raises
    before any training when the dataset does not fit the target or makes no full step."""
    rank, world, device = setup_device()
    dtype = resolve_dtype(tcfg["dtype"], device)
    ds = MergedDataset(dataset)
    target_cfg = json.loads((target_dir / "config.json").read_text())
    cfg = config_from_target(target_cfg, ds.taps, drafter_section, preset_mask_token_id, target_dir)
    if ds.hidden_size != cfg.hidden_size:
        raise ValueError(f"dataset hidden size {ds.hidden_size} != target hidden size {cfg.hidden_size}")
    pos_w = loss_weights(cfg, tcfg)
    embed, head = frozen_head(target_dir, device, dtype)

    model, opt = _seeded_model(cfg, tcfg, device=device)
    full_idx, held_idx = split_indices(sample_ids(ds), tcfg["heldout_fraction"], tcfg["seed"])
    train_idx = subset_indices(full_idx, tcfg.get("max_samples"), tcfg["seed"])
    plan_args = (
        ds.lengths,
        train_idx,
        tcfg["token_budget"],
        tcfg["anchors_per_seq"],
        cfg.block_size,
        tcfg["seed"],
    )
    batches = len(plan_epoch(*plan_args, 0))
    full_batches = None
    if tcfg.get("steps_as_full") and len(train_idx) < len(full_idx):
        full_batches = len(plan_epoch(ds.lengths, full_idx, *plan_args[2:], 0))
    steps_per_epoch, total, warmup = _schedule(
        batches, samples=len(train_idx), world=world, tcfg=tcfg, full_batches=full_batches
    )
    return TrainingRun(
        rank=rank,
        world=world,
        device=device,
        dtype=dtype,
        tcfg=tcfg,
        ds=ds,
        cfg=cfg,
        pos_w=pos_w,
        embed=embed,
        head=head,
        model=model,
        opt=opt,
        plan_args=plan_args,
        held_idx=held_idx,
        steps_per_epoch=steps_per_epoch,
        total=total,
        warmup=warmup,
    )


def loss_weights(cfg: DrafterConfig, tcfg: dict) -> torch.Tensor:
    """The block positions' loss weights, with `train.gamma` (auto: by the block size)."""
    gamma = auto_gamma(cfg.block_size) if tcfg["gamma"] in (None, "auto") else float(tcfg["gamma"])
    return position_weights(cfg.block_size, gamma)


def frozen_head(
    target_dir: str | Path, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's embedding and LM head on `device`: bf16 when training in bf16, else fp32."""
    embed, head = load_target_head(target_dir)
    head_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    return embed.to(device, head_dtype), head.to(device, head_dtype)


def _seeded_model(
    cfg: DrafterConfig, tcfg: dict, *, device: torch.device, handed_on: bool = False
) -> tuple[Drafter, torch.optim.Optimizer]:
    """The drafter and its optimiser; seeded right before, so the initial weights depend on the seed alone
    (or on `train.init_from`'s drafter). `handed_on`: the caller loads a state handed on by a round before,
    so the start's weights (3.8 GB for a 27B target's drafter) are not read only to be replaced."""
    torch.manual_seed(tcfg["seed"])
    model = Drafter(cfg).to(device)
    if tcfg.get("init_from") and not handed_on:
        start_from(model, tcfg["init_from"])
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=tcfg["lr"],
        betas=(0.9, 0.95),
        weight_decay=tcfg["weight_decay"],
        fused=device.type == "cuda",
    )
    return model, opt


def _schedule(
    batches: int, *, samples: int, world: int, tcfg: dict, full_batches: int | None = None
) -> tuple[int, int, int]:
    """Steps per epoch (a step takes one batch per rank), the total (capped by max_steps) and the warm-up.
    With `full_batches` (a subset trained at the whole split's compute) the total is the whole split's."""
    steps_per_epoch = batches // world
    if steps_per_epoch == 0:
        raise ValueError(f"{samples} training samples make no full step on {world} ranks")
    total = (full_batches or batches) // world * int(tcfg["epochs"])
    if tcfg["max_steps"]:
        total = min(total, int(tcfg["max_steps"]))
    warmup = max(1, int(round(tcfg["warmup_ratio"] * total)))
    return steps_per_epoch, total, warmup


class StepPlans(Protocol):
    """Gives each step's batch in host memory, asked for in step order."""

    def host_batch(self, step: int) -> tuple[int, Batch]: ...


class EpochPlans:
    """Which samples each step trains on, asked for in step order (by the thread that reads one batch ahead):
    an epoch's shuffled plan is made at its first step."""

    def __init__(self, run: TrainingRun):
        self.run = run
        self._epoch, self._plan = -1, list[list[int]]()

    def indices(self, step: int) -> tuple[int, list[int]]:
        run = self.run
        epoch = step // run.steps_per_epoch
        if epoch != self._epoch:
            self._plan = fit_plan(plan_epoch(*run.plan_args, epoch), run.steps_per_epoch * run.world)
            self._epoch = epoch
        return epoch, self._plan[(step % run.steps_per_epoch) * run.world + run.rank]

    def host_batch(self, step: int) -> tuple[int, Batch]:
        """Step `step`'s batch in host memory (page-locked for a GPU), states still as stored."""
        epoch, idx = self.indices(step)
        run = self.run
        return epoch, load_batch(run.ds, idx, epoch, run.tcfg, run.cfg, pin=run.device.type == "cuda")


def run_steps(
    run: TrainingRun,
    ddp: torch.nn.Module,
    *,
    autocast: torch.autocast,
    start: int,
    plans: StepPlans | None = None,
    stop: int | None = None,
) -> Iterator[tuple[int, int, float, torch.Tensor, torch.Tensor]]:
    """Trains steps `start` .. `stop` (run.total), yielding (steps done, epoch, lr, stats, grad norm) after
    each. A thread reads and packs the next step's batch while the device runs this one. `plans` gives each
    step's batch (a round's own plan when training in rounds)."""
    plans = plans or EpochPlans(run)
    end = run.total if stop is None else stop
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="batches") as pool:
        step = start
        ahead = pool.submit(plans.host_batch, step) if step < end else None
        while ahead is not None:
            epoch, batch = ahead.result()
            ahead = pool.submit(plans.host_batch, step + 1) if step + 1 < end else None
            try:
                lr, stats, gnorm = _train_step(run, ddp, autocast=autocast, batch=batch, step=step)
            except torch.OutOfMemoryError as e:
                raise RuntimeError(out_of_memory_message(run, batch, step=step)) from e
            step += 1
            yield step, epoch, lr, stats, gnorm


def out_of_memory_message(run: TrainingRun, batch: Batch, *, step: int) -> str:
    """What to change when a step does not fit: the budget that made the batch, and the GPU's limit."""
    tcfg, limit = run.tcfg, ""
    if run.device.type == "cuda":
        limit = f" in the {job_memory(run.device)[1] / 1e9:.1f} GB this job may use of the GPU (gpu_memory)"
    return (
        f"training: out of memory in step {step}: a batch of {batch.num_tokens} tokens (train.token_budget "
        f"{tcfg['token_budget']}, train.anchors_per_seq {tcfg['anchors_per_seq']}){limit}. Lower "
        "train.token_budget or train.anchors_per_seq, or raise gpu_memory"
    )


def _train_step(
    run: TrainingRun, ddp: torch.nn.Module, *, autocast: torch.autocast, batch: Batch, step: int
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One optimiser step on a host batch; returns the learning rate, the gradient norm and the step's stats
    summed over ranks (the loss averaged): [loss, correct per position, count per position, tokens]."""
    cfg, device, opt = run.cfg, run.device, run.opt
    batch = batch.to(device, run.dtype)
    masks = build_masks(batch.layout, cfg, uses_flex(cfg, device))
    lr = lr_at(step, run.total, run.warmup, run.tcfg["lr"])
    for g in opt.param_groups:
        g["lr"] = lr
    with autocast:
        loss, correct, count = block_loss(ddp, run.embed, run.head, batch, masks, run.pos_w)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.tcfg["grad_clip"])
    opt.step()
    stats = torch.cat(
        [loss.detach().float().view(1), correct, count, torch.tensor([batch.num_tokens], device=device)]
    )
    if run.world > 1:
        torch.distributed.all_reduce(stats)
        stats[0] /= run.world
    return lr, stats, gnorm


def _checkpoint(ckpt_dir: Path, run: TrainingRun, *, step: int, metrics: Path) -> None:
    """Rank 0 saves; the others wait for it, so that no rank runs ahead of the checkpoint a resume starts
    from."""
    if run.rank == 0:
        save_checkpoint(ckpt_dir, step, run.model, run.opt, metrics=metrics)
    if run.world > 1:
        torch.distributed.barrier()


def _finish(
    out: Path,
    run: TrainingRun,
    *,
    metrics: tuple[TextIO, csv.DictWriter] | None,
    step: int,
    tokens_seen: int,
    elapsed: float,
) -> dict:
    """After the last step, rank 0 exports the drafter, evaluates it and writes the summary and curves; a run
    stopped early (`stop_after`) leaves only its checkpoints and metrics."""
    summary: dict = {}
    if run.rank == 0:
        assert metrics is not None  # rank 0 opened them
        metrics[0].close()
        if step >= run.total:
            save_zlab(run.model, out / "final", torch.float32)
            summary = _summarise(out, run)
            # None when this job resumed a finished run and trained nothing: no rate was measured
            summary["tokens_per_s"] = tokens_seen / max(elapsed, 1e-9) if tokens_seen else None
            summary["steps"] = step
            summary["world_size"] = run.world
            write_json(out / "summary.json", summary)
            plot_curves(out / METRICS, out / "curves.png")
    if run.world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return summary


def _summarise(out: Path, run: TrainingRun) -> dict:
    with (out / METRICS).open() as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["loss"]) for r in rows]
    tail = losses[-max(1, len(losses) // 10) :]
    s: dict[str, Any] = {
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "final_loss_mean_last10pct": sum(tail) / len(tail) if tail else None,
    }
    s.update(
        evaluate(
            run.model,
            run.embed,
            lm_head=run.head,
            ds=run.ds,
            indices=run.held_idx,
            tcfg=run.tcfg,
            cfg=run.cfg,
            device=run.device,
            dtype=run.dtype,
        )
    )
    train_idx = run.plan_args[1]
    s["train_samples"] = int(len(train_idx))
    s["train_tokens"] = int(run.ds.lengths[train_idx].sum())
    s["drafter"] = run.cfg.to_json()
    return s
