"""The target's answers judged before anything trains on them.

A drafter learns whatever the target wrote. A base model under a chat template, a template for another model,
a thinking switch unlike the bench's, or a `max_new_tokens` too small all give answers that look like data and
train a drafter of no use. Per shard, after regeneration and before extraction, each answer is read for:

- how it ended: with an end-of-turn token, cut at the token cap (`max_new_tokens`, or `data.max_length`),
  empty;
- a loop: some `NGRAM`-token run occurring twice within its last `WINDOW` tokens;
- a new turn: one of the chat template's role markers (its special tokens, end-of-turn aside) inside it;
- thinking markers (`<think>`, `</think>`) that disagree with `data.thinking`;

and the shard's shares of each, with a length histogram, go into its manifest. `data.regenerate.checks` gives
the largest share allowed of each; a shard past one stops its job before extraction, with a message that shows
some answers and names the likely causes and the key to change.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

NGRAM = 16  # a run of this many tokens occurring twice ...
WINDOW = 256  # ... within an answer's last this many tokens is a loop
HISTOGRAM_BINS = 8
EXAMPLES = 3  # answers shown in a stop message
SHOWN_CHARS = 160  # of each answer's head and tail
ENV = "DRAFTSMITH_ANSWER_CHECKS"  # the thresholds, as the workflow hands them to the jobs (see common.smk)
# each has data.regenerate.checks.max_*
CHECKED = ("cut", "empty", "repeats", "new_turn", "thinking_mismatch")
SHARES = ("ended", *CHECKED)  # what a shard's statistics give the share of
CAUSES = {
    "cut": "answers longer than the cap (raise data.regenerate.max_new_tokens or data.max_length), or a "
    "model that never says it is done: a base model, or a chat template not its own (target.chat_template)",
    "empty": "a chat template that ends the turn at once, or a prompt the model refuses to answer",
    "repeats": "a base model or a model too small for the prompts, decoding greedily into a loop; or a chat "
    "template not its own (target.chat_template)",
    "new_turn": "a base model under a chat template, or a template not its own (target.chat_template): the "
    "model writes the user's next turn too",
    "thinking_mismatch": "data.thinking unlike the model's habit: a thinking model asked not to think still "
    "does (or the reverse); set data.thinking to how you will serve it",
}


@dataclass(frozen=True)
class Markers:
    """Token ids that say how an answer ended or what it did."""

    eos: frozenset[int]  # end of turn (any of them)
    turn: frozenset[int]  # the template's role markers: special tokens of a rendered conversation, eos aside
    think_open: int | None
    think_close: int | None


def template_markers(tokenizer, eos_ids: list[int]) -> Markers:
    """The markers from the tokenizer and its chat template (none of the turn kind without a template)."""
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    specials |= {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
    turn: set[int] = set()
    if getattr(tokenizer, "chat_template", None):
        chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        try:
            rendered = tokenizer.apply_chat_template(chat, tokenize=True)
        except Exception as e:  # a template that wants more (a system turn, tools): no markers to read
            logging.getLogger(__name__).warning(
                "answers: no role markers read from the chat template (%s)", e
            )
            rendered = []
        ids = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
        turn = {int(i) for i in ids if int(i) in specials}
    vocab = tokenizer.get_vocab()
    return Markers(
        eos=frozenset(eos_ids),
        turn=frozenset(turn - set(eos_ids)),
        think_open=vocab.get("<think>"),
        think_close=vocab.get("</think>"),
    )


def loops(tokens: list[int]) -> bool:
    """Whether some NGRAM-token run occurs twice within the last WINDOW tokens."""
    tail = tokens[-WINDOW:]
    seen = set()
    for i in range(len(tail) - NGRAM + 1):
        gram = tuple(tail[i : i + NGRAM])
        if gram in seen:
            return True
        seen.add(gram)
    return False


def answer_flags(answer: list[int], *, room: int, markers: Markers, thinking: bool) -> dict[str, bool | None]:
    """What one answer did; `room` is the most tokens it could have had (the cap, or what max_length left)."""
    ended = bool(answer) and answer[-1] in markers.eos
    body = answer[:-1] if ended else answer
    cut = not ended and len(answer) >= room
    mismatch = None
    if markers.think_close is not None:
        opened, closed = markers.think_open in body, markers.think_close in body
        mismatch = (opened or closed) if not thinking else (not closed and not cut)
    return {
        "ended": ended,
        "cut": cut,
        "empty": not body,
        "repeats": loops(body),
        "new_turn": any(t in markers.turn for t in body),
        "thinking_mismatch": mismatch,
    }


def answers_of(samples: pd.DataFrame) -> list[list[int]]:
    return [list(map(int, ids[int(p) :])) for ids, p in zip(samples["input_ids"], samples["prompt_len"])]


def answer_stats(
    samples: pd.DataFrame, *, markers: Markers, max_new_tokens: int, max_length: int, thinking: bool
) -> dict:
    """The shard's shares of each flag, the mean length, the histogram, and the ids showing each flag."""
    answers = answers_of(samples)
    rooms = [min(max_new_tokens, max_length - int(p)) for p in samples["prompt_len"]]
    flags = [answer_flags(a, room=r, markers=markers, thinking=thinking) for a, r in zip(answers, rooms)]
    lengths = np.asarray([len(a) for a in answers])
    counts, edges = np.histogram(lengths, bins=HISTOGRAM_BINS, range=(0, max(max_new_tokens, 1)))
    stats: dict = {"answers": len(answers), "mean_tokens": float(lengths.mean()) if len(lengths) else 0.0}
    for name in SHARES:
        known = [bool(f[name]) for f in flags if f[name] is not None]
        stats[name] = sum(known) / len(known) if known else None
        stats.setdefault("ids", {})[name] = [
            str(i) for i, f in zip(samples["id"], flags) if f[name]
        ][:EXAMPLES]  # fmt: skip
    stats["histogram"] = {"edges": [int(e) for e in edges], "counts": [int(c) for c in counts]}
    stats["measure"] = f"a loop: some {NGRAM}-token run twice within an answer's last {WINDOW} tokens"
    return stats


