"""Hidden-state extraction: one model copy per GPU (or GPU group), one shard per job.

The hot loop keeps the GPU busy: batches are length-sorted and split to a token budget with little padding,
inputs go up from pinned memory, the forward runs the body only and stops after the deepest tap, valid rows
are gathered on the GPU with indices computed on the host (no `nonzero` sync), and the device-to-host copy
runs on its own stream into reusable pinned buffers that a writer thread drains to disk while the next batch
computes.

Nothing in the loop waits for the GPU except back-pressure from the writer (all pinned buffers still
unwritten), which is exactly the storage-limited case: CUDA events bracket each batch's GPU work and are read
only at the end, so the job's log can say how long the GPU sat idle and whether compute or storage set the
pace.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from draftsmith.core.faults import check_oom, pause
from draftsmith.core.io import tmp_path
from draftsmith.dataset.plan import make_batches
from draftsmith.dataset.shards import ShardWriter, quantize_fp8
from draftsmith.target.taps import forward_taps

log = logging.getLogger(__name__)


@dataclass
class ExtractStats:
    """A job's figures. GPU busy time comes from CUDA events around each batch's forward and gather (on the
    CPU: wall time of that work), so idle = wall - busy is time the device waited on the host, the writer or
    the disk."""

    samples: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0
    seconds: float = 0.0
    compute_seconds: float = 0.0  # host time spent issuing the batches' work
    gpu_busy_seconds: float = 0.0
    writer_wait_seconds: float = 0.0  # the loop blocked on the writer (all pinned buffers still unwritten)
    write_seconds: float = 0.0  # the writer thread's time in pwrite (into the page cache, mostly)
    flush_seconds: float = 0.0  # fsync and rename at the end: what the page cache had not yet put on disk
    bytes_written: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def padding_waste(self) -> float:
        return 1.0 - self.tokens / max(self.padded_tokens, 1)

    @property
    def gpu_idle_seconds(self) -> float:
        return max(0.0, self.seconds - self.gpu_busy_seconds)

    @property
    def produce_gb_s(self) -> float:
        """Bytes per second the device produces while it computes: the rate storage has to keep up with."""
        return self.bytes_written / max(self.gpu_busy_seconds, 1e-9) / 1e9

    @property
    def storage_gb_s(self) -> float:
        """Bytes per second the writer sinks when it runs flat out (pwrite plus the final fsync)."""
        return self.bytes_written / max(self.write_seconds + self.flush_seconds, 1e-9) / 1e9

    @property
    def storage_limited(self) -> bool:
        """Storage is slower than compute and the run visibly waited on it (>2% of wall time)."""
        waited = self.writer_wait_seconds + self.flush_seconds
        return self.storage_gb_s < self.produce_gb_s and waited > 0.02 * self.seconds

    def summary(self) -> str:
        return (
            f"{self.tokens} tokens in {self.seconds:.1f}s: {self.tokens_per_s:.0f} tokens/s, padding waste "
            f"{100 * self.padding_waste:.1f}%, device busy {self.gpu_busy_seconds:.1f}s / idle "
            f"{self.gpu_idle_seconds:.1f}s, waited on writer {self.writer_wait_seconds:.1f}s, final flush "
            f"{self.flush_seconds:.1f}s, {self.bytes_written / 1e9:.2f} GB written (produce "
            f"{self.produce_gb_s:.2f} GB/s, storage {self.storage_gb_s:.2f} GB/s)"
        )

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(
            tokens_per_s=self.tokens_per_s,
            padding_waste=self.padding_waste,
            gpu_idle_seconds=self.gpu_idle_seconds,
            produce_gb_s=self.produce_gb_s,
            storage_gb_s=self.storage_gb_s,
            storage_limited=self.storage_limited,
        )
        return d


class _BusyTimer:
    """Device busy time without syncing in the loop: CUDA events per batch, read once at the end."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.cpu_seconds = 0.0
        self._t0 = 0.0

    def start(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.events.append((ev, ev))
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.events[-1] = (self.events[-1][0], ev)
        else:
            self.cpu_seconds += time.perf_counter() - self._t0

    def busy_seconds(self) -> float:
        """Call after the device has finished (the writer has synchronised every batch's copy)."""
        if not self.cuda:
            return self.cpu_seconds
        for _, end in self.events:
            end.synchronize()
        return sum(a.elapsed_time(b) for a, b in self.events) / 1e3


class _Writer:
    """Drains finished batches to the shard file on a thread, so disk time hides behind GPU time.

    Every `sync_bytes` it also flushes the file to disk (fdatasync on the thread): otherwise tens of GB pile
    up in the page cache and the final fsync stalls the job at the end, with the GPU idle, for as long as the
    disk needs to catch up. Flushing as it goes keeps the disk busy in parallel with compute and makes the
    measured storage rate the disk's, not the page cache's.
    """

    def __init__(self, writer: ShardWriter, stats: ExtractStats, depth: int = 4, sync_bytes: int = 1 << 30):
        self.writer, self.stats = writer, stats
        self.sync_bytes, self._unsynced = sync_bytes, 0
        self._sync_fd = os.open(tmp_path(writer.path), os.O_RDONLY)  # fdatasync flushes the file's pages
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
                    self.writer.write_sample(
                        idx, hidden[sl], ids[idx], masks[idx], None if scale is None else scale[sl]
                    )
                    start += n
                self.stats.write_seconds += time.perf_counter() - t0
                nbytes = hidden[:start].numel() * hidden.element_size()
                if scale is not None:
                    nbytes += start * scale.element_size()
                self.stats.bytes_written += nbytes
                self._unsynced += nbytes
                if self._unsynced >= self.sync_bytes:
                    t1 = time.perf_counter()
                    os.fdatasync(self._sync_fd)
                    self.stats.write_seconds += time.perf_counter() - t1
                    self._unsynced = 0
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
        self._close_fd()

    def abandon(self) -> None:
        """After an error in the loop: stop the thread without raising its own error over the first one."""
        if self.thread.is_alive():
            self.q.put(None)
            self.thread.join()
        self._close_fd()

    def _close_fd(self) -> None:
        if self._sync_fd >= 0:
            os.close(self._sync_fd)
            self._sync_fd = -1
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

    def get_timed(self, stats: ExtractStats):
        t0 = time.perf_counter()
        bufs = self.free.get()
        stats.writer_wait_seconds += time.perf_counter() - t0
        return bufs

    def put(self, bufs) -> None:
        self.free.put(bufs)


def _quantize_rows(rows: torch.Tensor, chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 in row chunks: quantising a 64k-token batch at once would need two fp32 copies of it (~13 GB)."""
    q = torch.empty(rows.shape, dtype=torch.float8_e4m3fn, device=rows.device)
    scale = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
    for a in range(0, rows.shape[0], chunk):
        q[a : a + chunk], scale[a : a + chunk] = quantize_fp8(rows[a : a + chunk])
    return q, scale


def _host_batch(
    batch: list[int], lens: list[int], ids_all: list[torch.Tensor], pad_token_id: int, pin: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and the flat indices of the valid positions (no attention mask: see
    extract_samples)."""
    width_t = max(lens)
    ids = torch.full((len(batch), width_t), pad_token_id, dtype=torch.long, pin_memory=pin)
    flat = torch.empty(sum(lens), dtype=torch.long, pin_memory=pin)
    start = 0
    for r, (i, n) in enumerate(zip(batch, lens)):
        ids[r, :n] = ids_all[i]
        torch.arange(r * width_t, r * width_t + n, out=flat[start : start + n])
        start += n
    return ids, flat


def _sample_tensors(samples: pd.DataFrame) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every sample's ids and loss mask as tensors once, so the loop and the writer only index them."""
    ids_all = [torch.as_tensor(np.asarray(x, dtype=np.int64)) for x in samples["input_ids"]]
    masks_all = [torch.as_tensor(np.asarray(x, dtype=np.uint8)) for x in samples["loss_mask"]]
    return ids_all, masks_all


def _batch_progress(batches: list[list[int]], out_path: str | Path, *, progress: bool) -> tqdm:
    """One bar per shard, redrawn at most every 5 s so that a long job's log stays short."""
    return tqdm(
        batches,
        desc=f"extract {Path(out_path).stem}",
        unit="batch",
        disable=not progress,
        mininterval=5.0,
    )


def _start_pipeline(
    writer: ShardWriter,
    stats: ExtractStats,
    *,
    device: torch.device,
    rows_max: int,
    width: int,
    storage: str,
) -> tuple[_PinnedPool, torch.cuda.Stream | None, _BusyTimer, _Writer]:
    """Everything the loop reuses across batches, made once: pinned buffers, copy stream, timer, writer
    thread."""
    cuda = device.type == "cuda"
    buf_dtype = torch.float8_e4m3fn if storage == "fp8" else torch.bfloat16
    pool = _PinnedPool(rows_max, width, buf_dtype, count=3, pin=cuda)
    copy_stream = torch.cuda.Stream(device) if cuda else None
    timer = _BusyTimer(device)
    bg = _Writer(writer, stats)
    return pool, copy_stream, timer, bg


def _copy_to_host(
    rows_h: torch.Tensor,
    scale: torch.Tensor | None,
    *,
    pool: _PinnedPool,
    stats: ExtractStats,
    device: torch.device,
    copy_stream: torch.cuda.Stream | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event | None]:
    """Starts the device-to-host copy into free pinned buffers on the copy stream; the event marks its end."""
    n_rows = rows_h.shape[0]
    buf, sbuf = pool.get_timed(stats)  # blocks only when the writer is behind (the GPU still has this batch)
    if copy_stream is not None:
        copy_stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(copy_stream):
            buf[:n_rows].copy_(rows_h, non_blocking=True)
            if scale is not None:
                sbuf[:n_rows].copy_(scale, non_blocking=True)
            event = torch.cuda.Event()
            event.record(copy_stream)
        rows_h.record_stream(copy_stream)
        if scale is not None:
            scale.record_stream(copy_stream)
    else:
        buf[:n_rows].copy_(rows_h)
        if scale is not None:
            sbuf[:n_rows].copy_(scale)
        event = None
    return buf, sbuf, event


def _finish_shard(bg: _Writer, timer: _BusyTimer, *, writer: ShardWriter, stats: ExtractStats) -> str:
    """Drains the writer, then reads the device time (every copy has synchronised by then) and closes the
    file."""
    bg.close()
    stats.gpu_busy_seconds = timer.busy_seconds()
    t_flush = time.perf_counter()
    checksum = writer.close()
    stats.flush_seconds = time.perf_counter() - t_flush
    return checksum


def _abort_shard(bg: _Writer, writer: ShardWriter) -> None:
    """After a failure: stops the writer thread and drops the half-written file."""
    bg.abandon()
    writer.abort()


def _log_stats(stats: ExtractStats) -> None:
    """The job's figures, and a warning when the disk rather than the device set the pace."""
    log.info("extracted %s", stats.summary())
    if stats.storage_limited:
        log.warning(
            "storage, not compute, limits this job: the device produces %.2f GB/s of hidden states but the "
            "writer sinks %.2f GB/s (waited %.1fs on the writer, %.1fs flushing); use extract.storage: fp8 "
            "(half the bytes), a faster local disk, or fewer jobs per disk",
            stats.produce_gb_s,
            stats.storage_gb_s,
            stats.writer_wait_seconds,
            stats.flush_seconds,
        )


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
    ids_all, masks_all = _sample_tensors(samples)
    writer = ShardWriter(out_path, lengths.tolist(), width, storage)
    stats = ExtractStats()
    cuda = device.type == "cuda"
    rows_max = max(sum(int(lengths[i]) for i in b) for b in batches)
    pool, copy_stream, timer, bg = _start_pipeline(
        writer, stats, device=device, rows_max=rows_max, width=width, storage=storage
    )
    t_start = time.perf_counter()
    try:
        for batch in _batch_progress(batches, out_path, progress=progress):
            lens = [int(lengths[i]) for i in batch]
            check_oom(len(batch) * max(lens))
            ids, flat_idx = _host_batch(batch, lens, ids_all, pad_token_id, pin=cuda)
            # No attention mask, on purpose: with right padding every real token comes before the padding, and
            # a causal LM (attention, Gated DeltaNet recurrence and its causal conv alike) never lets a
            # position see later ones, so the real rows are exact without a mask. Without one, SDPA takes its
            # fused causal kernel and the model skips the mask checks that synchronise with the host. The
            # padded rows come out as garbage and are dropped below; validation recomputes samples alone to
            # hold us to it.
            t0 = time.perf_counter()
            if cuda:
                ids, flat_idx = ids.to(device, non_blocking=True), flat_idx.to(device, non_blocking=True)
            timer.start()
            h = forward_taps(model, ids, None, taps)  # [b, t, taps*H]
            rows_h = h.reshape(-1, width).index_select(0, flat_idx)  # padding dropped on the device
            del h
            scale = None
            if storage == "fp8":
                rows_h, scale = _quantize_rows(rows_h)
            else:
                rows_h = rows_h.to(torch.bfloat16)
            timer.stop()
            buf, sbuf, event = _copy_to_host(
                rows_h, scale, pool=pool, stats=stats, device=device, copy_stream=copy_stream
            )
            stats.compute_seconds += time.perf_counter() - t0
            bg.put(
                (
                    event,
                    list(zip(batch, lens)),
                    buf,
                    sbuf if scale is not None else None,
                    ids_all,
                    masks_all,
                    lambda b=(buf, sbuf): pool.put(b),
                )
            )
            stats.batches += 1
            stats.samples += len(batch)
            stats.tokens += sum(lens)
            stats.padded_tokens += len(batch) * max(lens)
            if stats.batches == 1:
                pause(f"extract:{Path(out_path).stem}")  # a drill: killed here, the file is half written
        checksum = _finish_shard(bg, timer, writer=writer, stats=stats)
    except BaseException:
        _abort_shard(bg, writer)
        raise
    stats.seconds = time.perf_counter() - t_start
    _log_stats(stats)
    return checksum, stats
