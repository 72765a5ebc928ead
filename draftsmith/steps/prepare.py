"""Read the user's data, render the chat template, build loss masks, truncate; one row per sample."""

from __future__ import annotations

import argparse
import logging

from draftsmith.config import section_arg
from draftsmith.core.io import write_json, write_parquet
from draftsmith.core.runtime import setup_logging
from draftsmith.dataset.overlap import BenchScreen
from draftsmith.dataset.prepare import BadRecord, prepare
from draftsmith.dataset.prompts import read_prompts
from draftsmith.target.files import resolve_target, text_config
from draftsmith.target.load import load_tokenizer


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True, help="model directory, hub id or fetched lock file (tokenizer)")
    p.add_argument("--target-json", default="{}", help="the config's target section (chat template)")
    p.add_argument(
        "--data", required=True, nargs="+", help="JSONL/JSON/Parquet files or `datasets` names, read in order"
    )
    p.add_argument("--data-json", required=True, help="the config's `data` section")
    p.add_argument("--out", required=True, help="samples.parquet")
    p.add_argument("--stats", required=True, help="stats.json")
    p.add_argument("--bench", nargs="*", default=[], help="data.exclude_bench: the bench's prompt files")
    args = p.parse_args(argv)
    setup_logging()
    cfg = section_arg(args.data_json, "data")
    target_dir = resolve_target(args.target)
    tok = load_tokenizer(target_dir, section_arg(args.target_json, "target"))
    try:
        bench = [r["messages"] for f in args.bench for r in read_prompts(f)]
        screen = BenchScreen(bench) if args.bench else None
        samples, stats = prepare(
            args.data,
            tok,
            int(cfg["max_length"]),
            bool(cfg["thinking"]),
            cfg["on_bad_record"],
            cfg["max_samples"],
            cfg["split"],
            regenerate=bool(cfg["regenerate"]["enabled"]),
            dedupe=bool(cfg.get("dedupe")),
            templates=cfg.get("templates") or (),
            screen=screen,
        )
    except BadRecord as e:
        raise SystemExit(f"prepare: bad input: {e}") from None
    logging.info(
        "prepared %d samples (%d tokens, %d truncated to data.max_length, %d skipped)",
        stats.samples,
        stats.tokens,
        stats.truncated,
        stats.skipped,
    )
    if stats.duplicates or stats.bench_overlap:
        logging.info(
            "left out %d records repeating an earlier one (data.dedupe) and %d overlapping the bench's "
            "prompts (data.exclude_bench)",
            stats.duplicates,
            stats.bench_overlap,
        )
    if stats.skipped:
        logging.warning(
            "skipped %d of %d records (data.on_bad_record: skip): %s",
            stats.skipped,
            stats.records,
            ", ".join(f"{k}: {v}" for k, v in sorted(stats.problems.items())),
        )
    if problem := ids_outside_vocabulary(samples, target_dir):
        raise SystemExit(f"prepare: {problem}")
    write_parquet(samples, args.out)
    write_json(args.stats, vars(stats))


def ids_outside_vocabulary(samples, target_dir) -> str | None:
    """A token id the target has no embedding row for: its tokenizer belongs to another model. Found here,
    before any GPU job, rather than as an index error inside the first extraction."""
    try:
        vocab = int(text_config(target_dir)["vocab_size"])
    except (FileNotFoundError, KeyError):
        return None  # no config.json to check against: the target's loading says what is wrong
    for sid, ids in zip(samples["id"], samples["input_ids"]):
        if len(ids) and int(ids.max()) >= vocab:
            return (
                f"sample {sid} has token id {int(ids.max())}, but {target_dir}/config.json gives "
                f"vocab_size {vocab}: the tokenizer files there belong to another model (or config.json "
                "does). Put the model's own tokenizer beside its config.json"
            )
    return None


if __name__ == "__main__":
    main()
