"""Finish training in rounds: the last round's state becomes the drafter (final/), evaluated on the held-out
samples, with the rounds' metrics as one curve and a summary as the one-round training writes them."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
import torch

from draftsmith.config import section_arg
from draftsmith.core.distributed import setup_device
from draftsmith.core.io import read_json, write_json
from draftsmith.core.runtime import resolve_dtype, set_threads, setup_logging
from draftsmith.dataset.merge import MergedDataset
from draftsmith.drafter.config import config_from_target
from draftsmith.drafter.evaluate import evaluate, plot_curves
from draftsmith.drafter.model import Drafter
from draftsmith.drafter.rounds import read_metrics
from draftsmith.drafter.train import frozen_head
from draftsmith.drafter.zlab import save_zlab
from draftsmith.steps.train import settled_drafter
from draftsmith.target.files import resolve_target


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--state", required=True, help="the last round's state")
    p.add_argument("--heldout", required=True, help="the held-out samples' merged manifest")
    p.add_argument("--records", nargs="+", required=True, help="every round's record, in training order")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--drafter-json", default="{}")
    p.add_argument("--train-json", default="{}")
    p.add_argument("--target-json", default="{}")
    p.add_argument("--mask-token", default=None, help="mask_check's settled token id (a file)")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    setup_logging()
    set_threads(a.threads)
    target, out = resolve_target(a.target), Path(a.out)
    tcfg = section_arg(a.train_json, "train")
    _, _, device = setup_device()
    dtype = resolve_dtype(tcfg["dtype"], device)
    held = MergedDataset(a.heldout)
    cfg = config_from_target(
        json.loads((target / "config.json").read_text()),
        held.taps,
        settled_drafter(target, a.drafter_json, a.target_json, mask_file=a.mask_token),
    )
    model = Drafter(cfg).to(device)
    model.load_state_dict(torch.load(a.state, map_location=device, weights_only=True)["model"])
    embed, head = frozen_head(target, device, dtype)
    records = [read_json(r) for r in a.records]
    rows = read_metrics([Path(r).with_name("metrics.csv") for r in a.records])
    out.mkdir(parents=True, exist_ok=True)
    with (out / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    save_zlab(model, out / "final", torch.float32)
    summary = _summary(rows, records)
    summary.update(
        evaluate(
            model,
            embed,
            lm_head=head,
            ds=held,
            indices=np.arange(len(held)),
            tcfg=tcfg,
            cfg=cfg,
            device=device,
            dtype=dtype,
        )
    )
    summary["drafter"] = cfg.to_json()
    write_json(out / "summary.json", summary)
    plot_curves(out / "metrics.csv", out / "curves.png")


def _summary(rows: list[dict], records: list[dict]) -> dict:
    """Losses, steps and speed over every round; samples and tokens of one epoch (every epoch visits each
    training sample once)."""
    losses = [float(r["loss"]) for r in rows]
    tail = losses[-max(1, len(losses) // 10) :]
    first_epoch = [r for r in records if r["epoch"] == 0]
    seconds = sum(float(rs[-1]["elapsed_s"]) for rs in _by_round(rows, records) if rs)
    return {
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "final_loss_mean_last10pct": sum(tail) / len(tail),
        "train_samples": sum(len(r["sample_ids"]) for r in first_epoch),
        "train_tokens": sum(int(r["tokens"]) for r in first_epoch),
        "steps": records[-1]["first_step"] + records[-1]["steps"],
        "rounds": len(first_epoch),
        "epochs": len({r["epoch"] for r in records}),
        "world_size": records[-1]["world_size"],
        "tokens_per_s": sum(int(r["tokens"]) for r in rows) / max(seconds, 1e-9),
    }


def _by_round(rows: list[dict], records: list[dict]) -> list[list[dict]]:
    """The metrics rows of each round (by their global step ranges)."""
    out = []
    for rec in records:
        lo, hi = rec["first_step"], rec["first_step"] + rec["steps"]
        out.append([r for r in rows if lo < int(r["step"]) <= hi])
    return out


if __name__ == "__main__":
    main()
