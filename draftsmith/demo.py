"""The embedded demo: a tiny hybrid target model and chat data, built from text every Python install carries.

`target.model: demo` lets a new user run the whole pipeline on a laptop CPU without downloading anything. The
text is the standard library's own `.py` sources; they are split into train and held-out files by a hash of the
relative path, so the split never depends on the seed or on which files a given install happens to have.

build_demo_target  trains a byte-level BPE tokenizer and a small Qwen3.5-style hybrid model (linear and full
                   attention layers) for a fixed number of steps, and saves both like a hub checkpoint.
build_demo_data    writes chat-formatted training conversations (train.jsonl) and benchmark prompts from held-out
                   files (prompts.jsonl) in the OpenAI `messages` format the pipeline reads.

Everything is seeded: the same seed on the same machine gives the same files, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import sysconfig
import time
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from draftsmith.extract import kernels_follow_device
from draftsmith.store import tmp_path

log = logging.getLogger(__name__)

EOT, IM_START, IM_END, THINK, END_THINK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"
EMPTY_THINK = "<think>\n\n</think>\n\n"

# Qwen3-style template. An assistant turn repeats exactly what the generation prompt adds (the empty think block
# when thinking is off), so a rendered prompt is always a string prefix of the rendered conversation: the
# pipeline finds assistant tokens by that prefix, not by template-specific markers.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' and enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# Parts of the stdlib that are tests, vendored packages, data tables or tool GUIs, not ordinary library code.
SKIP_DIRS = {
    "test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "idlelib", "lib2to3",
    "turtledemo", "ensurepip", "pydoc_data", "encodings", "__phello__", "venv",
}  # fmt: skip
MAX_FILE_BYTES = 120_000  # a few stdlib files are generated tables; they teach nothing about Python
HELD_OUT_PERCENT = 10

LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]
DEFAULT_STEPS = 220  # about 100 s on 2 CPU cores
PROMPT_CHARS, ANSWER_CHARS = 640, 400
MAX_SAMPLE_TOKENS = 360  # rendered conversation; the demo trains the drafter with max_length ~512


# ----------------------------------------------------------------------------------------------------------------
# text: the standard library's own sources


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


# ----------------------------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(texts: list[str], vocab_size: int = 3000) -> PreTrainedTokenizerFast:
    """Byte-level BPE (any text encodes, nothing is unknown) with the Qwen chat and think markers."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # As in Qwen3 the think markers are added but not "special": decoding with skip_special_tokens keeps them.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK, END_THINK)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=EOT,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=131072,
    )


