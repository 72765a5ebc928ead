"""Downloading a data or prompt file named by URL, once, into the results folder.

A run that names public sets by URL (GSM8K, GPTeacher) needs the network only in this job; every later job
reads the local copy, and the copy's SHA-256 goes to the log so a user can pin what they trained on."""

from __future__ import annotations

import hashlib
import urllib.request
from pathlib import Path

from draftsmith.core.io import atomic

CHUNK = 1 << 20
TIMEOUT_S = 60


def fetched_name(url: str) -> str:
    """The local file name of a URL: a short hash of the whole URL (two sets may share a basename) and the
    basename, whose suffix tells the readers the format."""
    base = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "data"
    return f"{hashlib.sha256(url.encode()).hexdigest()[:8]}-{base}"


def download(url: str, out: str | Path) -> str:
    """Streams `url` to `out` (renamed into place when complete); returns its SHA-256. Raises OSError with the
    URL and what to do when the file cannot be had (offline machine, moved file)."""
    digest = hashlib.sha256()
    try:
        with atomic(out) as tmp, urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp, open(tmp, "wb") as f:
            while chunk := resp.read(CHUNK):
                digest.update(chunk)
                f.write(chunk)
    except OSError as e:
        raise OSError(
            f"cannot download {url} ({e}); on a machine without network access, download it elsewhere and "
            f"put it at {out}, or point the config at a local copy"
        ) from None
    return digest.hexdigest()
