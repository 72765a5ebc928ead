"""The data-scaling study's report: tau and held-out accuracy of drafters trained on growing subsets of one
dataset, against the tokens they were trained on.

Each size is a training summary (samples, tokens, accuracy per block position) and its benchmark records; the
table has a row per size x benchmark set x method, the plots one panel per benchmark set. A straight line of
tau against log2(tokens) per set and method gives the gain per doubling of data, and where the trend would
reach `TAU_GOAL`, as an extrapolation: a scaling curve usually bends before that.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np
import pandas as pd

from draftsmith.core.io import atomic, write_text
from draftsmith.report import label, markdown, read_records, summarize

matplotlib.use("Agg")

TAU_GOAL = 3.0  # the per-prompt DFlash tau the study's acceptance asks of the largest size


@dataclass
class Size:
    name: str  # "n1350", or "main" for the run on every sample
    train: dict  # the training summary.json
    records: list[dict]  # the bench records, fp32 check rows left out


def parse_size(arg: str) -> tuple[str, str, list[str]]:
    """NAME=TRAIN_SUMMARY:PART,PART,... as the workflow passes a size."""
    name, rest = arg.split("=", 1)
    summary, parts = rest.split(":", 1)
    return name, summary, [p for p in parts.split(",") if p]


def load_size(name: str, summary: str, parts: list[str]) -> Size:
    records = [r for r in read_records(parts) if "check" not in r]
    return Size(name=name, train=json.loads(Path(summary).read_text()), records=records)


def study_table(sizes: list[Size]) -> pd.DataFrame:
    """One row per size x benchmark set x method (AR left out: its tau is 1 by definition), smallest first."""
    rows = []
    for s in sizes:
        df = summarize(s.records)
        for r in df.itertuples(index=False):
            if r.method == "ar":
                continue
            rows.append(
                {
                    "size": s.name,
                    "train_samples": s.train["train_samples"],
                    "train_tokens": s.train["train_tokens"],
                    "heldout_acc_1": s.train["heldout_acc_1"],
                    # NaN for a training summary older than the key
                    "heldout_tau": round(s.train.get("heldout_tau", math.nan), 3),
                    "dataset": r.dataset,
                    "method": label(r.method, None if pd.isna(r.budget) else int(r.budget)),
                    "prompts": r.prompts,
                    "tau": r.tau,
                    "tau_pooled": r.tau_pooled,
                }
            )
    return pd.DataFrame(rows).sort_values(["dataset", "method", "train_tokens"]).reset_index(drop=True)


def trends(table: pd.DataFrame, goal: float = TAU_GOAL) -> pd.DataFrame:
    """Per benchmark set and method: tau gained per doubling of training tokens (least squares on
    log2 tokens), whether tau rose at every size, and the tokens at which the line reaches `goal`."""
    rows = []
    for (dataset, method), g in table.groupby(["dataset", "method"], sort=True):
        g = g.sort_values("train_tokens")
        x, y = np.log2(g["train_tokens"].to_numpy(float)), g["tau"].to_numpy(float)
        slope, icpt = np.polyfit(x, y, 1) if len(g) >= 2 else (math.nan, math.nan)
        at_goal = 2 ** ((goal - icpt) / slope) if slope > 0 and y[-1] < goal else math.nan
        rows.append(
            {
                "dataset": dataset,
                "method": method,
                "sizes": len(g),
                "tau_smallest": y[0],
                "tau_largest": y[-1],
                "rises_at_every_size": bool(np.all(np.diff(y) > 0)),
                "tau_per_doubling": slope,
                f"tokens_for_tau_{goal:g}": at_goal,
            }
        )
    return pd.DataFrame(rows)


def plot_tau(table: pd.DataFrame, path: Path) -> None:
    sets = sorted(table["dataset"].unique())
    fig, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 3.8), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], sets):
        g = table[table["dataset"] == name]
        for method, m in g.groupby("method", sort=True):
            m = m.sort_values("train_tokens")
            ax.plot(m["train_tokens"], m["tau"], marker="o", label=method)
        ax.set_xscale("log")
        # one labelled tick per size: the log axis's own minor labels overlap
        sizes = sorted(g["train_tokens"].unique())
        ax.set_xticks(sizes, [f"{t / 1e6:.2g}M" for t in sizes])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_title(name)
        ax.set_xlabel("training tokens")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("tau (per-prompt mean)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    with atomic(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def plot_accuracy(sizes: list[Size], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for s in sorted(sizes, key=lambda s: s.train["train_tokens"]):
        acc = s.train["heldout_acc"]
        positions = sorted(int(k) for k in acc)
        ax.plot(
            positions,
            [acc[str(k)] for k in positions],
            marker="o",
            label=f"{s.train['train_samples']:,} samples",
        )
    ax.set_xlabel("block position")
    ax.set_ylabel("held-out accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def write_study(sizes: list[Size], out_dir: str | Path) -> pd.DataFrame:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = study_table(sizes)
    with atomic(out / "summary.csv") as tmp:
        table.to_csv(tmp, index=False)
    trend = trends(table)
    accuracy = pd.DataFrame(
        [
            {
                "train_samples": s.train["train_samples"],
                "train_tokens": s.train["train_tokens"],
                **s.train["heldout_acc"],
            }
            for s in sorted(sizes, key=lambda s: s.train["train_tokens"])
        ]
    )
    text = "# Data-scaling study\n\n## tau per size\n\n" + markdown(table)
    text += "\n## Trend\n\nLeast squares of tau on log2(training tokens); past the largest size: a guess.\n"
    text += markdown(trend)
    text += "\n## Held-out accuracy per block position\n\n" + markdown(accuracy)
    write_text(out / "summary.md", text)
    plot_tau(table, out / "tau_vs_tokens.png")
    plot_accuracy(sizes, out / "accuracy_by_position.png")
    return table
