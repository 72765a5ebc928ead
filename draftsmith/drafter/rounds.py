"""Training in rounds (extract.disk_budget): each round trains on its own hidden states, from the state the
round before it handed on. The step count, the learning-rate schedule and the batches are planned over every
round of every epoch before the first step, from the answers' token counts, so a round's job knows where in
the run it stands without the other rounds' states on disk."""

from __future__ import annotations

import csv
import json
import math
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from draftsmith.core import faults
from draftsmith.core.distributed import setup_device, wrap_ddp
from draftsmith.core.io import atomic, write_json
from draftsmith.core.runtime import resolve_dtype
from draftsmith.dataset.merge import MergedDataset
from draftsmith.drafter.batches import fit_plan, load_batch, plan_epoch, subset_indices
from draftsmith.drafter.config import config_from_target
from draftsmith.drafter.metrics import log_step, metrics_columns, reopen_metrics
from draftsmith.drafter.train import (
    TrainingRun,
    _seeded_model,
    frozen_head,
    loss_weights,
    run_steps,
    sample_ids,
)
from draftsmith.plan.rounds import row_rounds

ROUND_STRIDE = 1_000_003  # epoch x stride + round seeds a round's shuffle: no two (epoch, round) share one


@dataclass
class Position:
    """One (epoch, position) of the run: the round it trains, its first global step and its step count."""

    epoch: int
    position: int
    round: int
    first_step: int
    steps: int


def round_lengths(answers: list[str], data: dict, rows: dict) -> list[np.ndarray]:
    """Token counts of each round's training samples, in the order its merged dataset holds them (base shard
    by base shard, rows in order)."""
    rounds, per_round = int(rows["rounds"]), []
    for a in answers:  # each shard's layout computed once, then cut by round
        df = pd.read_parquet(a, columns=["id", "num_tokens", "prompt_len"])
        where = row_rounds(
            df, data, rounds=rounds, fraction=float(rows["heldout_fraction"]), seed=int(rows["seed"])
        )
        per_round.append([df["num_tokens"].to_numpy(dtype=np.int64)[where == r] for r in range(rounds)])
    return [np.concatenate([shard[r] for shard in per_round]) for r in range(rounds)]


def round_subsets(lengths: list[np.ndarray], max_samples: int | None, seed: int) -> list[np.ndarray]:
    """Each round's samples that train (indices in its merged order): all of them, or for a study's size
    (`max_samples`) its seeded draw over every round's samples taken together, so that a smaller size's
    samples are all in every larger one, as on disk."""
    sizes = [len(x) for x in lengths]
    if max_samples is None:
        return [np.arange(n) for n in sizes]
    kept = subset_indices(np.arange(sum(sizes)), int(max_samples), seed)
    starts = np.cumsum([0, *sizes[:-1]])
    return [kept[(kept >= a) & (kept < a + n)] - a for a, n in zip(starts, sizes)]


def round_plan(
    lengths: np.ndarray, tcfg: dict, *, block: int, world: int, epoch: int, rid: int
) -> list[list[int]]:
    """A round's batches for an epoch: every sample once, as many batches as make whole steps on `world`
    ranks (the fullest split, never a sample dropped)."""
    batches = plan_epoch(
        lengths,
        np.arange(len(lengths)),
        int(tcfg["token_budget"]),
        int(tcfg["anchors_per_seq"]),
        block,
        int(tcfg["seed"]),
        epoch * ROUND_STRIDE + rid,
    )
    return fit_plan(batches, math.ceil(len(batches) / world) * world)


def schedule(
    lengths: list[np.ndarray], order: list[list[int]], tcfg: dict, *, block: int, world: int
) -> list[Position]:
    """Every position of the run, in training order, with its global first step."""
    out, step = [], 0
    for epoch, rounds in enumerate(order):
        for pos, rid in enumerate(rounds):
            steps = (
                len(round_plan(lengths[rid], tcfg, block=block, world=world, epoch=epoch, rid=rid)) // world
            )
            out.append(Position(epoch, pos, rid, step, steps))
            step += steps
    return out


class RoundPlans:
    """Which samples each step of a round trains on (the round's plan, indexed by global step)."""

    def __init__(self, run: TrainingRun, plan: list[list[int]], *, epoch: int, first: int):
        self.run, self.plan, self.epoch, self.first = run, plan, epoch, first

    def host_batch(self, step: int):
        run = self.run
        idx = self.plan[(step - self.first) * run.world + run.rank]
        return self.epoch, load_batch(
            run.ds, idx, self.epoch, run.tcfg, run.cfg, pin=run.device.type == "cuda"
        )


