"""Each GPU job of a preset's run under a GPU memory cap (`gpu_memory`), on the target's real shape with
random weights built in memory: regeneration at the preset's slots, extraction at the probe's token budget,
the bench's real loop and its fp32 check, and a training step of the preset's drafter at its token budget.
Prints each stage's peak (PyTorch's allocated and reserved, and the device's own use, context included) and
throughput.

    python -m draftsmith.perf.memory_cap --preset configs/qwen3.6-27b.yaml --cap 96GB --json-out OUT.json

The stages run in one process, in the order the DAG runs them; the target stays loaded from regeneration to
the bench (each job of the DAG loads its own), and is freed before training, which runs without it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch

from draftsmith.config import resolve_taps, with_defaults
from draftsmith.core.gpu_memory import ENV, hold_to_cap, job_memory
from draftsmith.core.runtime import setup_logging
from draftsmith.dataset.extract import extract_samples
from draftsmith.dataset.regenerate import regenerate
from draftsmith.drafter.config import drafter_config
from draftsmith.drafter.model import Drafter
from draftsmith.engine.memory import plan_slots
from draftsmith.perf.extraction import draw_lengths, random_samples
from draftsmith.perf.shapes import build_model, load_shape
from draftsmith.perf.training import benchmark
from draftsmith.plan.cli import load_config
from draftsmith.speculative.bench import bench_prompt, checks_in_fp32
from draftsmith.speculative.proposers import BlockDrafter
from draftsmith.target.kernels import use_fla_conv
from draftsmith.target.placement import GIB, activation_bytes_per_token, decide, gpu_info

SAMPLE_EVERY_S = 0.05  # how often the device's memory in use is read while a stage runs


@contextmanager
def measured(device: torch.device, row: dict) -> Iterator[dict]:
    """Fills `row` with the stage's seconds and peaks: PyTorch's (allocated, reserved) and the device's in-use
    memory sampled on a thread (what nvidia-smi shows: the context and other allocators included)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            free, total = torch.cuda.mem_get_info(device)
            peak[0] = max(peak[0], total - free)
            time.sleep(SAMPLE_EVERY_S)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    try:
        yield row
        torch.cuda.synchronize(device)
    except torch.OutOfMemoryError as e:
        row["out_of_memory"] = str(e).splitlines()[0]
    finally:
        row["seconds"] = time.perf_counter() - t0
        stop.set()
        thread.join()
        row["peak_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        row["peak_reserved_gb"] = torch.cuda.max_memory_reserved(device) / 1e9
        row["peak_device_gb"] = peak[0] / 1e9


def regeneration_stage(model, config: dict, *, prompt_len: int, row: dict) -> None:
    """`regenerate` (the extract job's and the regenerate rule's code) on the preset's slot count of random
    prompts, answers of the preset's max_new_tokens: the slots are cut to what the cap leaves."""
    regen, vocab = config["data"]["regenerate"], model.config.get_text_config().vocab_size
    slots, new_tokens = int(regen["batch_size"]), int(regen["max_new_tokens"])
    max_len = min(int(config["data"]["max_length"]), prompt_len + new_tokens) + 1
    # the slots `regenerate` will keep (it plans them the same way): one wave of prompts fills them
    fit = plan_slots(model, slots, max_len, 0, job_memory(next(model.parameters()).device)[0])
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, vocab, prompt_len).astype(np.int32) for _ in range(fit)]
    samples = pd.DataFrame(
        {"input_ids": ids, "prompt_len": prompt_len, "loss_mask": [np.zeros(prompt_len, np.uint8)] * fit}
    )
    stand_in = SimpleNamespace(pad_token_id=0, eos_token_id=None)  # random weights: no tokenizer to read
    model.generation_config.eos_token_id = None  # answers of the full length, the slots' worst case
    _, stats = regenerate(
        model, stand_in, samples, new_tokens, 0.0, int(config["data"]["max_length"]), slots, seed=0
    )
    row.update(slots_asked=slots, slots_fit=fit, slot_positions=max_len, new_tokens=stats.new_tokens,
               new_tokens_per_s=stats.new_tokens_per_s)  # fmt: skip


def extraction_stage(model, config: dict, taps: list[int], *, tokens: int, out_dir: Path, row: dict) -> None:
    """`extract_samples` at the token budget the probe's rule gives under the cap, on random samples of
    log-uniform lengths up to data.max_length."""
    cfg = model.config.get_text_config()
    max_length = int(config["data"]["max_length"])
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # the probe runs before any job loads the target: what this process holds counts as free, as it was then
    held = torch.cuda.memory_reserved(next(model.parameters()).device) / GIB
    gpus = [{**g, "free_gib": min(g["free_gib"] + held, g["cap_gib"] or 1e9)} for g in gpu_info()[:1]]
    plan = decide(gpus, weights, activation_bytes_per_token(cfg.to_dict(), len(taps)), None, max_length, 1)
    lengths = draw_lengths(f"loguniform:64:{max_length}", tokens, max_length, 0)
    samples = random_samples(lengths, cfg.vocab_size, 1)
    _, stats = extract_samples(
        model, samples, taps, out_dir / "shard.bin", int(plan["token_budget"]), config["extract"]["storage"]
    )
    row.update(
        token_budget=int(plan["token_budget"]), tokens=int(lengths.sum()), tokens_per_s=stats.tokens_per_s
    )


