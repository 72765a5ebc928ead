"""A small sweep of the drafter recipe's knobs on one merged data set, scored by held-out accuracy.

Each variant changes one key of a base config (`--vary drafter.num_layers=2,5` makes two variants) or
several at once (`--variant "train.anchors_per_seq=32 train.epochs=12"`: the same predictions a run, spread
over twice the passes) and trains through the training step itself (`draftsmith.steps.train`, GPU pool
included), `--parallel` at a time: with `DRAFTSMITH_GPUS=0,0,0,0` four small trainings share one GPU. Prints a
table of held-out accuracy per block position, the held-out acceptance length (`heldout_tau`, see
drafter/evaluate.py), steps and seconds; `--json-out` keeps the rows, `--best-out` writes the winner's changed
keys as a config file to pass after the run's own (`--configfile run.yaml best.yaml`), so the recipe a study
trains is the one the sweep chose. The bench measures tau itself; the sweep is the cheap screen before it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from draftsmith.config import with_defaults

SECTIONS = ("drafter", "train")
SHOWN_POSITIONS = (1, 2, 4, 8)


def parse_value(text: str):
    """A --vary value: 3 -> int, 1e-3 -> float (which YAML 1.1 would read as a string), null -> None, true,
    else the string."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return yaml.safe_load(text)


def assignment(base: dict, spec: str, flag: str) -> tuple[str, str, str]:
    """`section.key=value` checked against the base config: (section, key, raw value)."""
    key, _, raw = spec.partition("=")
    section, _, name = key.partition(".")
    if section not in SECTIONS or not name or not raw:
        raise SystemExit(f"{flag} {spec!r}: expected SECTION.KEY=VALUE with SECTION one of {SECTIONS}")
    if name not in base[section]:
        raise SystemExit(f"{flag} {spec!r}: `{section}` has no key `{name}` (see the config schema)")
    return section, name, raw


def changed_config(base: dict, changes: list[tuple[str, str, str]]) -> dict:
    out = {s: dict(v) for s, v in base.items()}
    for section, name, raw in changes:
        out[section][name] = parse_value(raw)
    return out


def variants(base: dict, vary: list[str], together: Sequence[str] = ()) -> list[tuple[str, dict]]:
    """The base, then one variant per value of each `section.key=v1,v2` (one key changed at a time), then one
    per `--variant` string of space-separated assignments (its keys changed together)."""
    out = [("base", base)]
    for spec in vary:
        section, name, values = assignment(base, spec, "--vary")
        for raw in values.split(","):
            out.append((f"{section}.{name}={raw}", changed_config(base, [(section, name, raw)])))
    for spec in together:
        changes = [assignment(base, part, "--variant") for part in spec.split()]
        if not changes:
            raise SystemExit("--variant '': expected SECTION.KEY=VALUE assignments separated by spaces")
        out.append((" ".join(f"{s}.{n}={r}" for s, n, r in changes), changed_config(base, changes)))
    return out


def overlay(base: dict, chosen: dict) -> dict:
    """The drafter and train keys in which a variant differs from the base: a config file's worth."""
    diff = {s: {k: v for k, v in chosen[s].items() if base[s].get(k) != v} for s in SECTIONS}
    return {s: keys for s, keys in diff.items() if keys}


def base_config(configfile: str | None, samples: int | None, max_steps: int | None) -> dict:
    """The drafter, train and target sections of a config file, completed with the schema's defaults."""
    values = yaml.safe_load(Path(configfile).read_text()) if configfile else {}
    base = {s: with_defaults(s, values.get(s) or {}) for s in (*SECTIONS, "target")}
    if samples is not None:
        base["train"]["max_samples"] = samples
    if max_steps is not None:
        base["train"]["max_steps"] = max_steps
    return base


