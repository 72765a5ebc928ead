"""The plan's GPU-hours against what the run's jobs took: each job's wall time from its Snakemake benchmark
file, times the GPUs it held (a slot of a GPU that several slots share counts its share), summed by stage."""

from __future__ import annotations

import itertools
import string
from pathlib import Path

import pandas as pd

# the plan's rows each measured stage is compared with; in one round the extraction jobs also regenerate
PLANNED = {
    "regeneration": ("regeneration",),
    "extraction": ("extract, all passes",),
    "regeneration and extraction": ("regeneration", "extract, all passes"),
    "training": ("train, all epochs",),
    "bench": ("bench",),
}


def benchmark_files(layout: dict) -> dict[str, list[tuple[str, float]]]:
    """Each GPU stage's benchmark files in the run's DAG, with the slots each job holds (0: a copy's GPUs).
    `layout` gives each stage's benchmark templates as the workflow's rules name them, and the values of
    their wildcards in this DAG: only this DAG's jobs are listed, never an earlier layout's files."""
    values = layout["values"]
    stages: dict[str, list[tuple[str, float]]] = {}
    for stage, templates in layout["stages"].items():
        for template, slots in templates:
            names = [name for _, name, _, _ in string.Formatter().parse(template) if name]
            for combo in itertools.product(*(values[n] for n in names)):
                path = template.format(**dict(zip(names, combo)))
                stages.setdefault(stage, []).append((path, float(slots)))
    return stages


def job_seconds(path: str | Path) -> float | None:
    """A job's wall seconds from its benchmark file (the last line: the last attempt), None without one."""
    try:
        table = pd.read_csv(path, sep="\t")
    except (OSError, ValueError):
        return None
    return float(table["s"].iloc[-1]) if len(table) else None


def measured_hours(files: dict[str, list[tuple[str, float]]], *, slots_a_gpu: int) -> dict:
    """Per stage: GPU-hours, jobs counted and jobs without a benchmark file. `files` maps a stage to
    (benchmark file, slots the job held) pairs."""
    out = {}
    for stage, jobs in files.items():
        seconds, found = 0.0, 0
        for path, slots in jobs:
            s = job_seconds(path)
            if s is not None:
                seconds, found = seconds + s * slots / max(1, slots_a_gpu), found + 1
        out[stage] = {"gpu_hours": seconds / 3600, "jobs": found, "missing": len(jobs) - found}
    return out


def compare(plan: dict, measured: dict) -> list[dict]:
    """One row a stage: planned and measured GPU-hours and their ratio."""
    rows = []
    for stage, got in measured.items():
        planned = [plan.get("stages", {}).get(k) for k in PLANNED.get(stage, ())]
        hours = sum(p["gpu_hours"] for p in planned if p) if planned and all(planned) else None
        ratio = got["gpu_hours"] / hours if hours else None
        rows.append({"stage": stage, "planned": hours, **got, "measured_over_planned": ratio})
    return rows


def render(rows: list[dict], *, source: str) -> str:
    """The comparison as a Markdown table."""
    lines = [
        "| stage | planned GPU-hours | measured GPU-hours | measured / planned | jobs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        planned = "-" if r["planned"] is None else f"{r['planned']:.4f}"
        ratio = "-" if r["measured_over_planned"] is None else f"{r['measured_over_planned']:.2f}"
        missing = f" ({r['missing']} without a benchmark file)" if r["missing"] else ""
        lines.append(f"| {r['stage']} | {planned} | {r['gpu_hours']:.4f} | {ratio} | {r['jobs']}{missing} |")
    return "\n".join(lines) + f"\n\nThe plan's rates: {source}.\n"
