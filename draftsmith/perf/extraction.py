"""Extraction throughput on a random-weight target of a real shape: the real extraction path vs the bare
forward.

Everything runs in one process on identical batches (the same `make_batches` split), so the ratio between
paths measures only what extraction adds on top of the model's own compute: host-side batch assembly, hooks,
the device-to-host copy, the writer thread and the disk. A bf16 8192^3 matmul measured in the same run gives
the ceiling that model FLOPs are compared to.

Model FLOPs counted (useful work only, padding excluded):
  - 2 x parameters touched per token, for the decoder layers actually run (0 .. deepest tap); MoE routed
    experts count top_k / num_experts of their weights; no embedding lookup, no final norm, no LM head;
  - full-attention layers: causal QK^T and PV, 4 x heads x head_dim x L(L+1)/2 per sample of length L;
  - Gated DeltaNet layers: 6 x key_dim x value_dim per value head per token (S k, the rank-1 state update, q
    S).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from draftsmith.config import default_taps
from draftsmith.core.gpu_memory import job_memory
from draftsmith.core.runtime import resolve_dtype, sync_device
from draftsmith.dataset.extract import ExtractStats, _host_batch, extract_samples
from draftsmith.dataset.plan import make_batches
from draftsmith.perf.shapes import build_model, load_shape, matmul_ceiling
from draftsmith.target.kernels import report_kernels, use_fla_conv
from draftsmith.target.layers import decoder_layers, layer_types
from draftsmith.target.placement import activation_bytes_per_token
from draftsmith.target.taps import forward_taps


def draw_lengths(spec: str, tokens: int, max_length: int | None, seed: int) -> np.ndarray:
    """Sample lengths: `loguniform:LO:HI` until `tokens` are reached, or those of a prepared shard
    (parquet)."""
    if spec.startswith("loguniform:"):
        lo, hi = (int(x) for x in spec.split(":")[1:3])
        rng = np.random.default_rng(seed)
        out: list[int] = []
        total = 0
        while total < tokens:
            n = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
            out.append(n)
            total += n
        lengths = np.asarray(out, dtype=np.int64)
    else:
        lengths = pd.read_parquet(spec, columns=["num_tokens"])["num_tokens"].to_numpy().astype(np.int64)
        lengths = lengths[: max(1, int(np.searchsorted(np.cumsum(lengths), tokens)) + 1)]
    return np.minimum(lengths, max_length) if max_length else lengths


def random_samples(lengths: np.ndarray, vocab: int, seed: int) -> pd.DataFrame:
    """Samples in the prepared-shard layout with random token ids (the target has random weights anyway)."""
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, vocab, size=int(n)).astype(np.int32) for n in lengths]
    return pd.DataFrame(
        {
            "id": [f"b{i}" for i in range(len(lengths))],
            "input_ids": ids,
            "loss_mask": [np.ones(int(n), dtype=np.uint8) for n in lengths],
            "prompt_len": [0] * len(lengths),
            "num_tokens": lengths.astype(np.int64),
        }
    )


def model_flops(model, lengths: np.ndarray, taps: list[int]) -> float:
    """Useful FLOPs of the body forward up to the deepest tap, at the actual (unpadded) lengths."""
    cfg = model.config.get_text_config()
    run = max(taps) + 1
    layers = decoder_layers(model)[:run]
    experts = getattr(cfg, "num_experts", None) or 0
    top_k = getattr(cfg, "num_experts_per_tok", None) or 0
    params = 0.0
    for name, p in layers.named_parameters():
        share = top_k / experts if experts and ".experts." in f".{name}" else 1.0
        params += p.numel() * share
    tokens = float(lengths.sum())
    total = 2.0 * params * tokens
    types = layer_types(model)[:run]
    n_full = sum(t == "full_attention" for t in types)
    n_linear = sum("linear" in t for t in types)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    pairs = float((lengths.astype(np.float64) * (lengths + 1) / 2).sum())
    total += n_full * 4.0 * heads * head_dim * pairs
    if n_linear:
        total += (
            n_linear
            * 6.0
            * cfg.linear_num_value_heads
            * cfg.linear_key_head_dim
            * cfg.linear_value_head_dim
            * tokens
        )
    return total


def auto_budget(model, taps: list[int], device: torch.device, longest: int, cap: int = 65536) -> int:
    """The workflow's probe rule on the memory left after the weights: a power of two, at most `cap`."""
    if device.type != "cuda":
        return max(longest, 4096)
    cfg = model.config.get_text_config().to_dict()
    per_token = activation_bytes_per_token(cfg, len(taps))
    free, _ = job_memory(device)  # under `gpu_memory` where set
    fit = int(free * 0.8 // per_token)
    return max(longest, min(cap, 2 ** int(math.log2(max(fit, 1)))))


def stage_batches(
    samples: pd.DataFrame, batches: list[list[int]], device: torch.device, pad: int
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Batch inputs placed on the device before timing: the bare path must not pay for any host work."""
    ids_all = [torch.as_tensor(np.asarray(x, dtype=np.int64)) for x in samples["input_ids"]]
    lengths = samples["num_tokens"].to_numpy()
    staged = []
    for b in batches:
        lens = [int(lengths[i]) for i in b]
        ids, _ = _host_batch(b, lens, ids_all, pad, pin=False)
        # the mask only the naive path uses (bare and real extraction run right-padded batches without one)
        att = None
        if min(lens) < max(lens):
            att = (torch.arange(ids.shape[1])[None, :] < torch.tensor(lens)[:, None]).long().to(device)
        staged.append((ids.to(device), att))
    return staged


@torch.inference_mode()
def run_bare(
    model, staged: list[tuple], taps: list[int], device: torch.device, *, layer_kernels: bool = True
) -> float:
    """Body forward up to the deepest tap with the taps gathered, nothing leaves the device; one sync at the
    end. `layer_kernels`: as extraction runs them (off: Transformers' norms and MLPs, for their A/B).

    Like extraction, no attention mask: right padding needs none in a causal model (see extract_samples)."""
    sync_device(device)
    t0 = time.perf_counter()
    for ids, _att in staged:
        forward_taps(model, ids, None, taps, layer_kernels=layer_kernels)
    sync_device(device)
    return time.perf_counter() - t0


@torch.inference_mode()
def run_naive(model, staged: list[tuple], device: torch.device) -> float:
    """What a first attempt does: the full model with logits and every layer's hidden states."""
    sync_device(device)
    t0 = time.perf_counter()
    for ids, att in staged:
        out = model(input_ids=ids, attention_mask=att, use_cache=False, output_hidden_states=True)
        del out
    sync_device(device)
    return time.perf_counter() - t0


def run_extract(
    model, samples: pd.DataFrame, taps: list[int], out_dir: Path, budget: int, storage: str, keep: bool
) -> ExtractStats:
    out = out_dir / "bench_shard.safetensors"
    _, stats = extract_samples(model, samples, taps, out, budget, storage, progress=False)
    if not keep:
        out.unlink(missing_ok=True)
    return stats


def barrier(directory: str | None, world: int, rank: int, name: str, timeout: float = 1800.0) -> None:
    """File barrier between concurrent single-GPU benchmark processes, so their timed phases overlap."""
    if not directory or world <= 1:
        return
    d = Path(directory)
    (d / f"{name}.{rank}").touch()
    t0 = time.time()
    while sum(1 for _ in d.glob(f"{name}.*")) < world:
        if time.time() - t0 > timeout:
            raise TimeoutError(f"barrier {name}: the other benchmark processes never arrived")
        time.sleep(0.05)


def build_target(
    shape: str,
    num_layers: int | None,
    *,
    device: torch.device,
    torch_dtype: torch.dtype,
    seed: int,
    log=print,
) -> tuple[torch.nn.Module, list[int]]:
    """The random-weight target and its taps: the shape's own, unless its depth was changed."""
    fields, shape_taps = load_shape(shape)
    t0 = time.perf_counter()
    model = build_model(fields, num_layers, device, torch_dtype, seed)
    use_fla_conv(model)  # as load_target does for the workflow
    sync_device(device)
    build_s = time.perf_counter() - t0
    cfg = model.config.get_text_config()
    n_layers = cfg.num_hidden_layers
    taps = (
        shape_taps if shape_taps and not num_layers and max(shape_taps) < n_layers else default_taps(n_layers)
    )
    log(
        f"target {shape}: {cfg.model_type}, {n_layers} layers, hidden {cfg.hidden_size}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params, {torch_dtype}, built in "
        f"{build_s:.1f}s"
    )
    log(f"taps {taps}; {report_kernels(model)}")
    return model, taps


def plan_batches(
    model,
    taps: list[int],
    lengths: np.ndarray,
    *,
    device: torch.device,
    token_budget: str | int,
    spec: str,
    log=print,
) -> tuple[int, list[list[int]], int]:
    """The token budget, the batches both paths run and their padded token count."""
    longest = int(lengths.max())
    budget = (
        auto_budget(model, taps, device, longest)
        if token_budget == "auto"
        else max(int(token_budget), longest)
    )
    batches = make_batches(lengths, budget)
    padded = sum(len(b) * int(lengths[b].max()) for b in batches)
    log(
        f"{len(lengths)} samples, {int(lengths.sum())} tokens ({spec}), token budget {budget}, "
        f"{len(batches)} batches, padding waste {100 * (1 - lengths.sum() / padded):.1f}%"
    )
    return budget, batches, padded


def timed_runs(
    model,
    samples: pd.DataFrame,
    *,
    taps: list[int],
    device: torch.device,
    batches: list[list[int]],
    pad: int,
    budget: int,
    padded: int,
    storage: str,
    out_dir: Path,
    keep: bool,
    repeats: int,
    naive_fraction: float,
    naive_budget: int,
    barrier_dir: str | None,
    world: int,
    rank: int,
    log=print,
) -> tuple[list[float], list[ExtractStats], dict]:
    """Seconds of each bare pass and the stats of each extraction, alternating on the same batches (staged on
    the device for them alone), then the naive figures on a subset (none at `naive_fraction` 0)."""
    staged = stage_batches(samples, batches, device, pad)
    forward_taps(model, *staged[0], taps)  # warm-up: kernels, autotuning, allocator at the largest shapes
    forward_taps(model, *staged[-1], taps)
    sync_device(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    bare_s, ext_stats = [], []
    for r in range(repeats):
        barrier(barrier_dir, world, rank, f"bare{r}")
        bare_s.append(run_bare(model, staged, taps, device))
        barrier(barrier_dir, world, rank, f"extract{r}")
        ext_stats.append(run_extract(model, samples, taps, out_dir, budget, storage, keep))
        log(f"repeat {r}: bare {bare_s[-1]:.2f}s, extract {ext_stats[-1].seconds:.2f}s")
    del staged
    if min(ext_stats, key=lambda s: s.seconds).padded_tokens != padded:
        raise RuntimeError("the extraction path batched differently from the bare path: the ratio would lie")
    naive = {}
    if naive_fraction > 0:
        naive = _naive(
            model,
            samples,
            taps=taps,
            device=device,
            fraction=naive_fraction,
            budget=min(naive_budget, budget),
            pad=pad,
        )
    return bare_s, ext_stats, naive


def describe(
    model,
    taps: list[int],
    *,
    shape: str,
    device: torch.device,
    torch_dtype: torch.dtype,
    storage: str,
    lengths: np.ndarray,
    spec: str,
    budget: int,
    batches: list[list[int]],
    padded: int,
) -> dict:
    """What was measured: the device, the target, the sample mix and its batching."""
    cfg = model.config.get_text_config()
    n_tok = float(lengths.sum())
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": shape,
        "model_type": cfg.model_type,
        "num_layers": cfg.num_hidden_layers,
        "layers_run": max(taps) + 1,
        "hidden_size": cfg.hidden_size,
        "taps": taps,
        "dtype": str(torch_dtype).removeprefix("torch."),
        "storage": storage,
        "kernels": report_kernels(model),
        "samples": len(lengths),
        "tokens": int(n_tok),
        "lengths": spec,
        "token_budget": budget,
        "batches": len(batches),
        "padding_waste": 1 - n_tok / padded,
    }


def rates(
    bare_s: list[float], ext_stats: list[ExtractStats], *, flops: float, tokens: float, ceiling: float
) -> dict:
    """Throughput of the fastest bare pass and the fastest extraction, against each other and the ceiling."""
    stats = min(ext_stats, key=lambda s: s.seconds)
    bare = min(bare_s)
    return {
        "model_flops_per_token": flops / tokens,
        "matmul_ceiling_tflops": ceiling / 1e12,
        "bare_tokens_per_s": tokens / bare,
        "extract_tokens_per_s": stats.tokens_per_s,
        "extract_over_bare": bare / stats.seconds,
        "bare_fraction_of_ceiling": flops / bare / ceiling,
        "extract_fraction_of_ceiling": flops / stats.seconds / ceiling,
        "gpu_busy_s": stats.gpu_busy_seconds,
        "gpu_idle_s": stats.gpu_idle_seconds,
        "gpu_idle_fraction": stats.gpu_idle_seconds / max(stats.seconds, 1e-9),
        "writer_wait_s": stats.writer_wait_seconds,
        "flush_s": stats.flush_seconds,
        "bytes_per_token": stats.bytes_written / tokens,
        "written_gb_per_s": stats.bytes_written / stats.seconds / 1e9,
        "produce_gb_per_s": stats.produce_gb_s,
        "storage_gb_per_s": stats.storage_gb_s,
        "storage_limited": stats.storage_limited,
        "bare_s_all": bare_s,
        "extract_s_all": [s.seconds for s in ext_stats],
        "extract_stats": stats.as_dict(),
    }


def bench(
    shape: str,
    num_layers: int | None = None,
    *,
    tokens: int = 400_000,
    lengths_spec: str = "loguniform:64:8192",
    token_budget: str | int = "auto",
    storage: str = "bf16",
    out_dir: str = "/tmp/draftsmith-bench",
    dtype: str = "auto",
    repeats: int = 1,
    naive_fraction: float = 0.1,
    naive_budget: int = 16384,
    max_length: int | None = None,
    keep: bool = False,
    seed: int = 0,
    barrier_dir: str | None = None,
    world: int = 1,
    rank: int = 0,
    log=print,
) -> dict:
    """Builds the target, measures the ceiling, then bare / extract (and naive on a subset) on identical
    batches."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = resolve_dtype(dtype, device)
    model, taps = build_target(shape, num_layers, device=device, torch_dtype=torch_dtype, seed=seed, log=log)
    cfg = model.config.get_text_config()
    lengths = draw_lengths(lengths_spec, tokens, max_length, seed)
    samples = random_samples(lengths, cfg.vocab_size, seed + 1)
    budget, batches, padded = plan_batches(
        model, taps, lengths, device=device, token_budget=token_budget, spec=lengths_spec, log=log
    )
    ceiling = matmul_ceiling(device)
    flops = model_flops(model, lengths, taps)
    bare_s, ext_stats, naive = timed_runs(
        model,
        samples,
        taps=taps,
        device=device,
        batches=batches,
        pad=cfg.pad_token_id if getattr(cfg, "pad_token_id", None) is not None else 0,
        budget=budget,
        padded=padded,
        storage=storage,
        out_dir=Path(out_dir) / f"rank{rank}",
        keep=keep,
        repeats=repeats,
        naive_fraction=naive_fraction,
        naive_budget=naive_budget,
        barrier_dir=barrier_dir,
        world=world,
        rank=rank,
        log=log,
    )
    result: dict = {
        **describe(
            model,
            taps,
            shape=shape,
            device=device,
            torch_dtype=torch_dtype,
            storage=storage,
            lengths=lengths,
            spec=lengths_spec,
            budget=budget,
            batches=batches,
            padded=padded,
        ),
        **rates(bare_s, ext_stats, flops=flops, tokens=float(lengths.sum()), ceiling=ceiling),
        **naive,
    }
    if device.type == "cuda":
        result["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def _naive(
    model,
    samples: pd.DataFrame,
    *,
    taps: list[int],
    device: torch.device,
    fraction: float,
    budget: int,
    pad: int,
) -> dict:
    """Naive `model(..., output_hidden_states=True)` vs bare on the same subset (a smaller budget: the logits
    of a large vocabulary would not fit at the full one)."""
    k = max(1, int(len(samples) * fraction))
    sub = samples.iloc[np.random.default_rng(0).permutation(len(samples))[:k]].reset_index(drop=True)
    lens = sub["num_tokens"].to_numpy()
    staged = stage_batches(sub, make_batches(lens, max(budget, int(lens.max()))), device, pad)
    n_tok = float(lens.sum())
    out: dict[str, Any] = {"naive_tokens": int(n_tok), "naive_budget": budget}
    try:
        run_naive(model, staged[:1], device)  # warm-up
        naive_s = run_naive(model, staged, device)
        bare_s = run_bare(model, staged, taps, device)
    except torch.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        return {**out, "naive_error": f"out of memory: {str(e).splitlines()[0]}"}
    out.update(
        naive_tokens_per_s=n_tok / naive_s,
        naive_bare_tokens_per_s=n_tok / bare_s,
        naive_over_bare=bare_s / naive_s,
    )
    return out
