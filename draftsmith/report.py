"""Benchmark report: merge per-prompt records into summary tables and plots.

tau comes two ways. `tau` is the per-prompt mean (each prompt's committed tokens / its verification rounds,
then the mean over prompts), as the DFlash and DDTree papers and their benchmark scripts report it;
`tau_pooled` is all committed tokens / all rounds, which weights long answers more. Speedup = (AR seconds per
output token) / (method seconds per output token), sums taken over the same prompts of the same run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from draftsmith.core.io import atomic, write_text
from draftsmith.speculative.replay import acceptance_by_position, histogram

matplotlib.use("Agg")


def read_records(paths: list[str]) -> list[dict]:
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def label(method: str, budget: int | None) -> str:
    return method if budget is None else f"{method}@{budget}"


def prompt_tau(record: dict) -> float:
    """A prompt's tau: tokens committed per verification round."""
    return sum(record["committed"]) / len(record["committed"])


def prompt_mean_tau(records: list[dict]) -> float:
    """Mean over prompts of each prompt's tau; a prompt that ended before its first round does not count."""
    per_prompt = [prompt_tau(r) for r in records if r["committed"]]
    return sum(per_prompt) / len(per_prompt) if per_prompt else math.nan


def summarize(records: list[dict]) -> pd.DataFrame:
    """One row per dataset x method x budget."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["dataset"], r["method"], r["budget"]), []).append(r)
    rows = []
    for (dataset, method, budget), rs in groups.items():
        committed = [c for r in rs for c in r["committed"]]
        block = max(r["block_size"] for r in rs)
        timed = [r for r in rs if r.get("seconds") is not None]
        row = {
            "dataset": dataset,
            "method": method,
            "budget": budget,
            "prompts": len(rs),
            "rounds": len(committed),
            "tau": prompt_mean_tau(rs),
            "tau_pooled": sum(committed) / len(committed) if committed else math.nan,
            "accepted_hist": " ".join(map(str, histogram(committed, block))),
            "tokens_per_s": math.nan,
            "speedup": math.nan,
            "lossless": None,
            "exact": "",
            "acceptance": next((r["acceptance"] for r in rs if r.get("acceptance")), ""),
            "note": next((r["note"] for r in rs if r.get("note")), ""),
        }
        if timed and len(timed) == len(rs):
            seconds, tokens = sum(r["seconds"] for r in rs), sum(r["out_tokens"] for r in rs)
            ar_s, ar_t = sum(r["ar_seconds"] for r in rs), sum(r["ar_tokens"] for r in rs)
            row["tokens_per_s"] = tokens / seconds
            row["speedup"] = (ar_s / ar_t) / (seconds / tokens)
            if all(r.get("lossless") is not None for r in rs):  # sampled runs are not compared token by token
                row["lossless"] = all(r["lossless"] for r in rs)
                row["exact"] = f"{sum(bool(r.get('exact', r.get('lossless'))) for r in rs)}/{len(rs)}"
            splits = [r["split"] for r in rs if r.get("split")]
            rounds = sum(len(r.get("real_committed") or []) for r in rs)
            if splits and rounds:
                for key in ("draft", "verify", "restore"):
                    row[f"ms_{key}_per_round"] = 1000 * sum(s[key] for s in splits) / rounds
        rows.append(row)
    df = pd.DataFrame(rows)
    df["budget"] = df["budget"].astype("Int64")
    order = {"ar": 0, "dflash": 1, "ddtree": 2}
    df["_o"] = df["method"].map(order).fillna(9)
    df["_b"] = df["budget"].fillna(0)
    return df.sort_values(["dataset", "_o", "_b"]).drop(columns=["_o", "_b"]).reset_index(drop=True)


def markdown(df: pd.DataFrame) -> str:
    """A plain Markdown table (no tabulate dependency)."""

    def cell(v) -> str:
        if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
        return str(v)

    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def plot_tau_by_method(df: pd.DataFrame, path: Path) -> None:
    datasets = list(dict.fromkeys(df["dataset"]))
    labels = list(
        dict.fromkeys(label(m, None if pd.isna(b) else int(b)) for m, b in zip(df["method"], df["budget"]))
    )
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(labels) * len(datasets)), 3.5))
    width = 0.8 / max(1, len(datasets))
    for j, ds in enumerate(datasets):
        sub = df[df["dataset"] == ds]
        taus = {
            label(m, None if pd.isna(b) else int(b)): t
            for m, b, t in zip(sub["method"], sub["budget"], sub["tau"])
        }
        xs = [i + j * width for i in range(len(labels))]
        ax.bar(xs, [taus.get(lab, math.nan) for lab in labels], width, label=ds)
    ax.set_xticks([i + width * (len(datasets) - 1) / 2 for i in range(len(labels))], labels, rotation=30)
    ax.set_ylabel("tau (tokens per target forward)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_tau_vs_budget(df: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for ds in dict.fromkeys(df["dataset"]):
        sub = df[(df["dataset"] == ds) & (df["method"] == "ddtree")].sort_values("budget")
        (line,) = ax.plot(sub["budget"], sub["tau"], marker="o", label=f"{ds} DDTree")
        flash = df[(df["dataset"] == ds) & (df["method"] == "dflash")]
        if len(flash):
            ax.axhline(float(flash["tau"].iloc[0]), ls="--", color=line.get_color(), label=f"{ds} DFlash")
    if (df["method"] == "ddtree").any():  # a bench without DDTree has no budgets to put on a log axis
        ax.set_xscale("log", base=2)
    ax.set_xlabel("DDTree node budget")
    ax.set_ylabel("tau")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_position_acceptance(records: list[dict], path: Path) -> None:
    """Fraction of rounds in which draft position i (tree depth i) was accepted."""
    fig, ax = plt.subplots(figsize=(5, 3.5))
    keys = dict.fromkeys((r["dataset"], r["method"], r["budget"]) for r in records if r["method"] != "ar")
    for ds, method, budget in keys:
        rs = [r for r in records if (r["dataset"], r["method"], r["budget"]) == (ds, method, budget)]
        block = max(r["block_size"] for r in rs)
        rates = acceptance_by_position([c for r in rs for c in r["committed"]], block)
        ax.plot(range(1, block), rates, marker=".", label=f"{ds} {label(method, budget)}")
    ax.set_xlabel("draft position (tree depth)")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def comparison(
    df: pd.DataFrame, label_here: str, others: dict[str, str], records: list[dict] | None = None
) -> pd.DataFrame:
    """tau of this run next to other runs' (e.g. the bf16 demo next to the fp8 one) on the same rows; where
    the other run's records.jsonl lies beside its summary.csv, the difference paired by prompt with its
    standard error, which says whether two runs on the same prompts differ by more than noise."""
    keys = ["dataset", "method", "budget"]
    table = df[keys + ["tau"]].rename(columns={"tau": f"tau ({label_here})"})
    for name, path in others.items():
        other = pd.read_csv(path)[keys + ["tau"]].rename(columns={"tau": f"tau ({name})"})
        other["budget"] = other["budget"].astype("Int64")
        table = table.merge(other, on=keys, how="left")
        theirs = Path(path).with_name("records.jsonl")
        if records is not None and theirs.exists():
            diffs = paired_differences(records, read_records([str(theirs)]))
            table[f"{label_here} - {name} (paired SE; prompts)"] = [
                _paired_cell(diffs.get((d, m, None if pd.isna(b) else int(b))))
                for d, m, b in zip(table["dataset"], table["method"], table["budget"])
            ]
    return table


def paired_differences(mine: list[dict], theirs: list[dict]) -> dict[tuple, tuple[float, float, int]]:
    """Per dataset x method x budget: the mean over the prompts both runs answered of (my tau - their tau),
    its standard error, and the number of prompts."""

    def per_prompt(records: list[dict]) -> dict[tuple, float]:
        return {
            (r["dataset"], r["method"], r["budget"], r["id"]): prompt_tau(r)
            for r in records
            if r.get("committed") and "check" not in r
        }

    a, b = per_prompt(mine), per_prompt(theirs)
    groups: dict[tuple, list[float]] = {}
    for key in a.keys() & b.keys():
        groups.setdefault(key[:3], []).append(a[key] - b[key])
    out = {}
    for group, d in groups.items():
        mean = sum(d) / len(d)
        var = sum((x - mean) ** 2 for x in d) / (len(d) - 1) if len(d) > 1 else math.nan
        out[group] = (mean, math.sqrt(var / len(d)), len(d))
    return out


def _paired_cell(diff: tuple[float, float, int] | None) -> str:
    if diff is None:
        return ""
    mean, se, n = diff
    return f"{mean:+.3f} ({se:.3f}; {n})"


def exactness_lines(records: list[dict]) -> str:
    """The real loop against greedy decoding: the fp32 check, then every difference with its logit margin (a
    margin within the dtype's rounding is a tie)."""
    lines = ["", "## Real loop against greedy decoding", ""]
    checks = [r for r in records if r.get("check") == "fp32"]
    if checks:
        exact = sum(bool(r["exact"]) for r in checks)
        lines.append(
            f"- fp32 check (target and drafter in fp32, DFlash): {exact}/{len(checks)} prompts exact"
        )
    real = [r for r in records if "check" not in r and r.get("exact") is not None]
    for dtype in sorted({r.get("dtype", "?") for r in real}):
        rs = [r for r in real if r.get("dtype", "?") == dtype]
        lines.append(f"- in {dtype}: {sum(bool(r['exact']) for r in rs)}/{len(rs)} prompt runs exact")
    diffs = [r for r in records if r.get("divergence")]
    if diffs:
        table = pd.DataFrame(
            [
                {"dataset": r["dataset"], "id": r["id"], "method": label(r["method"], r.get("budget")),
                 "dtype": r.get("dtype", ""), "check": r.get("check", ""), **r["divergence"]}
                for r in diffs
            ]
        )  # fmt: skip
        lines += [
            "",
            "Differences from greedy decoding (first differing token; margin = greedy logit - chosen):",
            "",
        ]
        lines.append(markdown(table))
    return "\n".join(lines) + "\n"


def drafter_lines(train_summary: dict) -> str:
    acc, base = train_summary.get("heldout_acc_1"), train_summary.get("frequency_baseline_1")
    lines = ["## Drafter", ""]
    if acc is not None and base is not None:
        lines.append(f"- held-out block-position-1 accuracy {acc:.3f} vs frequency baseline {base:.3f}")
    if "heldout_tau" in train_summary:
        lines.append(
            f"- held-out acceptance length {train_summary['heldout_tau']:.2f} (1 + the run of correct "
            "predictions from position 1, mean over the held-out blocks: greedy DFlash tau without the loop)"
        )
    if "first_loss" in train_summary and "final_loss_mean_last10pct" in train_summary:
        lines.append(
            f"- training loss {train_summary['first_loss']:.3f} -> "
            f"{train_summary['final_loss_mean_last10pct']:.3f} (mean of the last 10% of steps)"
        )
    return "\n".join(lines) + "\n\n"


def write_report(
    parts: list[str],
    out_dir: str | Path,
    train_summary: str | None = None,
    label_here: str = "this run",
    compare: dict[str, str] | None = None,
) -> pd.DataFrame:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    everything = read_records(parts)
    write_text(out / "records.jsonl", "".join(json.dumps(r) + "\n" for r in everything))
    records = [r for r in everything if "check" not in r]
    df = summarize(records)
    with atomic(out / "summary.csv") as tmp:
        df.to_csv(tmp, index=False)
    text = "# Acceptance benchmark\n\n"
    if train_summary and Path(train_summary).exists():
        text += drafter_lines(json.loads(Path(train_summary).read_text()))
    text += "## Summary\n\n" + markdown(df)
    text += exactness_lines(everything)
    if compare:
        text += f"\n## tau next to other runs\n\n{markdown(comparison(df, label_here, compare, records))}"
    write_text(out / "summary.md", text)
    plot_tau_by_method(df, out / "tau_by_method.png")
    plot_tau_vs_budget(df, out / "tau_vs_budget.png")
    plot_position_acceptance(records, out / "position_acceptance.png")
    return df
