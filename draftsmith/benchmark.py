"""Extraction throughput on a random-weight target of a real shape: the real extraction path vs the bare forward.

Everything runs in one process on identical batches (the same `make_batches` split), so the ratio between paths
measures only what extraction adds on top of the model's own compute: host-side batch assembly, hooks, the
device-to-host copy, the writer thread and the disk. A bf16 8192^3 matmul measured in the same run gives the
ceiling that model FLOPs are compared to.

Model FLOPs counted (useful work only, padding excluded):
  - 2 x parameters touched per token, for the decoder layers actually run (0 .. deepest tap); MoE routed experts
    count top_k / num_experts of their weights; no embedding lookup, no final norm, no LM head;
  - full-attention layers: causal QK^T and PV, 4 x heads x head_dim x L(L+1)/2 per sample of length L;
  - Gated DeltaNet layers: 6 x key_dim x value_dim per value head per token (S k, the rank-1 state update, q S).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import extract, probe
from .taps import body, default_taps, forward_taps, layer_types
from .train import matmul_ceiling, sync_device

SHAPES_DIR = Path(__file__).resolve().parent.parent / "configs" / "shapes"
NON_CONFIG_KEYS = ("dflash", "note")
# Tiny shapes of both families for CPU smoke runs and tests (the real presets live in configs/shapes/).
TINY_SHAPES = {
    "tiny-hybrid": {"model_type": "qwen3_5_text", "hidden_size": 128, "intermediate_size": 256,
                    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
                    "linear_value_head_dim": 32, "full_attention_interval": 4, "vocab_size": 1024},
    "tiny-attention": {"model_type": "qwen3", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 8,
                       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1024},
}


# ------------------------------------------------------------------------------------------ model and data


def load_shape(spec: str) -> tuple[dict, list[int] | None]:
    """Config fields of a target and its DFlash taps when known: a shape JSON, a preset name, or a model dir."""
    if spec in TINY_SHAPES:
        return dict(TINY_SHAPES[spec]), None
    path = Path(spec)
    if not path.exists() and (SHAPES_DIR / f"{spec}.json").exists():
        path = SHAPES_DIR / f"{spec}.json"
    if path.is_dir():
        path = path / "config.json"
    raw = json.loads(path.read_text())
    if "text_config" in raw:  # a multimodal checkpoint: the text model is what we extract from
        outer = raw.get("model_type", "")
        raw = {"model_type": outer + "_text", **raw["text_config"]}
    taps = (raw.get("dflash") or {}).get("target_layer_ids")
    fields = {k: v for k, v in raw.items() if k not in NON_CONFIG_KEYS}
    return fields, taps


def build_model(fields: dict, num_layers: int | None, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Random weights of the real shape, allocated and initialised directly on the device in `dtype`.

    Building under a device context keeps a 27B model off the host (no fp32 CPU copy); the model's own init
    (normal 0.02 for linears, Gated DeltaNet decay/bias ranges, (1 + w) norms at zero) keeps activations realistic.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(fields)
    model_type = fields.pop("model_type")
    if num_layers:
        fields["num_hidden_layers"] = num_layers
        fields.pop("layer_types", None)  # rebuilt from full_attention_interval for the new depth
    cfg = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    extract.kernels_follow_device(model)
    return model.eval()


def draw_lengths(spec: str, tokens: int, max_length: int | None, seed: int) -> np.ndarray:
    """Sample lengths: `loguniform:LO:HI` until `tokens` are reached, or those of a prepared shard (parquet)."""
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
    return pd.DataFrame({
        "id": [f"b{i}" for i in range(len(lengths))],
        "input_ids": ids,
        "loss_mask": [np.ones(int(n), dtype=np.uint8) for n in lengths],
        "prompt_len": [0] * len(lengths),
        "num_tokens": lengths.astype(np.int64),
    })


# ------------------------------------------------------------------------------------------ FLOPs and budget


def model_flops(model, lengths: np.ndarray, taps: list[int]) -> float:
    """Useful FLOPs of the body forward up to the deepest tap, at the actual (unpadded) lengths."""
    cfg = model.config.get_text_config()
    run = max(taps) + 1
    layers = body(model).layers[:run]
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
        total += n_linear * 6.0 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * tokens
    return total


def auto_budget(model, taps: list[int], device: torch.device, longest: int, cap: int = 65536) -> int:
    """The workflow's probe rule on the memory left after the weights: a power of two, at most `cap`."""
    if device.type != "cuda":
        return max(longest, 4096)
    cfg = model.config.get_text_config().to_dict()
    per_token = probe.activation_bytes_per_token(cfg, len(taps))
    free, _ = torch.cuda.mem_get_info(device)
    fit = int(free * 0.8 // per_token)
    return max(longest, min(cap, 2 ** int(math.log2(max(fit, 1)))))


# ------------------------------------------------------------------------------------------ the paths



def stage_batches(samples: pd.DataFrame, batches: list[list[int]], device: torch.device, pad: int) -> list[tuple]:
    """Batch inputs placed on the device before timing: the bare path must not pay for any host work."""
    ids_all = [torch.as_tensor(np.asarray(x, dtype=np.int64)) for x in samples["input_ids"]]
    lengths = samples["num_tokens"].to_numpy()
    staged = []
    for b in batches:
        lens = [int(lengths[i]) for i in b]
        ids, _ = extract._host_batch(b, lens, ids_all, pad, pin=False)
        # the mask only the naive path uses (bare and real extraction run right-padded batches without one)
        att = None
        if min(lens) < max(lens):
            att = (torch.arange(ids.shape[1])[None, :] < torch.tensor(lens)[:, None]).long().to(device)
        staged.append((ids.to(device), att))
    return staged


@torch.inference_mode()
def run_bare(model, staged: list[tuple], taps: list[int], device: torch.device) -> float:
    """Body forward up to the deepest tap with the taps gathered, nothing leaves the device; one sync at the end.

    Like extraction, no attention mask: right padding needs none in a causal model (see extract_samples)."""
    sync_device(device)
    t0 = time.perf_counter()
    for ids, _att in staged:
        forward_taps(model, ids, None, taps)
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


def run_extract(model, samples: pd.DataFrame, taps: list[int], out_dir: Path, budget: int, storage: str,
                keep: bool) -> extract.ExtractStats:
    out = out_dir / "bench_shard.safetensors"
    _, stats = extract.extract_samples(model, samples, taps, out, budget, storage, progress=False)
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


# ------------------------------------------------------------------------------------------ the benchmark


def bench(shape: str, num_layers: int | None = None, tokens: int = 400_000, lengths_spec: str = "loguniform:64:8192",
          token_budget: str | int = "auto", storage: str = "bf16", out_dir: str = "/tmp/draftsmith-bench",
          dtype: str = "auto", repeats: int = 1, naive_fraction: float = 0.1, naive_budget: int = 16384,
          max_length: int | None = None, keep: bool = False, seed: int = 0, barrier_dir: str | None = None,
          world: int = 1, rank: int = 0, log=print) -> dict:
    """Builds the target, measures the ceiling, then bare / extract (and naive on a subset) on identical batches."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = extract.resolve_dtype(dtype, device)
    fields, shape_taps = load_shape(shape)
    t0 = time.perf_counter()
    model = build_model(fields, num_layers, device, torch_dtype, seed)
    extract.use_fla_conv(model)  # as load_target does for the workflow
    sync_device(device)
    build_s = time.perf_counter() - t0
    cfg = model.config.get_text_config()
    n_layers = cfg.num_hidden_layers
    taps = shape_taps if shape_taps and not num_layers and max(shape_taps) < n_layers else default_taps(n_layers)
    log(f"target {shape}: {cfg.model_type}, {n_layers} layers, hidden {cfg.hidden_size}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params, {torch_dtype}, built in {build_s:.1f}s")
    log(f"taps {taps}; {extract.report_kernels(model)}")

    lengths = draw_lengths(lengths_spec, tokens, max_length, seed)
    samples = random_samples(lengths, cfg.vocab_size, seed + 1)
    longest = int(lengths.max())
    budget = auto_budget(model, taps, device, longest) if token_budget == "auto" else max(int(token_budget), longest)
    batches = extract.make_batches(lengths, budget)
    padded = sum(len(b) * int(lengths[b].max()) for b in batches)
    log(f"{len(lengths)} samples, {int(lengths.sum())} tokens ({lengths_spec}), token budget {budget}, "
        f"{len(batches)} batches, padding waste {100 * (1 - lengths.sum() / padded):.1f}%")

    ceiling = matmul_ceiling(device)
    flops = model_flops(model, lengths, taps)
    pad = cfg.pad_token_id if getattr(cfg, "pad_token_id", None) is not None else 0
    staged = stage_batches(samples, batches, device, pad)
    forward_taps(model, *staged[0], taps)  # warm-up: kernels, autotuning, allocator at the largest shapes
    forward_taps(model, *staged[-1], taps)
    sync_device(device)

    out_path = Path(out_dir) / f"rank{rank}"
    out_path.mkdir(parents=True, exist_ok=True)
    bare_s, ext_stats = [], []
    for r in range(repeats):
        barrier(barrier_dir, world, rank, f"bare{r}")
        bare_s.append(run_bare(model, staged, taps, device))
        barrier(barrier_dir, world, rank, f"extract{r}")
        ext_stats.append(run_extract(model, samples, taps, out_path, budget, storage, keep))
        log(f"repeat {r}: bare {bare_s[-1]:.2f}s, extract {ext_stats[-1].seconds:.2f}s")
    del staged
    stats = min(ext_stats, key=lambda s: s.seconds)
    if stats.padded_tokens != padded:
        raise RuntimeError("the extraction path batched differently from the bare path: the ratio would lie")
    bare = min(bare_s)
    n_tok = float(lengths.sum())

    result: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": shape, "model_type": cfg.model_type, "num_layers": n_layers, "layers_run": max(taps) + 1,
        "hidden_size": cfg.hidden_size, "taps": taps, "dtype": str(torch_dtype).removeprefix("torch."),
        "storage": storage, "kernels": extract.report_kernels(model), "samples": len(lengths), "tokens": int(n_tok),
        "lengths": lengths_spec, "token_budget": budget, "batches": len(batches),
        "padding_waste": 1 - n_tok / padded,
        "model_flops_per_token": flops / n_tok,
        "matmul_ceiling_tflops": ceiling / 1e12,
        "bare_tokens_per_s": n_tok / bare,
        "extract_tokens_per_s": stats.tokens_per_s,
        "extract_over_bare": bare / stats.seconds,
        "bare_fraction_of_ceiling": flops / bare / ceiling,
        "extract_fraction_of_ceiling": flops / stats.seconds / ceiling,
        "gpu_busy_s": stats.gpu_busy_seconds,
        "gpu_idle_s": stats.gpu_idle_seconds,
        "gpu_idle_fraction": stats.gpu_idle_seconds / max(stats.seconds, 1e-9),
        "writer_wait_s": stats.writer_wait_seconds,
        "flush_s": stats.flush_seconds,
        "bytes_per_token": stats.bytes_written / n_tok,
        "written_gb_per_s": stats.bytes_written / stats.seconds / 1e9,
        "produce_gb_per_s": stats.produce_gb_s,
        "storage_gb_per_s": stats.storage_gb_s,
        "storage_limited": stats.storage_limited,
        "bare_s_all": bare_s,
        "extract_s_all": [s.seconds for s in ext_stats],
        "extract_stats": stats.as_dict(),
    }
    if naive_fraction > 0:
        result.update(_naive(model, samples, taps, device, naive_fraction, min(naive_budget, budget), pad, flops / n_tok,
                             ceiling))
    if device.type == "cuda":
        result["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def _naive(model, samples: pd.DataFrame, taps: list[int], device: torch.device, fraction: float, budget: int,
           pad: int, flops_per_token: float, ceiling: float) -> dict:
    """Naive `model(..., output_hidden_states=True)` vs bare on the same subset (a smaller budget: the logits of a
    large vocabulary would not fit at the full one). FLOPs are those of the extraction forward, for comparison."""
    k = max(1, int(len(samples) * fraction))
    sub = samples.iloc[np.random.default_rng(0).permutation(len(samples))[:k]].reset_index(drop=True)
    lens = sub["num_tokens"].to_numpy()
    staged = stage_batches(sub, extract.make_batches(lens, max(budget, int(lens.max()))), device, pad)
    n_tok = float(lens.sum())
    out = {"naive_tokens": int(n_tok), "naive_budget": budget}
    try:
        run_naive(model, staged[:1], device)  # warm-up
        naive_s = run_naive(model, staged, device)
        bare_s = run_bare(model, staged, taps, device)
    except torch.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        return {**out, "naive_error": f"out of memory: {str(e).splitlines()[0]}"}
    out.update(naive_tokens_per_s=n_tok / naive_s, naive_bare_tokens_per_s=n_tok / bare_s,
               naive_over_bare=bare_s / naive_s)
    return out


def table(r: dict) -> str:
    """The printed summary: one line per figure, with what it means."""
    rows = [
        ("device", r["device"], ""),
        ("target", f"{r['model_type']} {r['layers_run']}/{r['num_layers']} layers run, hidden {r['hidden_size']}, "
                   f"{r['dtype']}, storage {r['storage']}", r["kernels"]),
        ("tokens / samples / batches", f"{r['tokens']} / {r['samples']} / {r['batches']}",
         f"{r['lengths']}, token budget {r['token_budget']}"),
        ("padding waste", f"{100 * r['padding_waste']:.1f}%", "padded tokens computed for nothing"),
        ("matmul ceiling", f"{r['matmul_ceiling_tflops']:.1f} TFLOP/s", "bf16 8192^3 (fp32 1024^3 on CPU), same run"),
        ("model FLOPs / token", f"{r['model_flops_per_token'] / 1e9:.2f} GFLOP", "useful: layers run, real lengths"),
        ("(a) bare forward", f"{r['bare_tokens_per_s']:.0f} tok/s",
         f"{r['bare_fraction_of_ceiling']:.2f} of ceiling"),
        ("(b) extraction", f"{r['extract_tokens_per_s']:.0f} tok/s",
         f"{r['extract_fraction_of_ceiling']:.2f} of ceiling"),
        ("(b)/(a)", f"{r['extract_over_bare']:.3f}", "end-to-end extraction over bare forward, same batches"),
        ("device idle", f"{r['gpu_idle_s']:.2f}s of {r['extract_stats']['seconds']:.2f}s "
                        f"({100 * r['gpu_idle_fraction']:.1f}%)", "waiting on host, writer or disk"),
        ("waited on writer / flush", f"{r['writer_wait_s']:.2f}s / {r['flush_s']:.2f}s", ""),
        ("written", f"{r['written_gb_per_s']:.3f} GB/s", f"{r['bytes_per_token'] / 1e3:.1f} KB/token"),
        ("produce vs storage", f"{r['produce_gb_per_s']:.3f} vs {r['storage_gb_per_s']:.3f} GB/s",
         "STORAGE-LIMITED" if r["storage_limited"] else "compute-limited"),
    ]
    if "naive_tokens_per_s" in r:
        rows.append(("(c) naive output_hidden_states", f"{r['naive_tokens_per_s']:.0f} tok/s",
                     f"{r['naive_over_bare']:.3f} of bare on the same {r['naive_tokens']}-token subset "
                     f"(bare there {r['naive_bare_tokens_per_s']:.0f} tok/s)"))
    elif "naive_error" in r:
        rows.append(("(c) naive output_hidden_states", "failed", r["naive_error"]))
    w = max(len(a) for a, _, _ in rows)
    v = max(len(b) for _, b, _ in rows)
    return "\n".join(f"{a:<{w}}  {b:<{v}}  {c}".rstrip() for a, b, c in rows)


def strip_flags(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """Command-line arguments without the given `--flag value` pairs (the multi-GPU launcher sets them itself)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in flags:
            skip = True
        elif not any(x.startswith(f + "=") for f in flags):
            out.append(x)
    return out


def bench_multi(argv: list[str], gpus: int, script: str, baseline: str | None, out_dir: str) -> dict:
    """One benchmark process per GPU, started together (as the workflow runs one extraction job per GPU, all on
    the same disk), timed phases aligned by a file barrier; scaling = summed tokens/s over one GPU alone."""
    import tempfile

    def launch(n: int) -> list[dict]:
        with tempfile.TemporaryDirectory() as tmp:
            procs = []
            for rank in range(n):
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(rank)}
                cmd = [sys.executable, script, *argv, "--naive-fraction", "0", "--json-out", f"{tmp}/r{rank}.json",
                       "--barrier-dir", tmp, "--world", str(n), "--rank", str(rank), "--out-dir", out_dir]
                procs.append(subprocess.Popen(cmd, env=env))
            codes = [p.wait() for p in procs]
            if any(codes):
                raise RuntimeError(f"benchmark processes failed with exit codes {codes}")
            return [json.loads(Path(f"{tmp}/r{rank}.json").read_text()) for rank in range(n)]

    argv = strip_flags(argv, ("--gpus", "--baseline-json", "--json-out", "--out-dir", "--naive-fraction"))
    one = json.loads(Path(baseline).read_text()) if baseline else launch(1)[0]
    many = launch(gpus)
    total = sum(r["extract_tokens_per_s"] for r in many)
    return {"gpus": gpus, "one_gpu_extract_tokens_per_s": one["extract_tokens_per_s"],
            "per_gpu_extract_tokens_per_s": [r["extract_tokens_per_s"] for r in many],
            "total_extract_tokens_per_s": total, "scaling": total / one["extract_tokens_per_s"],
            "storage_limited": [r["storage_limited"] for r in many],
            "written_gb_per_s_total": sum(r["written_gb_per_s"] for r in many), "runs": many, "baseline": one}


