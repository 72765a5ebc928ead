"""A bench job's share of a prompt set, and the partial file that lets a killed job resume where it stopped.

The drafter's bench jobs and the target's reference jobs (speculative/reference.py) cut the same parts of the
same prompts, so the two agree on which prompt an index is.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import TextIO

from draftsmith.core.io import write_jsonl
from draftsmith.dataset.prepare import render
from draftsmith.dataset.prompts import prompt_messages, read_prompts


def part_job_parser(description: str, *, out_help: str) -> argparse.ArgumentParser:
    """The arguments every job on one part of a prompt set takes (a drafter's bench, the target's reference):
    the target, the part, the config's bench and target sections, the output. Each step adds its own."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--target", required=True, help="target: model directory, hub id or fetched lock file")
    ap.add_argument("--prompts", required=True, help="prompt records, .jsonl or .parquet")
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--out", required=True, help=out_help)
    ap.add_argument("--bench-json", default="{}", help="the config's bench section as JSON")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs per model copy (the probe's decision)")
    ap.add_argument("--target-json", default="{}", help="the config's target section (dtype, revision, ...)")
    ap.add_argument("--threads", type=int, default=None)
    return ap


def part_prompts(prompts_path: str, bench: dict, *, part: int, parts: int) -> list[dict]:
    """This part's share of the prompt file (every `parts`-th readable record, after the max_prompts cut)."""
    records = read_prompts(prompts_path)  # a bad line stops the job naming FILE:LINE (preflight checks first)
    if bench["max_prompts"]:
        records = records[: int(bench["max_prompts"])]
    return records[part::parts]


def prompt_ids_of(record: dict, tokenizer, thinking: bool) -> list[int]:
    """A prompt record (any shape `dataset.prompts` accepts) through the chat template."""
    msgs = prompt_messages(record)
    if tokenizer.chat_template is None:
        return tokenizer(render(tokenizer, msgs, thinking), add_special_tokens=True)["input_ids"]
    text = render(tokenizer, msgs, thinking, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def file_stamp(path: str | Path) -> tuple:
    """A file's name, size and modification time, for the key a partial file is resumed under."""
    p = Path(path)
    st = p.stat() if p.exists() else None
    return (str(p), st.st_size, st.st_mtime_ns) if st else (str(p),)


def read_partial(path, key: str) -> dict[int, list[dict]]:
    """Finished prompts of a killed run: index -> records. A torn last line (killed mid-write) is dropped."""
    done: dict[int, list[dict]] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return done
    if not lines or lines[0] != json.dumps({"key": key}):
        return done  # made with another drafter, config or prompt file: start afresh
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        done[int(row["index"])] = row["records"]
    return done


def resume_partial(partial: Path, key: str, *, count: int) -> dict[int, list[dict]]:
    """The finished prompts that a killed run with the same key left, with the partial file rewritten to hold
    only them (a torn last line would otherwise sit before the next appended one)."""
    done = {i: r for i, r in read_partial(partial, key).items() if i < count}
    if done:
        logging.getLogger(__name__).info(
            "resuming: %d of %d prompts already done in %s", len(done), count, partial
        )
    write_jsonl(partial, [{"key": key}] + [{"index": i, "records": r} for i, r in sorted(done.items())])
    return done


def append_done(log_f: TextIO, index: int, rows: list[dict]) -> None:
    """One finished prompt onto the partial file, on disk before the next prompt starts."""
    log_f.write(json.dumps({"index": index, "records": rows}) + "\n")
    log_f.flush()
    os.fsync(log_f.fileno())
