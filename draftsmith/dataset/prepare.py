"""Preparing training data: read records, render the chat template, mask the loss.

Every record becomes one sample with a stable id, token ids, a loss mask that is 1 on assistant tokens only,
and `prompt_len` (where the last assistant turn starts, for optional regeneration by the target). Bad records
stop the run with the file, line and problem by default; `on_bad_record: skip` counts them instead.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from draftsmith.dataset.overlap import BenchScreen, record_key

log = logging.getLogger(__name__)

ROLES = {"system", "user", "assistant", "tool", "developer"}


class BadRecord(ValueError):
    """A record the user must fix; the message names the file and line."""


@dataclass
class PrepareStats:
    records: int = 0
    samples: int = 0
    skipped: int = 0
    truncated: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    duplicates: int = 0  # data.dedupe: a record whose sample an earlier record already is
    bench_overlap: int = 0  # data.exclude_bench: a prompt that is, or shares a run of words with, a bench one
    problems: dict[str, int] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped += 1
        key = why.split(" (")[0].split(":")[0]
        self.problems[key] = self.problems.get(key, 0) + 1


def iter_records(path: str, split: str = "train") -> Iterator[tuple[str, int, dict | Exception]]:
    """Yields (source, line number from 1, record or the parse error) from JSONL, Parquet or a `datasets`
    name."""
    p = Path(path)
    if p.suffix == ".json" and p.exists() and _starts_with_bracket(p):
        try:
            items = json.loads(p.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRecord(f"{path}: not a JSON array of records ({e})") from None
        for i, rec in enumerate(items, 1):  # the "line" of an array's record is its position, from 1
            yield str(p), i, rec
    elif p.suffix in (".jsonl", ".json") and p.exists():
        with p.open(
            "rb"
        ) as f:  # bytes: one bad line is one bad record, not a UnicodeDecodeError for the file
            for i, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    yield (
                        str(p),
                        i,
                        BadRecord(f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"),
                    )
                    continue
                if not line.strip():
                    continue
                try:
                    yield str(p), i, json.loads(line)
                except json.JSONDecodeError as e:
                    yield str(p), i, BadRecord(f"invalid JSON ({e.msg} at column {e.colno})")
    elif p.suffix == ".parquet" and p.exists():
        for i, rec in enumerate(pd.read_parquet(p).to_dict(orient="records"), 1):
            yield str(p), i, rec
    elif p.exists():
        raise BadRecord(f"{path}: unsupported data file type {p.suffix!r}; use .jsonl or .parquet")
    else:
        try:
            import datasets  # optional: only for hub data sets, needs network access
        except ImportError as e:
            raise FileNotFoundError(
                f"data.path {path!r} is not a local file, and the `datasets` package is not installed to "
                "load it from the hub; give a .jsonl/.parquet path or `pip install datasets`"
            ) from e
        ds = datasets.load_dataset(path, split=split)
        for i, rec in enumerate(ds, 1):
            yield f"{path}[{split}]", i, dict(rec)


def _starts_with_bracket(p: Path) -> bool:
    """A `.json` file holding one array of records (Alpaca-style sets) rather than a record a line."""
    with p.open("rb") as f:
        return f.read(4096).lstrip()[:1] == b"["


# Single-turn shapes of public sets, read as (prompt field, answer fields): GSM8K, Alpaca-style instructions.
PAIR_FIELDS = (("prompt", ("response",)), ("question", ("answer",)), ("instruction", ("output", "response")))
# What an instruction's prompt carries after it, following a blank line: Alpaca's `input`, Dolly's `context`
# (the passage its closed-QA, extraction and summarization records ask about); the first non-empty one.
INSTRUCTION_EXTRAS = ("input", "context")


def to_messages(rec: dict, templates: tuple[str, ...] | list[str] = ()) -> list[dict]:
    """OpenAI-style messages, or a single-turn record (`prompt`/`response`, GSM8K's `question`/`answer`,
    Alpaca's `instruction`/`input`/`output`, Dolly's `instruction`/`context`/`response`) turned into one user
    turn and, when it has one, the answer. A record of none of these shapes takes the first of `templates`
    (data.templates) whose fields it has: a prompt alone, for the target to answer."""
    if not isinstance(rec, dict):
        raise BadRecord("record is not a JSON object")
    if "messages" in rec and rec["messages"] is not None:
        msgs = rec["messages"]
        if hasattr(msgs, "tolist"):  # Parquet gives numpy arrays of dicts
            msgs = msgs.tolist()
        if not isinstance(msgs, list) or not msgs:
            raise BadRecord("`messages` must be a non-empty list")
        out = []
        for j, m in enumerate(msgs):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise BadRecord(f"messages[{j}] needs `role` and `content`")
            if m["role"] not in ROLES:
                raise BadRecord(f"messages[{j}] has unknown role {m['role']!r}")
            if not isinstance(m["content"], str):
                raise BadRecord(f"messages[{j}].content must be a string")
            out.append({"role": m["role"], "content": m["content"]})
        return out
    for key, answers in PAIR_FIELDS:
        if key not in rec:
            continue
        if not isinstance(rec[key], str):
            raise BadRecord(f"`{key}` must be a string")
        text = rec[key]
        extras = INSTRUCTION_EXTRAS if key == "instruction" else ()
        extra = next((rec[k] for k in extras if isinstance(rec.get(k), str) and rec[k].strip()), None)
        if extra is not None:
            text = f"{text}\n\n{extra}"
        msgs = [{"role": "user", "content": text}]
        answer = next((a for a in answers if rec.get(a) is not None), None)
        if answer is not None:
            if not isinstance(rec[answer], str):
                raise BadRecord(f"`{answer}` must be a string")
            msgs.append({"role": "assistant", "content": rec[answer]})
        return msgs
    for template in templates:
        try:
            return [{"role": "user", "content": template.format_map(rec)}]
        except KeyError:  # a field this record lacks: the next template
            continue
        except (IndexError, ValueError, AttributeError) as e:
            raise BadRecord(f"data.templates {template!r}: {e}") from None
    shapes = "`prompt`, `question` or `instruction`"
    if templates:
        raise BadRecord(f"record has neither `messages`, {shapes}, nor every field of a data.templates entry")
    raise BadRecord(
        f"record has neither `messages` nor a single-turn field ({shapes}); data.templates can make a "
        "prompt of other fields"
    )


def render(tokenizer, messages: list[dict], thinking: bool, add_generation_prompt: bool = False) -> str:
    if tokenizer.chat_template is None:
        # base models: plain concatenation, the assistant text follows the prompt directly
        text = "".join(m["content"] for m in messages)
        return text
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=thinking
        )
    except Exception as e:  # templates raise on shapes they do not accept (jinja2 TemplateError and the like)
        raise BadRecord(f"the chat template rejects this conversation ({type(e).__name__}: {e})") from None


def tokenize_chat(
    tokenizer, messages: list[dict], thinking: bool, *, answer_to_come: bool = False
) -> tuple[list[int], list[int], int]:
    """Token ids, loss mask (assistant turns) and the token where the last assistant turn starts.

    `answer_to_come` (regeneration on): a conversation that ends with a user turn is a prompt whose answer
    the target will write; it ends with the generation prompt and `prompt_len` is its length."""
    if messages[-1]["role"] != "assistant" and answer_to_come:
        return tokenize_prompt(tokenizer, messages, thinking)
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRecord(
            "no assistant turn to train on (records with only a prompt are accepted when "
            "data.regenerate.enabled is true: the target then writes the answers)"
        )
    full = render(tokenizer, messages, thinking)
    spans = []
    for j, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:j], thinking, add_generation_prompt=True) if j else ""
        upto = render(tokenizer, messages[: j + 1], thinking)
        if not full.startswith(upto) or not upto.startswith(before):
            raise BadRecord(
                "the chat template does not render this conversation prefix-consistently, so assistant "
                "tokens cannot be located; use single-turn records or a template without history rewriting"
            )
        spans.append((len(before), len(upto.rstrip())))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    if tokenizer.chat_template is None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
        enc["offset_mapping"].append((len(full), len(full)))
        spans[-1] = (spans[-1][0], len(full) + 1)
    mask = [0] * len(ids)
    starts = np.array([s for s, _ in enc["offset_mapping"]])
    for a, b in spans:
        mask_idx = np.nonzero((starts >= a) & (starts < b))[0]
        for k in mask_idx:
            mask[k] = 1
    last_a = spans[-1][0]
    prompt_len = int(np.searchsorted(starts, last_a, side="left"))
    return ids, mask, prompt_len


def tokenize_prompt(tokenizer, messages: list[dict], thinking: bool) -> tuple[list[int], list[int], int]:
    """A conversation to be answered: the template's generation prompt closes it; earlier assistant turns
    keep their loss mask."""
    if tokenizer.chat_template is None:
        text = render(tokenizer, messages, thinking)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return ids, [0] * len(ids), len(ids)
    full, mask, _ = (
        tokenize_chat(tokenizer, messages, thinking)
        if any(m["role"] == "assistant" for m in messages)
        else ([], [], 0)
    )
    text = render(tokenizer, messages, thinking, add_generation_prompt=True)
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    keep = mask if ids[: len(full)] == full else []
    return ids, keep + [0] * (len(ids) - len(keep)), len(ids)


def prepare(
    path: str | list[str],
    tokenizer,
    max_length: int,
    thinking: bool,
    on_bad_record: str = "error",
    max_samples: int | None = None,
    split: str = "train",
    *,
    regenerate: bool = False,
    dedupe: bool = False,
    screen: BenchScreen | None = None,
    templates: tuple[str, ...] | list[str] = (),
) -> tuple[pd.DataFrame, PrepareStats]:
    """Reads and tokenizes every record of one file or several (in order); returns one row per sample and the
    counts for the report. With `regenerate`, prompt-only records are samples too: the target writes their
    answers. `dedupe` keeps the first of records that make the same sample; `screen` leaves out the bench's
    prompts (both counted, never errors)."""
    paths = [path] if isinstance(path, str) else list(path)
    stats = PrepareStats()
    rows = []
    seen: dict[str, str] = {}
    keys: set[str] = set()
    records = (r for p in paths for r in iter_records(p, split))
    for source, line, rec in records:
        stats.records += 1
        where = f"{source}:{line}"
        try:
            if isinstance(rec, Exception):
                raise rec
            msgs = to_messages(rec, templates)
            sid = str(rec["id"]) if rec.get("id") is not None else f"{Path(source).stem}:{line}"
            if sid in seen:
                raise BadRecord(f"duplicate id {sid!r} (first at {seen[sid]})")
            ids, mask, prompt_len = tokenize_chat(tokenizer, msgs, thinking, answer_to_come=regenerate)
        except BadRecord as e:
            if on_bad_record == "skip":
                stats.skip(str(e))
                log.warning("skipping %s: %s", where, e)
                continue
            raise BadRecord(f"{where}: {e} (fix the record, or set data.on_bad_record: skip)") from None
        seen[sid] = where
        if _left_out(msgs, stats, screen=screen, keys=keys if dedupe else None, regenerate=regenerate):
            continue
        if len(ids) > max_length:
            stats.truncated += 1
            ids, mask = ids[:max_length], mask[:max_length]
        if (prompt_len >= max_length) if regenerate else sum(mask) == 0:
            msg = (
                f"the prompt fills max_length={max_length}: no room for an answer"
                if regenerate
                else f"no assistant token left within max_length={max_length}"
            )
            if on_bad_record == "skip":
                stats.skip(msg)
                continue
            raise BadRecord(f"{where}: {msg} (raise data.max_length, or set data.on_bad_record: skip)")
        rows.append(
            {
                "id": sid,
                "input_ids": np.asarray(ids, dtype=np.int32),
                "loss_mask": np.asarray(mask, dtype=np.uint8),
                "prompt_len": min(prompt_len, len(ids)),
                "num_tokens": len(ids),
            }
        )
        stats.samples += 1
        stats.tokens += len(ids)
        stats.loss_tokens += int(sum(mask))
        if max_samples is not None and stats.samples >= max_samples:
            break
    if not rows:
        where = ", ".join(paths)
        if not stats.records:
            raise BadRecord(f"{where}: the data set is empty (no records); check data.path")
        raise BadRecord(
            f"{where}: no usable samples ({stats.skipped} of {stats.records} records skipped: "
            f"{stats.problems})"
        )
    return pd.DataFrame(rows), stats


def _left_out(
    msgs: list[dict],
    stats: PrepareStats,
    *,
    screen: BenchScreen | None,
    keys: set[str] | None,
    regenerate: bool,
) -> bool:
    """Whether a record is left out as a bench prompt (`screen`) or a repeat of an earlier one (`keys`, the
    samples so far, when deduplicating); counted in `stats`."""
    if screen is not None and screen.why(msgs) is not None:
        stats.bench_overlap += 1
        return True
    if keys is not None:
        key = record_key(msgs, answers_rewritten=regenerate)
        if key in keys:
            stats.duplicates += 1
            return True
        keys.add(key)
    return False


def mask_token_uses(samples: pd.DataFrame, mask_token_id: int) -> tuple[int, str | None]:
    """How often the drafter's mask token occurs in real data, and the first sample that has it.

    The drafter marks positions to predict with this id; if real text produces it, training and serving
    confuse real tokens with masks. A preset's id that belongs to another tokenizer is the usual cause.
    """
    count, first = 0, None
    for sid, ids in zip(samples["id"], samples["input_ids"]):
        n = int(np.count_nonzero(np.asarray(ids) == mask_token_id))
        if n and first is None:
            first = str(sid)
        count += n
    return count, first
