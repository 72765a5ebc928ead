"""Shard store: hidden states on disk.

One extraction shard is one safetensors file plus a JSON manifest beside it. The file is laid out up front
(the token count of a shard is known before extraction starts), so batches land in place as they finish, in
any order, from a writer thread: memory stays flat and disk writes overlap GPU work. The file is written under
a temporary name and renamed when complete, so a killed job never leaves a file that looks finished.

Tensors in a shard file:
  hidden        [T, taps*H]  bf16, or float8 e4m3 with `hidden_scale` [T] fp32 (one scale per row)
  input_ids     [T]          int32
  loss_mask     [T]          uint8 (1 = assistant token, trained on)
  offsets       [n+1]        int64 (sample i is rows offsets[i]:offsets[i+1])

A merged dataset is a manifest that indexes shard files; training reads them memory-mapped.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from draftsmith.config import content_hash
from draftsmith.core.io import tmp_path
from draftsmith.dataset.shard_sizes import STORAGE_DTYPES

SHARD_FORMAT = "draftsmith-shard-v1"  # the format tag of a shard file and its manifest
FP8_MAX = 448.0  # largest finite float8 e4m3fn value

_ST_DTYPE = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.uint8: "U8",
}


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row float8 e4m3: rows keep their own scale, so one outlier token does not flatten the others."""
    amax = x.float().abs().amax(dim=-1).clamp_min(1e-12)
    scale = amax / FP8_MAX
    q = (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.float()


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return (q.float() * scale.float()[:, None]).to(dtype)


def raw_bytes(t: torch.Tensor) -> memoryview | bytes:
    """The bytes of a CPU tensor without copying them (pwrite and crc32 then run without the GIL)."""
    arr = t.contiguous().view(torch.uint8).numpy() if t.dtype != torch.uint8 else t.contiguous().numpy()
    return arr.data.cast("B") if arr.size else b""


def sample_crc(hidden: torch.Tensor, scale: torch.Tensor | None) -> int:
    """CRC32 of one sample's stored hidden bytes (and fp8 scales): what the writer records and validation
    checks."""
    crc = zlib.crc32(raw_bytes(hidden))
    return crc if scale is None else zlib.crc32(raw_bytes(scale.to(torch.float32)), crc)


def decode(
    hidden: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Stored rows -> states: fp8 rows are dequantized with their scales, bf16 rows just cast."""
    return dequantize_fp8(hidden, scale, dtype) if scale is not None else hidden.to(dtype)


# float8 e4m3fn's 128 magnitudes by their low 7 bits, in fp32 (0x7F is NaN, and the largest code): a row's
# largest byte gives its largest value, since the decode's rounding keeps the order
_FP8_MAGNITUDES = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
_BF16_EXPONENT, _BF16_MAGNITUDE = 0x7F80, 0x7FFF  # bfloat16: an all-ones exponent is inf or NaN


def stored_faults(hidden: torch.Tensor, scale: torch.Tensor | None) -> tuple[bool, int]:
    """(any non-finite value, rows of all zeros) of one sample's states, read from the stored bits.

    The same answer as decoding to fp32 and testing the values, without the decode: validation reads every
    byte of every shard, and the decode was most of a validation job's time. An fp8 row's decoded values are
    its magnitudes times its scale, so the row's largest magnitude times the scale is non-finite exactly when
    one of them is, and zero exactly when all of them are."""
    if scale is not None:
        x = hidden.contiguous().view(torch.uint8).numpy() & 0x7F  # [t, width] magnitude codes
        with np.errstate(over="ignore", invalid="ignore"):
            top = _FP8_MAGNITUDES[x.max(axis=1, initial=0)] * scale.to(torch.float32).numpy()  # [t]
        return not bool(np.isfinite(top).all()), int((top == 0).sum())
    u = hidden.contiguous().view(torch.int16).numpy()  # [t, width], bf16 bits
    nonfinite = bool(((u & _BF16_EXPONENT) == _BF16_EXPONENT).any())
    return nonfinite, int(((u & _BF16_MAGNITUDE).max(axis=1, initial=0) == 0).sum())


def reserve(fd: int, size: int, path: Path) -> None:
    """Allocates the whole file now, so a disk that cannot hold it fails here, before any GPU work, and jobs
    that start together cannot all count the same free space (a sparse file would fail mid-write)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate there: a sparse file as before
            os.close(fd)
            path.unlink(missing_ok=True)
            raise OSError(
                e.errno, f"cannot reserve {size} bytes for {path} ({e.strerror}): the disk is full"
            ) from None
        os.ftruncate(fd, size)


class ShardWriter:
    """Writes one shard file in place: header first, then samples at their final offsets (any order)."""

    def __init__(self, path: str | Path, lengths: list[int], width: int, storage: str = "bf16"):
        if storage not in STORAGE_DTYPES:
            raise ValueError(f"storage must be one of {STORAGE_DTYPES}, got {storage!r}")
        self.path = Path(path)
        self.lengths = [int(n) for n in lengths]
        self.width = int(width)
        self.storage = storage
        self.offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        total = int(self.offsets[-1])
        hidden_dtype = torch.float8_e4m3fn if storage == "fp8" else torch.bfloat16
        specs: list[tuple[str, torch.dtype, list[int]]] = [("hidden", hidden_dtype, [total, self.width])]
        if storage == "fp8":
            specs.append(("hidden_scale", torch.float32, [total]))
        specs += [
            ("input_ids", torch.int32, [total]),
            ("loss_mask", torch.uint8, [total]),
            ("offsets", torch.int64, [len(self.lengths) + 1]),
        ]
        header: dict[str, object] = {}
        self._where: dict[str, tuple[int, torch.dtype, int]] = {}  # name -> (start, dtype, row bytes)
        pos = 0
        for name, dtype, shape in specs:
            nbytes = int(np.prod(shape)) * _itemsize(dtype)
            header[name] = {"dtype": _ST_DTYPE[dtype], "shape": shape, "data_offsets": [pos, pos + nbytes]}
            row = _itemsize(dtype) * (shape[1] if len(shape) == 2 else 1)
            self._where[name] = (pos, dtype, row)
            pos = pos + nbytes
        header["__metadata__"] = {"format": SHARD_FORMAT, "storage": storage}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
        self._data_start = 8 + len(raw)
        self._tmp = tmp_path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self._tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(self._fd, struct.pack("<Q", len(raw)) + raw, 0)
        reserve(self._fd, self._data_start + pos, self._tmp)
        self._put("offsets", 0, self.offsets.tobytes())
        self.crc = [0] * len(self.lengths)
        self.written = [False] * len(self.lengths)

    def _put(self, name: str, row: int, data) -> None:
        start, _, row_bytes = self._where[name]
        view = memoryview(data).cast("B") if len(data) else memoryview(b"")
        pos = self._data_start + start + row * row_bytes
        while len(view):  # pwrite may write less than asked (about 2 GB at most per call on Linux)
            n = os.pwrite(self._fd, view, pos)
            view, pos = view[n:], pos + n

    def write_sample(
        self,
        index: int,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        scale: torch.Tensor | None = None,
    ) -> None:
        """Store sample `index`; hidden is [t, width] on the CPU (bf16, or fp8 with its per-row scale)."""
        n = self.lengths[index]
        if tuple(hidden.shape) != (n, self.width):
            raise ValueError(f"sample {index}: hidden {tuple(hidden.shape)} != ({n}, {self.width})")
        row = int(self.offsets[index])
        # a view, not a copy: pwrite and crc32 release the GIL on buffers, so the thread that launches the GPU
        # work keeps running while gigabytes are written (a `bytes` copy would hold the GIL for the whole
        # memcpy)
        self._put("hidden", row, raw_bytes(hidden))
        if self.storage == "fp8":
            assert scale is not None, "fp8 storage needs the per-row scales"
            self._put("hidden_scale", row, raw_bytes(scale.to(torch.float32)))
        else:
            scale = None
        self._put("input_ids", row, input_ids.to(torch.int32).numpy().tobytes())
        self._put("loss_mask", row, loss_mask.to(torch.uint8).numpy().tobytes())
        self.crc[index] = sample_crc(hidden, scale)
        self.written[index] = True

    def close(self) -> str:
        """Flush, check every sample arrived, rename into place; returns the shard checksum."""
        missing = [i for i, ok in enumerate(self.written) if not ok]
        if missing:
            os.close(self._fd)
            raise RuntimeError(f"{self.path}: {len(missing)} samples never written (first: {missing[:5]})")
        os.fsync(self._fd)
        os.close(self._fd)
        os.replace(self._tmp, self.path)
        return combine_crcs(self.crc)

    def abort(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._tmp.unlink(missing_ok=True)


def combine_crcs(crcs: list[int]) -> str:
    return hashlib.sha256(np.asarray(crcs, dtype=np.uint32).tobytes()).hexdigest()


@dataclass
class Sample:
    hidden: torch.Tensor  # [t, taps*H] states, or the stored fp8 rows when `scale` is given
    input_ids: torch.Tensor  # [t] int64
    loss_mask: torch.Tensor  # [t] bool
    scale: torch.Tensor | None = None  # [t] fp32 per-row fp8 scale: `hidden` is still to be decoded


class ShardReader:
    """Memory-mapped view of one shard file: samples are read on demand, never the whole file."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self.path = Path(path)
        self._f = safe_open(str(self.path), framework="pt")
        meta = self._f.metadata() or {}
        self.storage = meta.get("storage", "bf16")
        self.offsets = self._f.get_tensor("offsets").numpy()
        self.lengths = np.diff(self.offsets)
        self.width = int(self._f.get_slice("hidden").get_shape()[1])

    def __len__(self) -> int:
        return len(self.lengths)

    def raw(self, i: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        hidden = self._f.get_slice("hidden")[a:b]
        scale = self._f.get_slice("hidden_scale")[a:b] if self.storage == "fp8" else None
        return hidden, scale

    def hidden(self, i: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return decode(*self.raw(i), dtype)

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        ids = self._f.get_slice("input_ids")[a:b].long()
        mask = self._f.get_slice("loss_mask")[a:b].bool()
        return ids, mask

    def sample(self, i: int, dtype: torch.dtype = torch.bfloat16) -> Sample:
        ids, mask = self.tokens(i)
        return Sample(self.hidden(i, dtype), ids, mask)

    def stored_sample(self, i: int) -> Sample:
        """The sample as stored (fp8 rows and their scales, or bf16 rows): training decodes it on its
        device, where the arithmetic is the same and no longer waits on the job's few host threads."""
        ids, mask = self.tokens(i)
        hidden, scale = self.raw(i)
        return Sample(hidden, ids, mask, scale)

    def crc(self, i: int) -> int:
        return sample_crc(*self.raw(i))


def shard_manifest(
    out: Path,
    samples: pd.DataFrame,
    *,
    model,
    model_path: str,
    target: dict,
    data: dict,
    taps: list[int],
    storage: str,
    checksum: str,
    stats: dict,
    regen_stats: Any,
    kernels: str,
    answers: dict | None = None,
) -> dict:
    """What the validate, merge and train jobs read about a shard: its identity (config hash, target, taps),
    its samples and checksum, and how it was made."""
    cfg = model.config.get_text_config()
    regenerated = bool(data["regenerate"]["enabled"])
    return {
        "format": SHARD_FORMAT,
        "file": out.name,
        "shard": out.stem,
        "config_hash": content_hash(target, data, taps, storage),
        "model": target["model"],
        "revision": target["revision"],
        "model_path": str(model_path),
        "taps": taps,
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_hidden_layers,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "storage": storage,
        "regenerated": regenerated,
        "regeneration": None if regen_stats is None else asdict(regen_stats),
        "regeneration_reused": regenerated and regen_stats is None,  # answers from extract/regen/
        "answers": answers,  # their statistics (draftsmith.dataset.answers), None when not regenerated
        "kernels": kernels,
        "num_samples": len(samples),
        "num_tokens": int(samples["num_tokens"].sum()),
        "loss_tokens": int(sum(int(np.sum(m)) for m in samples["loss_mask"])),
        "sample_ids": samples["id"].tolist(),
        "sample_tokens": samples["num_tokens"].astype(int).tolist(),
        "checksum": checksum,
        "stats": stats,
    }