# ------------------------------------------------------------------------------------- a target on disk


def save_random_target(shape: str, tokenizer_dir: str, out_dir: str, num_layers: int | None = None,
                       seed: int = 0) -> Path:
    """A random-weight checkpoint of a real shape (with a borrowed tokenizer) that the workflow can load like a hub
    model: for measuring the whole DAG at real size without downloading weights."""
    from transformers import AutoTokenizer

    from .store import tmp_path

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)  # first: fail before minutes of building
    fields, _ = load_shape(shape)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(fields, num_layers, device, dtype, seed)
    out = Path(out_dir)
    tmp = tmp_path(out)
    model.save_pretrained(tmp, max_shard_size="10GB")
    tokenizer.save_pretrained(tmp)
    tmp.replace(out)
    return out


def write_long_records(path: str, tokenizer_dir: str, samples: int, lengths_spec: str, seed: int = 0) -> None:
    """prompt/response records whose rendered lengths follow `lengths_spec` (text from the stdlib sources)."""
    import json

    from transformers import AutoTokenizer

    from . import demo

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = "".join(demo.read_text(p) for p in demo.split_files()[0][:300])
    ids = tok(text, add_special_tokens=False)["input_ids"]
    lo, hi = (int(x) for x in lengths_spec.split(":")[1:3])
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(math.log(lo), math.log(hi), size=samples)).round().astype(int)
    with open(path, "w") as f:
        for i, n in enumerate(lengths):
            start = int(rng.integers(0, max(1, len(ids) - int(n))))
            chunk = ids[start : start + int(n)]
            cut = max(1, len(chunk) // 8)
            f.write(json.dumps({"id": f"long{i}", "prompt": tok.decode(chunk[:cut]),
                                "response": tok.decode(chunk[cut:])}) + "\n")