def checks_from_env() -> dict:
    """The thresholds the workflow handed this job (data.regenerate.checks), else the schema's defaults."""
    from draftsmith.config import with_defaults

    given = json.loads(os.environ.get(ENV) or "{}")
    return with_defaults("data", {"regenerate": {"checks": given}})["regenerate"]["checks"]


def failed_checks(stats: dict, checks: dict) -> list[tuple[str, float, float]]:
    """(statistic, share, largest share allowed) for each check the shard fails; none when checks are off."""
    if not checks["enabled"] or not stats["answers"]:
        return []
    failed = []
    for name in CHECKED:
        limit, share = checks[f"max_{name}"], stats[name]
        if limit is not None and share is not None and share > float(limit):
            failed.append((name, share, float(limit)))
    return failed


def stop_message(shard: str, samples: pd.DataFrame, stats: dict, failed: list, tokenizer) -> str:
    """Why the shard stops: each check it failed, some answers' heads and tails, the causes, the keys."""
    by_id = dict(zip(samples["id"].astype(str), answers_of(samples)))
    lines = [f"answers of {shard} judged before extraction ({stats['answers']} answers): stopped"]
    for name, share, limit in failed:
        lines.append(
            f"- {name}: {share:.1%} of the answers, above data.regenerate.checks.max_{name} = {limit:g}. "
            f"Likely: {CAUSES[name]}"
        )
        for sid in stats["ids"][name]:
            text = tokenizer.decode(by_id[sid])
            head, tail = text[:SHOWN_CHARS], text[-SHOWN_CHARS:] if len(text) > SHOWN_CHARS else ""
            lines.append(f"    {sid}: {head!r}" + (f" ... {tail!r}" if tail else ""))
    lines.append(
        "The answers stay in the answer cache: a rerun after changing a threshold does not decode them "
        "again. To train on them anyway, raise the threshold or set data.regenerate.checks.enabled: false"
    )
    return "\n".join(lines)


class AnswersRejected(RuntimeError):
    """A shard's answers failed a check: the message says which, shows some, and names the key."""


def judge(samples: pd.DataFrame, tokenizer, eos_ids: list[int], *, data: dict, shard: str) -> dict:
    """The shard's answer statistics (for its manifest), or AnswersRejected when they fail a check."""
    markers = template_markers(tokenizer, eos_ids)
    stats = answer_stats(
        samples,
        markers=markers,
        max_new_tokens=int(data["regenerate"]["max_new_tokens"]),
        max_length=int(data["max_length"]),
        thinking=bool(data["thinking"]),
    )
    logging.getLogger(__name__).info(
        "answers of %s: %s",
        shard,
        ", ".join(f"{k} {stats[k]:.1%}" for k in SHARES if stats[k] is not None),
    )
    if failed := failed_checks(stats, checks_from_env()):
        raise AnswersRejected(stop_message(shard, samples, stats, failed, tokenizer))
    return stats


def combined(stats: list[dict]) -> dict:
    """Several shards' statistics as one: shares weighted by answers, histograms summed."""
    total = sum(s["answers"] for s in stats)
    out: dict = {"answers": total}
    for name in (*SHARES, "mean_tokens"):
        known = [(s[name], s["answers"]) for s in stats if s.get(name) is not None]
        weight = sum(n for _, n in known)
        out[name] = sum(v * n for v, n in known) / weight if weight else None
    out["histogram"] = {
        "edges": stats[0]["histogram"]["edges"] if stats else [],
        "counts": [int(sum(c)) for c in zip(*(s["histogram"]["counts"] for s in stats))],
    }
    return out


def answers_table(by_shard: dict[str, dict]) -> str:
    """The report's page: a row per shard and one for all, shares in percent."""
    head = ["shard", "answers", "mean tokens", *SHARES]
    rows = [*by_shard.items(), ("all", combined(list(by_shard.values())))]
    lines = ["| " + " | ".join(h.replace("_", " ") for h in head) + " |", "|" + " --- |" * len(head)]
    for name, s in rows:
        shares = [("n/a" if s[k] is None else f"{s[k]:.1%}") for k in SHARES]
        lines.append(f"| {name} | {s['answers']} | {s['mean_tokens']:.1f} | " + " | ".join(shares) + " |")
    return "\n".join(lines)
