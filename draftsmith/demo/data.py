"""The embedded demo's chat data, built from the standard library's sources every Python install carries."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import sysconfig
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from draftsmith.core.io import write_jsonl

log = logging.getLogger(__name__)

# Parts of the stdlib that are tests, vendored packages, data tables or tool GUIs, not ordinary library code.
SKIP_DIRS = {
    "test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "idlelib", "lib2to3",
    "turtledemo", "ensurepip", "pydoc_data", "encodings", "__phello__", "venv",
}  # fmt: skip

MAX_FILE_BYTES = 120_000  # a few stdlib files are generated tables; they teach nothing about Python

HELD_OUT_PERCENT = 10

PROMPT_CHARS, ANSWER_CHARS = 640, 400

MAX_SAMPLE_TOKENS = 360  # rendered conversation; the demo trains the drafter with max_length ~512

MIN_SOURCES = 100


def stdlib_root() -> Path:
    """The standard library's folder; if this Python ships without its sources (slim images keep only .pyc),
    the installed transformers package's sources stand in, so the demo still builds (a different, equally
    deterministic text)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if len(list(root.glob("*.py"))) >= MIN_SOURCES // 2:
        return root
    import transformers

    fallback = Path(transformers.__file__).parent
    log.warning("%s holds almost no .py sources; the demo reads %s instead", root, fallback)
    return fallback


def stdlib_files(root: Path | None = None) -> list[str]:
    """Relative posix paths of the stdlib's ordinary `.py` files, sorted (pruned while walking: site-packages
    can be huge)."""
    root = root or stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(("config-", "."))]
        for name in filenames:
            if not name.endswith(".py") or name.startswith("test_"):
                continue
            path = Path(dirpath, name)
            if 0 < path.stat().st_size <= MAX_FILE_BYTES:
                found.append(path.relative_to(root).as_posix())
    return sorted(found)


def path_hash(relpath: str) -> int:
    return int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")


def is_held_out(relpath: str) -> bool:
    """About one file in ten is held out; decided by the path alone so every build agrees on the split."""
    return path_hash(relpath) % 100 < HELD_OUT_PERCENT


def split_files(root: Path | None = None) -> tuple[list[str], list[str]]:
    files = stdlib_files(root)
    return [f for f in files if not is_held_out(f)], [f for f in files if is_held_out(f)]


def read_text(relpath: str, root: Path | None = None) -> str:
    return (root or stdlib_root()).joinpath(relpath).read_text(encoding="utf-8", errors="replace")


def read_capped(relpaths: list[str], max_bytes: int, root: Path | None = None) -> list[tuple[str, str]]:
    """Files in path-hash order (a spread over all packages, not the alphabet's start) until max_bytes."""
    out, total = [], 0
    for relpath in sorted(relpaths, key=path_hash):
        if total >= max_bytes:
            break
        text = read_text(relpath, root)
        out.append((relpath, text))
        total += len(text.encode())
    return out


def continuation(
    text: str, rng: random.Random, prompt_chars: int, answer_chars: int
) -> tuple[str, str] | None:
    """A window of whole lines at a random place: the head (up to prompt_chars) and the lines that follow it
    (up to answer_chars). None when the file is too short or the place is unusable."""
    lines = text.splitlines()
    if len(lines) < 12:
        return None
    start = rng.randrange(len(lines) - 8)
    while start < len(lines) and not lines[start].strip():
        start += 1
    head, size, i = [], 0, start
    while i < len(lines) and size + len(lines[i]) + 1 <= prompt_chars:
        head.append(lines[i])
        size += len(lines[i]) + 1
        i += 1
    tail, size = [], 0
    while i < len(lines) and size + len(lines[i]) + 1 <= answer_chars:
        tail.append(lines[i])
        size += len(lines[i]) + 1
        i += 1
    if len(head) < 3 or sum(1 for t in tail if t.strip()) < 2:
        return None
    return "\n".join(head), "\n".join(tail)


