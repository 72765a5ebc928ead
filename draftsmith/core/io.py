"""Files written whole or not at all: temporary names renamed when complete, JSON and Parquet helpers."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd


def tmp_path(path: Path) -> Path:
    """The temporary name an output is written under until it is complete."""
    return path.with_name(path.name + ".partial")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def atomic(path: str | Path, *, tmp: Path | None = None) -> Iterator[Path]:
    """Yields the temporary name of `path` (a file or a directory) to write; when the block completes it
    replaces `path`, and when the block fails it is removed. Readers never see half an output. `tmp` names the
    temporary where `tmp_path(path)` is a file of its own (the bench's resumable progress)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp or tmp_path(path)
    _remove(tmp)  # a killed attempt's leftovers
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    os.replace(tmp, path)


def write_text(path: str | Path, text: str, *, tmp: Path | None = None) -> None:
    with atomic(path, tmp=tmp) as t:
        t.write_text(text)


def write_json(path: str | Path, obj: object) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_jsonl(
    path: str | Path, records: list[dict], *, ensure_ascii: bool = True, tmp: Path | None = None
) -> None:
    """One JSON object a line; `ensure_ascii=False` keeps non-ASCII text readable (the demo's data files)."""
    lines = "".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in records)
    write_text(path, lines, tmp=tmp)


def write_parquet(df: pd.DataFrame, path: str | Path) -> None:
    with atomic(path) as tmp:
        df.to_parquet(tmp, index=False)


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """`dst` with `src`'s content, whole or not at all: a hard link where the file system allows, else a
    copy."""
    with atomic(dst) as tmp:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)


def read_json(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def read_samples(path: str | Path) -> pd.DataFrame:
    return pd.read_parquet(path)


DISK_PROBE_BYTES = 128 * 2**20  # enough to pass the page cache's write-back when it is forced with fsync


def disk_write_rate(folder: Path, nbytes: int = DISK_PROBE_BYTES) -> float:
    """GB/s that `folder`'s disk takes, written and flushed to the device (the plan compares it with what the
    extraction jobs produce: a slower disk leaves GPUs waiting)."""
    import time

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".disk_probe"
    block = os.urandom(8 * 2**20)
    t0 = time.perf_counter()
    try:
        with open(path, "wb") as f:
            for _ in range(max(1, nbytes // len(block))):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        return 0.0
    finally:
        path.unlink(missing_ok=True)
    return nbytes / (time.perf_counter() - t0) / 1e9