def run_variant(name: str, sections: dict, *, dataset: str, target: str, out: Path, threads: int) -> dict:
    """One training through the step's CLI; its summary with the variant's name, or the failure's log tail."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "draftsmith.steps.train", "--dataset", dataset, "--target", target]
    cmd += ["--out", str(out), "--threads", str(threads)]
    for section in (*SECTIONS, "target"):
        cmd += [f"--{section}-json", json.dumps(sections[section])]
    t0 = time.time()
    with (out / "train.log").open("w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    row: dict = {"variant": name, "seconds": round(time.time() - t0, 1)}
    if rc != 0:
        tail = (out / "train.log").read_text().splitlines()[-5:]
        return {**row, "error": f"exit {rc}: " + " | ".join(tail)}
    summary = json.loads((out / "summary.json").read_text())
    acc = [summary["heldout_acc"][str(k)] for k in range(1, len(summary["heldout_acc"]) + 1)]
    return {
        **row,
        "steps": summary["steps"],
        "train_samples": summary["train_samples"],
        "train_tokens": summary["train_tokens"],
        "heldout_acc": acc,
        "heldout_tau": round(summary["heldout_tau"], 3),
        "tokens_per_s": None if summary["tokens_per_s"] is None else round(summary["tokens_per_s"]),
    }


def table(rows: list[dict]) -> str:
    """Markdown, longest held-out acceptance first; failed variants last with their error."""
    head = ["variant", "steps", *(f"acc_{k}" for k in SHOWN_POSITIONS), "held-out tau", "s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in sorted(rows, key=lambda r: -r.get("heldout_tau", 0.0)):
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error']} |")
            continue
        held = r["heldout_acc"]
        acc = [f"{held[k - 1]:.3f}" if k <= len(held) else "" for k in SHOWN_POSITIONS]
        cells = [r["variant"], r["steps"], *acc, r["heldout_tau"], r["seconds"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dataset", required=True, help="merged manifest.json")
    p.add_argument("--target", required=True, help="the target's model directory")
    p.add_argument("--configfile", help="the run's config: its drafter and train sections are the base")
    p.add_argument("--vary", action="append", default=[], help="SECTION.KEY=V1,V2 (repeatable)")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="'SECTION.KEY=V SECTION.KEY=V': one variant (repeatable)",
    )
    p.add_argument("--samples", type=int, help="train.max_samples for every variant")
    p.add_argument("--max-steps", type=int, help="train.max_steps for every variant")
    p.add_argument("--parallel", type=int, default=1, help="trainings at once (GPU slots of the pool)")
    p.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads of each training (default: the cores split between the --parallel ones: "
        "trainings that each take every core starve each other and the GPU)",
    )
    p.add_argument("--out-dir", default="sweep", help="one training folder per variant")
    p.add_argument("--json-out")
    p.add_argument("--best-out", help="YAML: the drafter/train keys of the longest held-out tau's variant")
    a = p.parse_args(argv)
    base = base_config(a.configfile, a.samples, a.max_steps)
    runs = variants(base, a.vary, a.variant)
    out_dir = Path(a.out_dir)
    threads = a.threads or max(1, (os.cpu_count() or 1) // max(1, a.parallel))
    print(f"{len(runs)} variants, {a.parallel} at a time, {threads} threads each: {out_dir}", file=sys.stderr)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with ThreadPoolExecutor(max_workers=max(1, a.parallel)) as pool:
        futures = [
            pool.submit(
                run_variant,
                name,
                sections,
                dataset=a.dataset,
                target=a.target,
                out=out_dir / f"v{i:02d}",
                threads=threads,
            )
            for i, (name, sections) in enumerate(runs)
        ]
        rows = [f.result() for f in futures]
    print(table(rows))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=1))
    if all("error" in r for r in rows):
        sys.exit("sweep: every variant failed (see the train.log under each variant's folder)")
    if a.best_out:
        best = max(range(len(rows)), key=lambda i: rows[i].get("heldout_tau", 0.0))
        keys = overlay(base, runs[best][1])
        winner = rows[best]
        note = (
            f"# chosen by draftsmith.perf.sweep_train: {winner['variant']}, "
            f"held-out tau {winner['heldout_tau']}\n"
        )
        tmp = Path(a.best_out + ".tmp")
        tmp.write_text(note + (yaml.safe_dump(keys, sort_keys=False) if keys else "{}\n"))
        tmp.replace(a.best_out)
        print(f"best: {rows[best]['variant']} -> {a.best_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
