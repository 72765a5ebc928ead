"""Which training records prepare leaves out: a prompt seen before (`data.dedupe`), and a prompt that is, or
shares a run of words with, one of the bench's prompts (`data.exclude_bench`), so that the bench does not
measure prompts the drafter trained on."""

from __future__ import annotations

import re
from collections.abc import Iterable

RUN = 13  # words of a run shared with a bench prompt that make a training prompt the bench's (GPT-3's test)
WORD = re.compile(r"\w+")


def normalized(text: str) -> str:
    return " ".join(text.split())


def record_key(messages: list[dict], *, answers_rewritten: bool) -> str:
    """What makes two records the same sample: their turns, with whitespace collapsed; without the last
    assistant turn when the target rewrites it (the same prompt twice is then the same sample)."""
    turns = list(messages)
    if answers_rewritten and turns and turns[-1]["role"] == "assistant":
        turns = turns[:-1]
    return "\n".join(f"{m['role']}: {normalized(str(m['content']))}" for m in turns)


def _prompt_text(messages: list[dict]) -> str:
    return normalized(" ".join(str(m["content"]) for m in messages if m["role"] != "assistant"))


def _runs(words: list[str]) -> Iterable[tuple[str, ...]]:
    return (tuple(words[i : i + RUN]) for i in range(len(words) - RUN + 1))


class BenchScreen:
    """The bench's prompts, held as their whole text and their runs of RUN words (lower-cased)."""

    def __init__(self, bench_messages: Iterable[list[dict]]):
        self.texts: set[str] = set()
        self.runs: set[tuple[str, ...]] = set()
        for messages in bench_messages:
            text = _prompt_text(messages)
            self.texts.add(text)
            self.runs.update(_runs(WORD.findall(text.lower())))

    def why(self, messages: list[dict]) -> str | None:
        """Why a training record's prompt counts as a bench prompt, or None."""
        text = _prompt_text(messages)
        if text in self.texts:
            return "a bench prompt"
        if any(run in self.runs for run in _runs(WORD.findall(text.lower()))):
            return f"shares a run of {RUN} words with a bench prompt"
        return None
