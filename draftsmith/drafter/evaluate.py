"""Held-out evaluation of a trained drafter (accuracy per block position against a frequency baseline, and the
acceptance length a greedy loop would see), the run's summary and its training curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from draftsmith.dataset.merge import MergedDataset
from draftsmith.drafter.batches import load_batch, plan_epoch
from draftsmith.drafter.config import DrafterConfig
from draftsmith.drafter.loss import block_loss, position_weights
from draftsmith.drafter.model import Drafter, build_masks, uses_flex

EVAL_EPOCH = 1_000_000  # anchor seed of the held-out evaluation: fixed, and never a training epoch


@torch.no_grad()
def evaluate(
    model: Drafter,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    ds: MergedDataset,
    indices: np.ndarray,
    tcfg: dict,
    cfg: DrafterConfig,
    device: torch.device,
    dtype: torch.dtype,
) -> dict:
    """Held-out accuracy per block position, the frequency baseline for position 1 (always predicting the
    most frequent position-1 label of the held-out set: what a drafter that ignores the context would get),
    and `heldout_tau`: 1 + the mean run of correct predictions from position 1 over the held-out blocks, the
    acceptance length a greedy loop would see at those anchors when the answers are the target's own."""
    B = cfg.block_size
    correct, count = torch.zeros(B), torch.zeros(B)
    runs: list[torch.Tensor] = []
    first_labels: list[torch.Tensor] = []
    pos_w = position_weights(B, 1.0)
    model.eval()
    batches = plan_epoch(
        ds.lengths, indices, tcfg["token_budget"], tcfg["anchors_per_seq"], B, tcfg["seed"], EVAL_EPOCH
    )
    for idx in batches:
        batch = load_batch(ds, idx, EVAL_EPOCH, tcfg, cfg)
        first_labels.append(batch.labels.view(-1, B)[:, 1])
        batch = batch.to(device, dtype)
        masks = build_masks(batch.layout, cfg, uses_flex(cfg, device))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            _, c, n = block_loss(model, embed, lm_head, batch, masks, pos_w, runs=runs)
        correct += c.cpu()
        count += n.cpu()
    model.train()
    labels = torch.cat(first_labels) if first_labels else torch.zeros(0, dtype=torch.long)
    labels = labels[labels >= 0]
    baseline = float(torch.bincount(labels).max() / labels.numel()) if labels.numel() else float("nan")
    acc = (correct / count.clamp_min(1)).tolist()
    run = torch.cat(runs).float() if runs else torch.zeros(0)
    return {
        "heldout_samples": int(len(indices)),
        "heldout_blocks": int(count[1].item()),
        "heldout_acc": {str(k): acc[k] for k in range(1, B)},
        "heldout_acc_1": acc[1],
        "frequency_baseline_1": baseline,
        "heldout_tau": 1.0 + float(run.mean()) if run.numel() else float("nan"),
    }


def plot_curves(metrics_csv: str | Path, png: str | Path) -> None:
    """Loss and accuracy at a few block positions against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.read_csv(metrics_csv)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(df["step"], df["loss"], lw=0.8)
    a.set_xlabel("step")
    a.set_ylabel("weighted CE loss")
    a.set_yscale("log")
    accs = [c for c in df.columns if c.startswith("acc_")]
    for c in [accs[0], accs[len(accs) // 4], accs[len(accs) // 2], accs[-1]] if accs else []:
        b.plot(df["step"], df[c].rolling(10, min_periods=1).mean(), lw=0.8, label=f"position {c[4:]}")
    b.set_xlabel("step")
    b.set_ylabel("train accuracy (10-step mean)")
    b.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
