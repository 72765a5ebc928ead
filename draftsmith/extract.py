"""Hidden-state extraction: one model copy per GPU (or GPU group), one shard per job.

The hot loop keeps the GPU busy: batches are length-sorted and packed to a token budget (little padding), inputs go
up from pinned memory, the forward runs the body only and stops after the deepest tap, valid rows are gathered on
the GPU with indices computed on the host (no `nonzero` sync), and the device-to-host copy runs on its own stream
into reusable pinned buffers that a writer thread drains to disk while the next batch computes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from . import store
from .taps import forward_taps

log = logging.getLogger(__name__)


def fla_available() -> bool:
    try:
        import fla  # noqa: F401
    except ImportError:
        return False
    return True


def has_linear_attention(model) -> bool:
    types = getattr(model.config, "layer_types", None) or []
    return any("linear" in t for t in types)


def report_kernels(model) -> str:
    """Says which linear-attention kernels run: fla's Triton kernels are ~1.5x faster than the torch fallback."""
    if not has_linear_attention(model):
        return "attention-only target: flash-linear-attention not needed"
    if fla_available():
        msg = "flash-linear-attention found: its kernels run the linear-attention layers"
        log.info(msg)
    else:
        msg = (
            "flash-linear-attention is NOT installed: linear-attention layers use the slow torch fallback "
            "(install the `gpu` extra: pip install 'draftsmith[gpu]')"
        )
        if torch.cuda.is_available():
            log.warning(msg)
        else:
            log.info(msg)
    return msg


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
            "float32": torch.float32}[name]


