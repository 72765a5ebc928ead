"""Benchmark prompt files: the record shapes accepted, each turned into the chat messages the bench renders.

One JSON object a line, a `.json` array of them, or a Parquet row, any of:
- `messages`: OpenAI-style turns; trailing assistant turns are dropped, so a training file works as is;
- `prompt`: one user turn (HumanEval's field; also prompt/response training records);
- `question`: one user turn (GSM8K);
- `turns`: a list of user turns, of which the first is benchmarked (MT-Bench's question file);
- `instruction`, with an optional `input` (Alpaca-style sets) or `context` (Dolly) after a blank line.
Other shapes: convert them to `{"prompt": ...}` lines (docs/configuration.md shows a one-liner). A bad line
stops the run naming FILE:LINE, checked before any job starts, as training data is.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.dataset.prepare import PAIR_FIELDS, BadRecord, iter_records, to_messages

PROMPT_FIELDS = ("messages", "prompt", "question", "turns", "instruction")  # the order they are looked for


def prompt_messages(rec: dict) -> list[dict]:
    """The conversation to continue: ends with a user turn."""
    if not isinstance(rec, dict):
        raise BadRecord("record is not a JSON object")
    if rec.get("messages") is not None:
        msgs = to_messages({"messages": rec["messages"]})
        while msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
        if not msgs:
            raise BadRecord("`messages` has only assistant turns: nothing to prompt with")
        return msgs
    if "turns" in rec:
        turns = rec["turns"].tolist() if hasattr(rec["turns"], "tolist") else rec["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise BadRecord("`turns` must be a non-empty list of strings")
        return [{"role": "user", "content": turns[0]}]
    for key, _answers in PAIR_FIELDS:  # training's single-turn shapes, answers left out
        if key in rec:
            if not isinstance(rec[key], str) or not rec[key].strip():
                raise BadRecord(f"`{key}` must be a non-empty string")
            return to_messages(rec)[:1]
    raise BadRecord(
        f"no prompt field: a prompt record needs one of {', '.join(PROMPT_FIELDS)} (see "
        "docs/configuration.md for converting other shapes)"
    )


def read_prompts(path: str) -> list[dict]:
    """Every record of a prompt file, checked: `{"id", "messages"}` each. Raises BadRecord at the first bad
    one, with FILE:LINE."""
    out, seen = [], set()
    for source, line, rec in iter_records(path):
        where = f"{source}:{line}"
        try:
            if isinstance(rec, Exception):
                raise rec
            msgs = prompt_messages(rec)
        except BadRecord as e:
            raise BadRecord(f"{where}: {e}") from None
        rid = rec.get("id", rec.get("task_id", rec.get("question_id")))
        rid = str(rid) if rid is not None else f"{Path(source).stem}:{line}"
        if rid in seen:
            raise BadRecord(f"{where}: duplicate id {rid!r}")
        seen.add(rid)
        out.append({"id": rid, "messages": msgs})
    if not out:
        raise BadRecord(f"{path}: no prompts (the file is empty)")
    return out


LISTED_LINES = 10  # bad lines a problem names before it counts the rest


def prompt_file_problems(path: str, *, key: str) -> list[str]:
    """What preflight says about a prompt file that exists on this machine (nothing: it is fine): every bad
    line, up to LISTED_LINES named, so that one pass fixes the file."""
    bad, seen, count = [], set(), 0
    try:
        for source, line, rec in iter_records(path):
            count += 1
            try:
                if isinstance(rec, Exception):
                    raise rec
                prompt_messages(rec)
            except BadRecord as e:
                bad.append(f"{source}:{line}: {e}")
                continue
            rid = rec.get("id", rec.get("task_id", rec.get("question_id")))
            if rid is not None and str(rid) in seen:
                bad.append(f"{source}:{line}: duplicate id {str(rid)!r}")
            seen.add(str(rid))
    except BadRecord as e:
        return [f"{key}: {e}"]
    except (OSError, ValueError) as e:  # unreadable Parquet and the like
        return [f"{key}: {path}: cannot be read ({type(e).__name__}: {e})"]
    if not count:
        return [f"{key}: {path}: no prompts (the file is empty)"]
    more = len(bad) - LISTED_LINES
    return [f"{key}: {line}" for line in bad[:LISTED_LINES]] + (
        [f"{key}: and {more} more bad lines"] if more > 0 else []
    )
