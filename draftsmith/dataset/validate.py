"""Validation of extraction shards, and moving a failed one aside.

Every shard is checked on its own (shapes, dtypes, finite values, no all-zero rows, ids and mask equal to the
prepared shard, checksum), and a few random samples are recomputed alone (batch 1, no padding) through a
different code path (`output_hidden_states`, no hooks) and compared within a tolerance. A serving engine that
silently wrote zeros, a hook on the wrong layer or a padding bug all fail here, before a drafter is trained on
them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from draftsmith.dataset.shards import ShardReader, combine_crcs, sample_crc, stored_faults
from draftsmith.target.taps import reference_taps


class ShardInvalid(RuntimeError):
    pass


def default_tolerance(compute_dtype: torch.dtype, storage: str) -> float:
    """Relative error (per sample, Frobenius) allowed between stored and recomputed states."""
    tol = 1e-3 if compute_dtype == torch.float32 else 3e-2  # bf16 kernels differ between batch shapes
    tol += 1e-2 if storage == "bf16" else 8e-2  # storage rounding (fp8 e4m3 keeps 3 mantissa bits)
    return tol


def structural_checks(reader: ShardReader, manifest: dict, prepared: pd.DataFrame) -> list[str]:
    failures: list[str] = []
    n = len(prepared)
    if len(reader) != n:
        return [f"sample count {len(reader)} != prepared shard {n}"]
    if manifest.get("sample_ids") != prepared["id"].tolist():
        failures.append("sample ids differ from the prepared shard")
    if "sample_tokens" in manifest and reader.lengths.tolist() != manifest["sample_tokens"]:
        return ["sample offsets differ from the manifest: the file's index is damaged"]
    width = len(manifest["taps"]) * manifest["hidden_size"]
    if reader.width != width:
        failures.append(f"hidden width {reader.width} != taps x hidden_size = {width}")
    crcs = []
    regenerated = manifest.get("regenerated", False)
    for i in range(n):
        ids, mask = reader.tokens(i)
        want = np.asarray(prepared["input_ids"].iloc[i])
        if regenerated:
            p = int(prepared["prompt_len"].iloc[i])
            if not np.array_equal(ids[:p].numpy(), want[:p]):
                failures.append(
                    f"sample {i} ({prepared['id'].iloc[i]}): prompt ids differ from the prepared shard"
                )
        else:
            if not np.array_equal(ids.numpy(), want):
                failures.append(
                    f"sample {i} ({prepared['id'].iloc[i]}): input ids differ from the prepared shard"
                )
            if not np.array_equal(mask.numpy().astype(np.uint8), np.asarray(prepared["loss_mask"].iloc[i])):
                failures.append(
                    f"sample {i} ({prepared['id'].iloc[i]}): loss mask differs from the prepared shard"
                )
        raw, scale = reader.raw(i)  # read once: checked for values and for the checksum
        nonfinite, zero_rows = stored_faults(raw, scale)
        if nonfinite:
            failures.append(f"sample {i} ({prepared['id'].iloc[i]}): non-finite hidden states")
        if zero_rows:
            failures.append(f"sample {i} ({prepared['id'].iloc[i]}): {zero_rows} all-zero hidden rows")
        crcs.append(sample_crc(raw, scale))
        if len(failures) > 20:
            break
    if not failures and combine_crcs(crcs) != manifest.get("checksum"):
        failures.append("checksum mismatch: the shard file changed after it was written")
    return failures


@torch.inference_mode()
def recompute_checks(
    model, reader: ShardReader, manifest: dict, k: int, tol: float, seed: int
) -> tuple[list[str], list[dict]]:
    device = next(model.parameters()).device
    rng = np.random.default_rng(seed)
    picks = sorted(rng.choice(len(reader), size=min(k, len(reader)), replace=False).tolist())
    failures, rows = [], []
    for i in picks:
        sample = reader.sample(i, torch.float32)
        ref = reference_taps(model, sample.input_ids[None].to(device), manifest["taps"])[0].float().cpu()
        err = float((sample.hidden - ref).norm() / ref.norm().clamp_min(1e-12))
        rows.append({"sample": i, "id": manifest["sample_ids"][i], "rel_error": err, "tolerance": tol})
        if not err <= tol:
            failures.append(
                f"sample {i} ({manifest['sample_ids'][i]}): recomputed states differ, relative error "
                f"{err:.3g} > tolerance {tol:.3g}"
            )
    return failures, rows


def quarantine(shard_path: Path, manifest_path: Path, *, keep_states: bool = True) -> Path:
    """Moves a bad shard aside (kept for inspection) so the next run recomputes just that shard. Under a disk
    budget (`keep_states=False`, training in rounds) the states are deleted and only the manifest is kept: a
    kept copy would take the room the budget handed to its replacement."""
    qdir = shard_path.parent / "quarantine"
    qdir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if not keep_states:
        shard_path.unlink(missing_ok=True)
    for p in (shard_path, manifest_path):
        if p.exists():
            os.replace(p, qdir / f"{p.name}.{stamp}")
    return qdir
