"""The embedded demo: a tiny hybrid target model and chat data, built from text every Python install carries.

`target.model: demo` lets a new user run the whole pipeline on a laptop CPU without downloading anything. The
text is the standard library's own `.py` sources; they are split into train and held-out files by a hash of
the relative path, so the split never depends on the seed or on which files a given install happens to have.

build_demo_target  trains a byte-level BPE tokenizer and a small Qwen3.5-style hybrid model (linear and full
                   attention layers) for a fixed number of steps, and saves both like a hub checkpoint.
build_demo_data    writes chat-formatted training conversations (train.jsonl) and benchmark prompts from
                   held-out files (prompts.jsonl) in the OpenAI `messages` format the pipeline reads.

Everything is seeded: the same seed on the same machine gives the same files, byte for byte.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import sysconfig
import time
from pathlib import Path
from typing import cast

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from draftsmith.core.io import atomic
from draftsmith.demo.data import chat_records, read_capped, split_files
from draftsmith.demo.shape import DEMO_HIDDEN_SIZE, DEMO_LAYERS
from draftsmith.target.kernels import kernels_follow_device

log = logging.getLogger(__name__)

EOT, IM_START, IM_END, THINK, END_THINK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"

EMPTY_THINK = "<think>\n\n</think>\n\n"

# Qwen3-style template. An assistant turn repeats exactly what the generation prompt adds (the empty think
# block when thinking is off), so a rendered prompt is always a string prefix of the rendered conversation:
# the pipeline finds assistant tokens by that prefix, not by template-specific markers.
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

LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]

DEFAULT_STEPS = 220  # about 100 s on 2 CPU cores


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


def demo_config(
    tokenizer: PreTrainedTokenizerFast, hidden_size: int = DEMO_HIDDEN_SIZE, num_layers: int = DEMO_LAYERS
) -> Qwen3_5TextConfig:
    """Qwen3.5 text architecture shrunk to laptop size; both layer kinds, so taps and caches meet the real
    mix."""
    eot, im_end = cast(list[int], tokenizer.convert_tokens_to_ids([EOT, IM_END]))
    return Qwen3_5TextConfig(
        vocab_size=padded_vocab(len(tokenizer)),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 5 // 2,  # DEMO_SHAPE's at the defaults
        num_hidden_layers=num_layers,
        layer_types=[LAYER_TYPES[i % len(LAYER_TYPES)] for i in range(num_layers)],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        linear_num_key_heads=4,
        linear_num_value_heads=4,
        # key and value heads of one width, as every released Qwen3.5/3.6 has them: vLLM 0.22's Gated DeltaNet
        # prefill kernel compiles for no other (docs/serving.md), and the engine bench serves this target
        linear_key_head_dim=hidden_size // 8,
        linear_value_head_dim=hidden_size // 8,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
    )


def token_rows(docs: list[str], tokenizer: PreTrainedTokenizerFast, seq_len: int) -> torch.Tensor:
    """All documents, each closed by <|endoftext|>, packed into one stream and cut into rows of seq_len."""
    eot = cast(int, tokenizer.convert_tokens_to_ids(EOT))
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


def read_stdlib(text_bytes: int) -> tuple[list[str], list[str], list[tuple[str, str]], list[tuple[str, str]]]:
    """The train and held-out file lists and their text, read up to a byte cap (held out: a twentieth of
    it)."""
    train_files, held_files = split_files()
    corpus = read_capped(train_files, text_bytes)
    held = read_capped(held_files, max(text_bytes // 20, 20_000))
    log.info(
        "stdlib: %d train / %d held-out files; read %d train files",
        len(train_files),
        len(held_files),
        len(corpus),
    )
    return train_files, held_files, corpus, held


def training_rows(
    tokenizer: PreTrainedTokenizerFast,
    corpus: list[tuple[str, str]],
    *,
    train_files: list[str],
    seed: int,
    steps: int,
    batch_size: int,
    seq_len: int,
    chat_fraction: float,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The rows the steps consume, chats first, with the chat rows and the number of chats.

    Chats are rendered both ways so the target answers the demo format whichever thinking mode is used. They
    fill chat_fraction of the rows the steps consume; raw files (in seed order) fill the rest.
    """
    rng = random.Random(seed)
    needed = steps * batch_size
    n_chats = max(8, round(chat_fraction * needed * seq_len / 300))  # ~300 tokens per rendered chat
    chats = chat_records(tokenizer, train_files, n_chats, rng)
    chat_texts = [
        cast(str, tokenizer.apply_chat_template(m, tokenize=False, enable_thinking=bool(i % 2)))
        for i, m in enumerate(chats)
    ]
    chat_rows = token_rows(chat_texts, tokenizer, seq_len)
    files = [text for _, text in corpus]
    rng.shuffle(files)
    file_rows = token_rows(files, tokenizer, seq_len)
    rows = torch.cat([chat_rows, file_rows[: max(needed - len(chat_rows), batch_size)]])
    return rows, chat_rows, len(chats)