def padded_vocab(n_tokens: int, multiple: int = 128) -> int:
    """Next multiple strictly above the tokenizer size: the ids past it exist in the model but no text maps to
    them, so the pipeline can take one as the drafter's mask token, as with real checkpoints."""
    return (n_tokens // multiple + 1) * multiple


# ----------------------------------------------------------------------------------------------------------------
# chat samples: "continue this file"


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


# ----------------------------------------------------------------------------------------------------------------
# model


def demo_config(
    tokenizer: PreTrainedTokenizerFast, hidden_size: int = 256, num_layers: int = 8
) -> Qwen3_5TextConfig:
    """Qwen3.5 text architecture shrunk to laptop size; both layer kinds, so taps and caches meet the real mix."""
    eot, im_end = tokenizer.convert_tokens_to_ids([EOT, IM_END])
    return Qwen3_5TextConfig(
        vocab_size=padded_vocab(len(tokenizer)),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 5 // 2,
        num_hidden_layers=num_layers,
        layer_types=[LAYER_TYPES[i % len(LAYER_TYPES)] for i in range(num_layers)],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        linear_num_key_heads=4,
        linear_num_value_heads=4,
        linear_key_head_dim=hidden_size // 8,
        linear_value_head_dim=hidden_size // 4,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
    )


def token_rows(docs: list[str], tokenizer: PreTrainedTokenizerFast, seq_len: int) -> torch.Tensor:
    """All documents, each closed by <|endoftext|>, packed into one stream and cut into rows of seq_len."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    stream: list[int] = []
    for ids in tokenizer(docs, add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        stream.append(eot)
    n_rows = len(stream) // seq_len
    return torch.tensor(stream[: n_rows * seq_len], dtype=torch.long).view(n_rows, seq_len)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine down to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def eval_loss(model: Qwen3_5ForCausalLM, rows: torch.Tensor, batch_size: int) -> float:
    model.eval()
    losses = [model(input_ids=b, labels=b).loss.item() for b in rows.split(batch_size)]
    model.train()
    return sum(losses) / len(losses)


def train_model(
    model: Qwen3_5ForCausalLM,
    rows: torch.Tensor,
    steps: int,
    batch_size: int,
    seed: int,
    lr: float = 2e-3,
) -> list[float]:
    """Plain next-token training for a fixed number of steps (not wall time: the result must not depend on the
    machine's speed). Returns the loss of every step."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.cat(
        [torch.randperm(len(rows), generator=gen) for _ in range(steps * batch_size // len(rows) + 1)]
    )
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, steps // 10)
    losses = []
    model.train()
    bar = tqdm(range(steps), desc="demo target", mininterval=2.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        batch = rows[order[step * batch_size : (step + 1) * batch_size]]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


def replace_dir(tmp: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def build_demo_target(
    out_dir: str | Path,
    seed: int = 0,
    steps: int = DEFAULT_STEPS,
    *,
    text_bytes: int = 2_000_000,
    vocab_size: int = 3000,
    hidden_size: int = 256,
    num_layers: int = 8,
    seq_len: int = 256,
    batch_size: int = 4,
    chat_fraction: float = 0.3,
    lr: float = 2e-3,
    threads: int | None = None,
) -> dict:
    """Tokenizer + tiny hybrid model trained on stdlib sources and "continue this file" chats, saved to out_dir
    like a hub checkpoint (written beside it and renamed when complete). Returns what goes in demo_info.json."""
    t0 = time.time()
    out_dir = Path(out_dir)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    try:
        train_files, held_files = split_files()
        corpus = read_capped(train_files, text_bytes)
        held = read_capped(held_files, max(text_bytes // 20, 20_000))
        log.info(
            "stdlib: %d train / %d held-out files; read %d train files",
            len(train_files),
            len(held_files),
            len(corpus),
        )
        tokenizer = train_tokenizer([text for _, text in corpus], vocab_size)
        log.info("tokenizer: %d tokens (%.1fs)", len(tokenizer), time.time() - t0)

        # Chats are rendered both ways so the target answers the demo format whichever thinking mode is used.
        # They fill chat_fraction of the rows the steps consume; raw files (in seed order) fill the rest.
        rng = random.Random(seed)
        needed = steps * batch_size
        n_chats = max(8, round(chat_fraction * needed * seq_len / 300))  # ~300 tokens per rendered chat
        chats = chat_records(tokenizer, train_files, n_chats, rng)
        chat_texts = [
            tokenizer.apply_chat_template(m, tokenize=False, enable_thinking=bool(i % 2))
            for i, m in enumerate(chats)
        ]
        chat_rows = token_rows(chat_texts, tokenizer, seq_len)
        files = [text for _, text in corpus]
        rng.shuffle(files)
        file_rows = token_rows(files, tokenizer, seq_len)
        rows = torch.cat([chat_rows, file_rows[: max(needed - len(chat_rows), batch_size)]])
        held_rows = token_rows([text for _, text in held], tokenizer, seq_len)[: 4 * batch_size]

        torch.manual_seed(seed)
        config = demo_config(tokenizer, hidden_size, num_layers)
        model = Qwen3_5ForCausalLM(config)
        kernels_follow_device(model)  # trained on the CPU, also where fla is installed for the GPU jobs
        n_params = sum(p.numel() for p in model.parameters())
        log.info("model: %.2fM params, vocab %d (tokenizer %d), %d rows of %d tokens", n_params / 1e6,
                 config.vocab_size, len(tokenizer), len(rows), seq_len)  # fmt: skip
        held_start = eval_loss(model, held_rows, batch_size)
        t_train = time.time()
        losses = train_model(model, rows, steps, batch_size, seed, lr)
        train_seconds = time.time() - t_train
        held_end = eval_loss(model, held_rows, batch_size)

        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
            do_sample=False,
        )
        tail = losses[-max(1, steps // 10) :]
        info = {
            "seed": seed,
            "steps": steps,
            "batch_size": batch_size,
            "seq_len": seq_len,
            "lr": lr,
            "tokens_trained": steps * batch_size * seq_len,
            "loss_start": losses[0],
            "loss_end": sum(tail) / len(tail),
            "held_out_loss_start": held_start,
            "held_out_loss_end": held_end,
            "train_seconds": round(train_seconds, 2),
            "total_seconds": round(time.time() - t0, 2),
            "threads": torch.get_num_threads(),
            "train_files": len(train_files),
            "held_out_files": len(held_files),
            "files_read": len(corpus),
            "text_bytes_read": sum(len(text.encode()) for _, text in corpus),
            "chat_samples": len(chats),
            "rows": len(rows),
            "chat_rows": len(chat_rows),
            "tokenizer_size": len(tokenizer),
            "vocab_size": config.vocab_size,
            "parameters": n_params,
            "python": sysconfig.get_python_version(),
        }
        tmp = tmp_path(out_dir)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "demo_info.json").write_text(json.dumps(info, indent=2) + "\n")
        replace_dir(tmp, out_dir)
        log.info("demo target: loss %.3f -> %.3f in %.0fs, saved to %s", info["loss_start"], info["loss_end"],
                 info["total_seconds"], out_dir)  # fmt: skip
        return info
    finally:
        torch.set_num_threads(prev_threads)


# ----------------------------------------------------------------------------------------------------------------
# data


def write_jsonl(path: Path, records: list[dict]) -> None:
    tmp = tmp_path(path)
    with open(tmp, "w") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def build_demo_data(
    target_dir: str | Path,
    out_dir: str | Path,
    seed: int = 0,
    n_train: int = 400,
    n_prompts: int = 16,
    max_tokens: int = MAX_SAMPLE_TOKENS,
) -> dict:
    """train.jsonl (conversations from training files) and prompts.jsonl (user turns from held-out files), each
    rendered conversation at most max_tokens with the target's tokenizer. Returns counts."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target_dir)
    train_files, held_files = split_files()
    # Separate streams (not the target's seed stream) so the data does not repeat the target's own chats exactly.
    rng = random.Random(f"demo-data-{seed}")
    train = chat_records(tokenizer, train_files, n_train, rng, max_tokens=max_tokens)
    prompts = chat_records(tokenizer, held_files, n_prompts, rng, with_answer=False, distinct_files=True,
                           max_tokens=max_tokens)  # fmt: skip
    write_jsonl(
        out_dir / "train.jsonl", [{"id": f"demo-train-{i:05d}", "messages": m} for i, m in enumerate(train)]
    )
    write_jsonl(
        out_dir / "prompts.jsonl",
        [{"id": f"demo-prompt-{i:03d}", "messages": m} for i, m in enumerate(prompts)],
    )
    lengths = [rendered_length(tokenizer, m) for m in train]
    info = {"train": len(train), "prompts": len(prompts), "max_tokens": max(lengths),
            "mean_tokens": sum(lengths) / len(lengths)}  # fmt: skip
    log.info("demo data: %s -> %s", info, out_dir)
    return info