def load_target(path: str, devices: list[int], dtype: str = "auto", revision: str | None = None,
                trust_remote_code: bool = False):
    """The target on its devices: one GPU, a group through `device_map` (layers split across it), or the CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device("cuda:0" if devices else "cpu")
    torch_dtype = resolve_dtype(dtype, device)
    kwargs: dict = {"dtype": torch_dtype, "revision": revision, "trust_remote_code": trust_remote_code}
    if len(devices) > 1:
        kwargs["device_map"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if len(devices) <= 1:
        model.to(device)
    model.eval()
    tok = AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    return model, tok, device


def make_batches(lengths: list[int] | np.ndarray, token_budget: int) -> list[list[int]]:
    """Length-sorted batches whose padded size (rows x longest) stays within the token budget.

    Longest first, so an out-of-memory batch shows up in the first seconds, not at the end.
    """
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) + 1) * longest > token_budget:
            batches.append(cur)
            cur = []
        cur.append(int(i))
    if cur:
        batches.append(cur)
    return batches


@torch.inference_mode()
def regenerate(model, tokenizer, samples: pd.DataFrame, max_new_tokens: int, temperature: float,
               max_length: int, batch_size: int, seed: int) -> pd.DataFrame:
    """Replaces each last assistant turn with the target's own answer (drafters learn the target, not the data)."""
    device = next(model.parameters()).device
    torch.manual_seed(seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    eos_ids = set(eos if isinstance(eos, list) else [eos if eos is not None else tokenizer.eos_token_id])
    out = samples.copy()
    order = np.argsort(-samples["prompt_len"].to_numpy(), kind="stable")
    new_ids, new_mask = [None] * len(samples), [None] * len(samples)
    for b in tqdm(range(0, len(order), batch_size), desc="regenerate", unit="batch"):
        rows = order[b : b + batch_size]
        prompts = [samples["input_ids"].iloc[r][: samples["prompt_len"].iloc[r]] for r in rows]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        for k, p in enumerate(prompts):  # left padding for generation
            ids[k, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
            att[k, width - len(p):] = 1
        gen = model.generate(
            input_ids=ids.to(device), attention_mask=att.to(device), max_new_tokens=max_new_tokens,
            do_sample=temperature > 0, temperature=temperature if temperature > 0 else None, top_p=None,
            top_k=None, pad_token_id=pad,
        )[:, width:].cpu()
        for k, r in enumerate(rows):
            resp = gen[k].tolist()
            cut = next((j + 1 for j, t in enumerate(resp) if t in eos_ids), len(resp))
            resp = resp[:cut]
            p = prompts[k]
            old_mask = samples["loss_mask"].iloc[r][: len(p)]
            ids_k = np.concatenate([p, np.asarray(resp, dtype=np.int32)])[:max_length]
            mask_k = np.concatenate([old_mask, np.ones(len(resp), dtype=np.uint8)])[:max_length]
            new_ids[r], new_mask[r] = ids_k.astype(np.int32), mask_k.astype(np.uint8)
    out["input_ids"] = new_ids
    out["loss_mask"] = new_mask
    out["num_tokens"] = [len(x) for x in new_ids]
    return out


@dataclass
class ExtractStats:
    samples: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0
    seconds: float = 0.0
    compute_seconds: float = 0.0
    writer_wait_seconds: float = 0.0
    write_seconds: float = 0.0
    bytes_written: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def padding_waste(self) -> float:
        return 1.0 - self.tokens / max(self.padded_tokens, 1)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, padding_waste=self.padding_waste)
        return d


class _Writer:
    """Drains finished batches to the shard file on a thread, so disk time hides behind GPU time."""

    def __init__(self, writer: store.ShardWriter, stats: ExtractStats, depth: int = 2):
        self.writer, self.stats = writer, stats
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            event, rows, hidden, scale, ids, masks, release = item
            try:
                if event is not None:
                    event.synchronize()
                t0 = time.perf_counter()
                start = 0
                for idx, n in rows:
                    sl = slice(start, start + n)
                    self.writer.write_sample(idx, hidden[sl], ids[idx], masks[idx],
                                             None if scale is None else scale[sl])
                    start += n
                self.stats.write_seconds += time.perf_counter() - t0
                self.stats.bytes_written += hidden[:start].numel() * hidden.element_size()
            except BaseException as e:  # surfaced in the main thread
                self.error = e
            finally:
                release()

    def put(self, item) -> None:
        if self.error is not None:
            raise self.error
        t0 = time.perf_counter()
        self.q.put(item)
        self.stats.writer_wait_seconds += time.perf_counter() - t0

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


class _PinnedPool:
    """A few reusable pinned host buffers: pinning is slow, so it happens once per job, not per batch."""

    def __init__(self, rows: int, width: int, dtype: torch.dtype, count: int, pin: bool):
        self.free: queue.Queue = queue.Queue()
        for _ in range(count):
            buf = torch.empty((rows, width), dtype=dtype, pin_memory=pin)
            sbuf = torch.empty((rows,), dtype=torch.float32, pin_memory=pin)
            self.free.put((buf, sbuf))

    def get(self):
        return self.free.get()

    def put(self, bufs) -> None:
        self.free.put(bufs)


def extract_samples(
    model,
    samples: pd.DataFrame,
    taps: list[int],
    out_path: str | Path,
    token_budget: int,
    storage: str = "bf16",
    pad_token_id: int = 0,
    progress: bool = True,
) -> tuple[str, ExtractStats]:
    """Writes the tap states of every sample to one shard file; returns its checksum and the run's figures."""
    device = next(model.parameters()).device
    hidden_size = model.config.get_text_config().hidden_size
    width = len(taps) * hidden_size
    lengths = samples["num_tokens"].to_numpy()
    longest = int(lengths.max())
    budget = max(token_budget, longest)
    batches = make_batches(lengths, budget)
    ids_all = [torch.as_tensor(np.asarray(x, dtype=np.int64)) for x in samples["input_ids"]]
    masks_all = [torch.as_tensor(np.asarray(x, dtype=np.uint8)) for x in samples["loss_mask"]]
    writer = store.ShardWriter(out_path, lengths.tolist(), width, storage)
    stats = ExtractStats()
    cuda = device.type == "cuda"
    buf_dtype = torch.float8_e4m3fn if storage == "fp8" else torch.bfloat16
    pool = _PinnedPool(budget, width, buf_dtype, count=3, pin=cuda)
    copy_stream = torch.cuda.Stream(device) if cuda else None
    bg = _Writer(writer, stats)
    t_start = time.perf_counter()
    try:
        for batch in tqdm(batches, desc=f"extract {Path(out_path).stem}", unit="batch", disable=not progress,
                          mininterval=5.0):
            lens = [int(lengths[i]) for i in batch]
            width_t = max(lens)
            ids = torch.full((len(batch), width_t), pad_token_id, dtype=torch.long)
            att = torch.zeros((len(batch), width_t), dtype=torch.long)
            flat = []
            for r, (i, n) in enumerate(zip(batch, lens)):
                ids[r, :n] = ids_all[i]
                att[r, :n] = 1
                flat.append(torch.arange(n) + r * width_t)
            flat_idx = torch.cat(flat)
            if cuda:
                ids, att, flat_idx = (t.pin_memory().to(device, non_blocking=True) for t in (ids, att, flat_idx))
            t0 = time.perf_counter()
            h = forward_taps(model, ids, att, taps)  # [b, t, taps*H]
            rows_h = h.reshape(-1, width).index_select(0, flat_idx)  # padding dropped on the device
            scale = None
            if storage == "fp8":
                rows_h, scale = store.quantize_fp8(rows_h)
            else:
                rows_h = rows_h.to(torch.bfloat16)
            n_rows = rows_h.shape[0]
            buf, sbuf = pool.get()
            if cuda:
                copy_stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(copy_stream):
                    buf[:n_rows].copy_(rows_h, non_blocking=True)
                    if scale is not None:
                        sbuf[:n_rows].copy_(scale, non_blocking=True)
                    rows_h.record_stream(copy_stream)
                    event = torch.cuda.Event()
                    event.record(copy_stream)
            else:
                buf[:n_rows].copy_(rows_h)
                if scale is not None:
                    sbuf[:n_rows].copy_(scale)
                event = None
            stats.compute_seconds += time.perf_counter() - t0
            bg.put((event, list(zip(batch, lens)), buf, sbuf if scale is not None else None, ids_all, masks_all,
                    lambda b=(buf, sbuf): pool.put(b)))
            stats.batches += 1
            stats.samples += len(batch)
            stats.tokens += sum(lens)
            stats.padded_tokens += len(batch) * width_t
        bg.close()
        checksum = writer.close()
    except BaseException:
        writer.abort()
        raise
    stats.seconds = time.perf_counter() - t_start
    return checksum, stats