def user_prompt(relpath: str, head: str) -> str:
    return f"Continue this Python file ({relpath}):\n{head}"


def rendered_length(tokenizer: PreTrainedTokenizerFast, messages: list[dict]) -> int:
    """Token count in the longer rendering (thinking off adds the empty think block)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, enable_thinking=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fit_messages(
    tokenizer: PreTrainedTokenizerFast, relpath: str, head: str, tail: str | None, max_tokens: int
) -> list[dict] | None:
    """Messages for one window, dropping head lines from the top until the rendering fits max_tokens."""
    head_lines = head.split("\n")
    while len(head_lines) >= 3:
        messages = [{"role": "user", "content": user_prompt(relpath, "\n".join(head_lines))}]
        if tail is not None:
            messages.append({"role": "assistant", "content": tail})
        if rendered_length(tokenizer, messages) <= max_tokens:
            return messages
        head_lines = head_lines[max(1, len(head_lines) // 8) :]
    return None


def chat_records(
    tokenizer: PreTrainedTokenizerFast,
    relpaths: list[str],
    n: int,
    rng: random.Random,
    *,
    with_answer: bool = True,
    distinct_files: bool = False,
    max_tokens: int = MAX_SAMPLE_TOKENS,
    root: Path | None = None,
) -> list[list[dict]]:
    """n conversations from random windows of random files (each file at most once if distinct_files)."""
    pool = list(relpaths)
    rng.shuffle(pool)
    out: list[list[dict]] = []
    cache: dict[str, str] = {}
    for _ in range(50 * n):
        if len(out) == n or not pool:
            break
        relpath = pool.pop() if distinct_files else pool[rng.randrange(len(pool))]
        if relpath not in cache:
            cache[relpath] = read_text(relpath, root)
        window = continuation(cache[relpath], rng, PROMPT_CHARS, ANSWER_CHARS)
        if window is None:
            continue
        head, tail = window
        messages = fit_messages(tokenizer, relpath, head, tail if with_answer else None, max_tokens)
        if messages is not None:
            out.append(messages)
    if len(out) < n:
        raise RuntimeError(
            f"only {len(out)} of {n} demo conversations could be made from {len(relpaths)} files"
        )
    return out


def build_demo_data(
    target_dir: str | Path,
    out_dir: str | Path,
    seed: int = 0,
    n_train: int = 400,
    n_prompts: int = 16,
    max_tokens: int = MAX_SAMPLE_TOKENS,
) -> dict:
    """train.jsonl (conversations from training files) and prompts.jsonl (user turns from held-out files),
    each rendered conversation at most max_tokens with the target's tokenizer. Returns counts."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target_dir)
    train_files, held_files = split_files()
    # Separate streams (not the target's seed stream) so the data does not repeat the target's own chats
    # exactly.
    rng = random.Random(f"demo-data-{seed}")
    train = chat_records(tokenizer, train_files, n_train, rng, max_tokens=max_tokens)
    prompts = chat_records(tokenizer, held_files, n_prompts, rng, with_answer=False, distinct_files=True,
                           max_tokens=max_tokens)  # fmt: skip
    write_jsonl(
        out_dir / "train.jsonl",
        [{"id": f"demo-train-{i:05d}", "messages": m} for i, m in enumerate(train)],
        ensure_ascii=False,
    )
    write_jsonl(
        out_dir / "prompts.jsonl",
        [{"id": f"demo-prompt-{i:03d}", "messages": m} for i, m in enumerate(prompts)],
        ensure_ascii=False,
    )
    lengths = [rendered_length(tokenizer, m) for m in train]
    info = {"train": len(train), "prompts": len(prompts), "max_tokens": max(lengths),
            "mean_tokens": sum(lengths) / len(lengths)}  # fmt: skip
    log.info("demo data: %s -> %s", info, out_dir)
    return info