def init_model(
    tokenizer: PreTrainedTokenizerFast, seed: int, *, hidden_size: int, num_layers: int
) -> tuple[Qwen3_5ForCausalLM, Qwen3_5TextConfig]:
    """Seeded random weights, so the same seed trains the same model."""
    torch.manual_seed(seed)
    config = demo_config(tokenizer, hidden_size, num_layers)
    model = Qwen3_5ForCausalLM(config)
    kernels_follow_device(model)  # trained on the CPU, also where fla is installed for the GPU jobs
    return model, config


def train_and_evaluate(
    model: Qwen3_5ForCausalLM,
    rows: torch.Tensor,
    *,
    held_rows: torch.Tensor,
    steps: int,
    batch_size: int,
    seed: int,
    lr: float,
) -> tuple[list[float], float, float, float]:
    """Trains between two held-out evaluations, so demo_info.json shows what training did; returns the step
    losses, the held-out loss before and after, and the training seconds."""
    held_start = eval_loss(model, held_rows, batch_size)
    t_train = time.time()
    losses = train_model(model, rows, steps, batch_size, seed, lr)
    train_seconds = time.time() - t_train
    held_end = eval_loss(model, held_rows, batch_size)
    return losses, held_start, held_end, train_seconds


def greedy_generation(config: Qwen3_5TextConfig) -> GenerationConfig:
    """What generate() does by default with the demo target: greedy, stopping at <|im_end|>."""
    return GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )


def save_target(
    out_dir: Path, model: Qwen3_5ForCausalLM, *, tokenizer: PreTrainedTokenizerFast, info: dict
) -> None:
    """Model, tokenizer and demo_info.json written beside out_dir and renamed when complete."""
    with atomic(out_dir) as tmp:
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "demo_info.json").write_text(json.dumps(info, indent=2) + "\n")


def build_demo_target(
    out_dir: str | Path,
    seed: int = 0,
    steps: int = DEFAULT_STEPS,
    *,
    text_bytes: int = 2_000_000,
    vocab_size: int = 3000,
    hidden_size: int = DEMO_HIDDEN_SIZE,
    num_layers: int = DEMO_LAYERS,
    seq_len: int = 256,
    batch_size: int = 4,
    chat_fraction: float = 0.3,
    lr: float = 2e-3,
    threads: int | None = None,
) -> dict:
    """Tokenizer + tiny hybrid model trained on stdlib sources and "continue this file" chats, saved to
    out_dir like a hub checkpoint (written beside it and renamed when complete). Returns what goes in
    demo_info.json."""
    t0 = time.time()
    out_dir = Path(out_dir)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    try:
        train_files, held_files, corpus, held = read_stdlib(text_bytes)
        tokenizer = train_tokenizer([text for _, text in corpus], vocab_size)
        log.info("tokenizer: %d tokens (%.1fs)", len(tokenizer), time.time() - t0)
        rows, chat_rows, chat_samples = training_rows(
            tokenizer,
            corpus,
            train_files=train_files,
            seed=seed,
            steps=steps,
            batch_size=batch_size,
            seq_len=seq_len,
            chat_fraction=chat_fraction,
        )
        held_rows = token_rows([text for _, text in held], tokenizer, seq_len)[: 4 * batch_size]

        model, config = init_model(tokenizer, seed, hidden_size=hidden_size, num_layers=num_layers)
        n_params = sum(p.numel() for p in model.parameters())
        log.info("model: %.2fM params, vocab %d (tokenizer %d), %d rows of %d tokens", n_params / 1e6,
                 config.vocab_size, len(tokenizer), len(rows), seq_len)  # fmt: skip
        losses, held_start, held_end, train_seconds = train_and_evaluate(
            model, rows, held_rows=held_rows, steps=steps, batch_size=batch_size, seed=seed, lr=lr
        )

        model.generation_config = greedy_generation(config)
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
            "chat_samples": chat_samples,
            "rows": len(rows),
            "chat_rows": len(chat_rows),
            "tokenizer_size": len(tokenizer),
            "vocab_size": config.vocab_size,
            "parameters": n_params,
            "python": sysconfig.get_python_version(),
        }
        save_target(out_dir, model, tokenizer=tokenizer, info=info)
        log.info("demo target: loss %.3f -> %.3f in %.0fs, saved to %s", info["loss_start"], info["loss_end"],
                 info["total_seconds"], out_dir)  # fmt: skip
        return info
    finally:
        torch.set_num_threads(prev_threads)