def bench_stage(
    model, drafter: BlockDrafter, config: dict, taps: list[int], *, new_tokens: int, row: dict
) -> None:
    """`bench_prompt` (the real loop of every method and DDTree budget) on one random prompt, then the fp32
    check (`checks_in_fp32`) on it, as the bench job runs them."""
    bench = with_defaults("bench", {**config["bench"], "max_new_tokens": new_tokens})
    vocab = model.config.get_text_config().vocab_size
    prompt = torch.randint(0, vocab, (256,), generator=torch.Generator().manual_seed(2)).tolist()
    t0 = time.perf_counter()
    records = bench_prompt(model, drafter, prompt, taps, bench)
    row["bench_seconds"] = time.perf_counter() - t0
    row["methods"] = [f"{r['method']}{r.get('budget') or ''}" for r in records]
    t0 = time.perf_counter()
    checks = checks_in_fp32(model, drafter, [prompt], taps=taps, bench=bench, stop_ids=[])
    row.update(check_seconds=time.perf_counter() - t0, check_exact=sum(c["exact"] for c in checks),
               check_prompts=len(checks), new_tokens=new_tokens)  # fmt: skip


def preset_drafter(fields: dict, config: dict, taps: list[int]):
    d = config["drafter"]
    return drafter_config(
        fields, taps, num_layers=int(d["num_layers"]), num_target_layers=int(fields["num_hidden_layers"]),
        mask_token_id=int(config["target"]["mask_token_id"] or fields["vocab_size"] - 1),
        block_size=int(d["block_size"]), layer_types=d.get("layer_types"),
        sliding_window=d.get("sliding_window"),
    )  # fmt: skip


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> list[dict]:
    config = load_config([args.preset])  # checked against the schema, its defaults filled in
    device = torch.device("cuda", 0)
    hold_to_cap(device)
    fields, _ = load_shape(args.shape)
    model = build_model(fields, args.layers, device, torch.bfloat16)
    use_fla_conv(model)  # as load_target does for every job
    layers = int(model.config.get_text_config().num_hidden_layers)
    cut = layers != fields["num_hidden_layers"]  # a shallower smoke run: the preset's taps do not exist there
    taps = resolve_taps(layers, with_defaults("taps") if cut else config["taps"])
    _, limit = job_memory(device)
    log(f"cap {os.environ[ENV]}: a job may use {limit / 1e9:.1f} GB of {torch.cuda.get_device_name(device)}")
    rows = []
    stages = args.stages.split(",")
    if "regen" in stages:
        with measured(device, {"stage": "regeneration"}) as row:
            regeneration_stage(model, config, prompt_len=args.prompt_len, row=row)
        rows.append(row)
    if "extract" in stages:
        with (
            tempfile.TemporaryDirectory(dir=args.scratch) as tmp,
            measured(device, {"stage": "extraction"}) as row,
        ):
            extraction_stage(model, config, taps, tokens=args.extract_tokens, out_dir=Path(tmp), row=row)
        rows.append(row)
    cfg = preset_drafter(model.config.get_text_config().to_dict(), config, taps)
    if "bench" in stages:
        torch.manual_seed(0)
        with torch.device(device):
            body = Drafter(cfg).to(torch.bfloat16).eval()
        embed = (
            model.get_input_embeddings().weight.detach().clone()
        )  # the bench's own copies, as it loads them
        head = model.lm_head.weight.detach().clone()
        with measured(device, {"stage": "bench + fp32 check"}) as row:
            bench_stage(
                model, BlockDrafter(body, embed, head), config, taps, new_tokens=args.bench_tokens, row=row
            )
        rows.append(row)
        del body, embed, head
    del model
    if "train" in stages:
        budget, anchors = int(config["train"]["token_budget"]), int(config["train"]["anchors_per_seq"]) // 2
        seq = budget // 4  # two sequences whose context and blocks fill the budget (sample_cost)
        with measured(device, {"stage": "training step"}) as row:
            result = benchmark(cfg, seq, 2, anchors, steps=2, warmup=1)
            row.update(token_budget=budget, context_tokens=result["context_tokens_per_step"],
                       block_positions=result["block_positions_per_step"],
                       tokens_per_s=result["tokens_per_s"],
                       fraction_of_ceiling=result["fraction_of_ceiling"])  # fmt: skip
        rows.append(row)
    for r in rows:
        log(json.dumps(r))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="configs/qwen3.6-27b.yaml")
    p.add_argument("--shape", default="qwen3.6-27b", help="a shape in configs/shapes, or a config.json")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    p.add_argument("--cap", default="96GB", help="the GPU memory cap (gpu_memory)")
    p.add_argument("--stages", default="regen,extract,bench,train")
    p.add_argument("--prompt-len", type=int, default=512, help="regeneration's prompts")
    p.add_argument("--extract-tokens", type=int, default=120_000)
    p.add_argument("--bench-tokens", type=int, default=64, help="new tokens of the bench prompt")
    p.add_argument("--scratch", default=None, help="where extraction writes its shard (then deleted)")
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    os.environ[ENV] = args.cap
    setup_logging()
    rows = run(args)
    print(f"{'stage':20} {'peak alloc':>10} {'reserved':>9} {'device':>8} {'seconds':>8}  figures")
    for r in rows:
        extra = {k: v for k, v in r.items() if not k.startswith("peak") and k not in ("stage", "seconds")}
        print(f"{r['stage']:20} {r['peak_allocated_gb']:10.1f} {r['peak_reserved_gb']:9.1f} "
              f"{r['peak_device_gb']:8.1f} {r['seconds']:8.1f}  {extra}")  # fmt: skip
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
