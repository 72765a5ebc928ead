"""Sizes as configs write them (`2TB`, `96GB`, `1.5TiB`) and as people read them."""

from __future__ import annotations

import re

UNITS = {"": 1, "B": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
BINARY_UNITS = {"KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40, "PI": 2**50}
SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGTP]I?)?B?\s*$", re.IGNORECASE)


def parse_size(text: str | int | float, *, key: str = "extract.disk_budget") -> int:
    """Bytes from `2TB`, `500 GB`, `1.5TiB` or a plain number of bytes; decimal units unless `i` is given."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return int(text)
    m = SIZE.match(str(text))
    if not m:
        raise ValueError(f"{key}: {text!r} is not a size; write it as `2TB`, `500GB` or `1.5TiB`")
    unit = (m.group(2) or "").upper()
    scale = BINARY_UNITS[unit] if unit in BINARY_UNITS else UNITS[unit]
    return int(float(m.group(1)) * scale)


def human(n: float) -> str:
    """Bytes as people read them: `5.9 TB`, `812 MB`."""
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"