def train_round(
    dataset: str | Path,
    target_dir: str | Path,
    *,
    drafter_section: dict,
    tcfg: dict,
    epoch: int,
    position: int,
    order: list[list[int]],
    lengths: list[np.ndarray],
    previous: str | None,
    state_out: str | Path,
    metrics_path: str | Path,
    record_out: str | Path,
    then: tuple[str | Path, str | Path] | None = None,
) -> None:
    """Trains one round's steps from the previous round's state (or the seeded start), then hands its state
    on and writes its record: the samples it trained, in order. With `then` (a record and a metrics path) the
    same process goes on to the next epoch's first position, which trains the same round's states
    (extract.reuse_last_round), and hands on the state after it: one job's start-up for the two."""
    kept = round_subsets(lengths, tcfg.get("max_samples"), int(tcfg["seed"]))
    run, positions = _round_run(
        dataset,
        Path(target_dir),
        drafter_section=drafter_section,
        tcfg=tcfg,
        epoch=epoch,
        position=position,
        order=order,
        lengths=lengths,
        kept=kept,
        previous=previous,
    )
    mine = [(_position(positions, epoch, position), metrics_path, record_out)]
    if then is not None:
        nxt = _position(positions, epoch + 1, 0)
        if nxt.round != mine[0][0].round:
            raise SystemExit(f"train_round: epoch {epoch + 1} does not begin with round {mine[0][0].round}")
        mine.append((nxt, then[1], then[0]))
    ddp = wrap_ddp(run.model, run.device) if run.world > 1 else run.model  # once for a turn's two positions
    for me, metrics, record_path in mine:
        rows = kept[me.round]  # the plan indexes the round's training samples; the dataset holds them all
        plan = round_plan(
            lengths[me.round][rows],
            tcfg,
            block=run.cfg.block_size,
            world=run.world,
            epoch=me.epoch,
            rid=me.round,
        )
        plan = [[int(rows[i]) for i in batch] for batch in plan]
        _train_steps(run, ddp, RoundPlans(run, plan, epoch=me.epoch, first=me.first_step), me, metrics)
        if run.rank == 0:
            write_json(record_path, _record(run, me, plan))
    if run.rank == 0:
        last = mine[-1][0]
        state = {
            "step": last.first_step + last.steps,
            "model": run.model.state_dict(),
            "opt": run.opt.state_dict(),
        }
        with atomic(state_out) as tmp:
            torch.save({**state, "cfg": run.cfg.to_json(), "uid": uuid.uuid4().hex}, tmp)
    if run.world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def _position(positions: list[Position], epoch: int, position: int) -> Position:
    return next(p for p in positions if (p.epoch, p.position) == (epoch, position))


def _record(run: TrainingRun, me: Position, plan: list[list[int]]) -> dict:
    """A position's record: where it stands in the run, and the samples it trained, in order."""
    ids = sample_ids(run.ds)
    record: dict[str, object] = {"epoch": me.epoch, "position": me.position, "round": me.round}
    record["first_step"] = me.first_step
    record.update(steps=me.steps, total_steps=run.total, world_size=run.world)
    record["tokens"] = int(sum(int(run.ds.lengths[i]) for b in plan for i in b))
    record["sample_ids"] = [ids[i] for b in plan for i in b]
    return record


def _round_run(
    dataset: str | Path,
    target_dir: Path,
    *,
    drafter_section: dict,
    tcfg: dict,
    epoch: int,
    position: int,
    order: list[list[int]],
    lengths: list[np.ndarray],
    kept: list[np.ndarray],
    previous: str | None,
) -> tuple[TrainingRun, list[Position]]:
    """The round's data, drafter and optimiser (from the state handed on), and every position of the run;
    raises when the dataset or the state is not the one the schedule expects."""
    rank, world, device = setup_device()
    dtype = resolve_dtype(tcfg["dtype"], device)
    ds = MergedDataset(dataset)
    cfg = config_from_target(json.loads((target_dir / "config.json").read_text()), ds.taps, drafter_section)
    trained = [x[k] for x, k in zip(lengths, kept)]
    positions = schedule(trained, order, tcfg, block=cfg.block_size, world=world)
    me = _position(positions, epoch, position)
    if ds.lengths.tolist() != lengths[me.round].tolist():
        raise SystemExit(f"train_round: {dataset} does not hold round {me.round}'s samples as planned")
    model, opt = _seeded_model(cfg, tcfg, device=device, handed_on=bool(previous))
    if previous:
        state = torch.load(previous, map_location=device, weights_only=True)
        if int(state["step"]) != me.first_step:
            raise SystemExit(
                f"train_round: {previous} ends at step {state['step']}, this round starts at {me.first_step}"
            )
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    embed, head = frozen_head(target_dir, device, dtype)
    total = sum(p.steps for p in positions)
    run = TrainingRun(
        rank=rank,
        world=world,
        device=device,
        dtype=dtype,
        tcfg=tcfg,
        ds=ds,
        cfg=cfg,
        pos_w=loss_weights(cfg, tcfg),
        embed=embed,
        head=head,
        model=model,
        opt=opt,
        plan_args=(ds.lengths, np.arange(len(ds)), 0, 0, 0, 0),
        held_idx=np.zeros(0, dtype=np.int64),
        steps_per_epoch=me.steps,
        total=total,
        warmup=max(1, int(round(tcfg["warmup_ratio"] * total))),
    )
    return run, positions


def _train_steps(
    run: TrainingRun, ddp: torch.nn.Module, plans: RoundPlans, me: Position, metrics_path: str | Path
) -> None:
    """The round's steps, a metrics row each (global step numbers) on rank 0."""
    from tqdm import tqdm

    metrics = (
        reopen_metrics(Path(metrics_path), metrics_columns(run.cfg.block_size), 0) if run.rank == 0 else None
    )
    bar = tqdm(
        total=me.steps, desc=f"train e{me.epoch} round {me.round}", disable=run.rank != 0, dynamic_ncols=True
    )
    autocast = torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.dtype == torch.bfloat16)
    t0 = time.time()
    stop = me.first_step + me.steps
    for step, epoch, lr, stats, gnorm in run_steps(
        run, ddp, autocast=autocast, start=me.first_step, plans=plans, stop=stop
    ):
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
        faults.pause(f"train_round:e{me.epoch}p{me.position}")  # a kill drill, mid-round
    bar.close()
    if metrics is not None:
        metrics[0].close()


def read_metrics(paths: list[str | Path]) -> list[dict]:
    """The rounds' metrics rows in training order."""
    rows: list[dict] = []
    for p in paths:
        with Path(p).open() as f:
            rows += list(csv.DictReader(f))
    return rows
