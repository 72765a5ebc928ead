"""The training loop's speed on a small target's shape (default: SmolLM2-135M, the study's target), where
reading the data rather than the drafter's matmuls can set the step time.

One run, one fp8 data set written to disk with the study's lengths, the same seeded drafter for each way:
- `host`: the loop before 2026-12-03: each step reads and packs its samples, decodes them to bf16 on the host
  and copies them, then trains (the same values as decoding sample by sample);
- `ahead`: the training step's own loop (`drafter.train.run_steps`): stored rows decoded on the device, the
  next batch read on a thread while this one trains;
- `resident`: one batch kept on the device and trained on repeatedly: the floor with no reading at all.
Prints steps/s and tokens/s of each and their ratios; `--threads` sets torch's host threads (a study's
training gets 2 of 16 cores). Without a GPU it runs a tiny shape on the CPU (a smoke test, not a
measurement)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from draftsmith.config import with_defaults
from draftsmith.core.io import write_json
from draftsmith.core.runtime import sync_device
from draftsmith.dataset.shards import ShardWriter, quantize_fp8
from draftsmith.drafter.batches import load_batch
from draftsmith.drafter.train import EpochPlans, TrainingRun, _set_up, _train_step, run_steps
from draftsmith.perf.shapes import load_shape

TINY = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "intermediate_size": 64, "vocab_size": 256}  # fmt: skip


def write_target(out: Path, shape: dict) -> None:
    """A target folder with what training reads of it: config.json and a tied random embedding."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg = {**shape, "tie_word_embeddings": True, "architectures": ["LlamaForCausalLM"]}
    (out / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(shape["vocab_size"], shape["hidden_size"], generator=g) * 0.02
    save_file({"model.embed_tokens.weight": embed.to(torch.bfloat16)}, str(out / "model.safetensors"))


def write_data(out: Path, *, samples: int, width: int, hidden: int, taps: list[int], vocab: int,
               prompt: tuple[int, int], answer: tuple[int, int], device: torch.device) -> int:  # fmt: skip
    """A merged fp8 data set of random states: prompt and answer lengths uniform in the given ranges, the
    loss on the answer. Returns its tokens."""
    rng = np.random.default_rng(0)
    p = rng.integers(prompt[0], prompt[1] + 1, samples)
    a = rng.integers(answer[0], answer[1] + 1, samples)
    lengths = (p + a).tolist()
    path = out / "shards" / "s0.safetensors"
    w = ShardWriter(path, lengths, width, "fp8")
    g = torch.Generator(device).manual_seed(0)
    for i, t in enumerate(lengths):
        q, scale = quantize_fp8(torch.randn(t, width, generator=g, device=device))
        mask = torch.arange(t) >= int(p[i])
        w.write_sample(i, q.cpu(), torch.randint(0, vocab, (t,)), mask, scale.cpu())
    w.close()
    shard = {"path": "../shards/s0.safetensors", "num_samples": samples, "sample_tokens": lengths}
    write_json(out / "merged" / "manifest.json",
               {"taps": taps, "hidden_size": hidden, "storage": "fp8", "shards": [shard]})  # fmt: skip
    return int(sum(lengths))


def _timed(run: TrainingRun, steps, *, warmup: int, measured: int) -> dict:
    """Runs `warmup` steps untimed (FlexAttention's compile), then times `measured` steps; keeps every
    step's loss."""
    done, tokens, t0, losses = 0, 0, 0.0, []
    for stats in steps:
        done += 1
        losses.append(float(stats[0]))
        if done == warmup:
            sync_device(run.device)
            t0 = time.perf_counter()
        elif done > warmup:
            tokens += int(stats[-1].item())  # the loop's own per-step sync, as train() logs every step
        if done == warmup + measured:
            break
    sync_device(run.device)
    seconds = time.perf_counter() - t0
    return {
        "steps_per_s": measured / seconds,
        "tokens_per_s": tokens / seconds,
        "s_per_step": seconds / measured,
        "losses": losses,
    }


def host_steps(run: TrainingRun, autocast: torch.autocast):
    """The loop before 2026-12-03: samples read and decoded to bf16 on the host within the step."""
    plans = EpochPlans(run)
    host = torch.device("cpu")
    for step in range(run.total):
        epoch, idx = plans.indices(step)
        batch = load_batch(run.ds, idx, epoch, run.tcfg, run.cfg).to(host, torch.bfloat16)
        yield _train_step(run, run.model, autocast=autocast, batch=batch, step=step)[1]


def resident_steps(run: TrainingRun, autocast: torch.autocast):
    """Step 0's batch, kept where it trains, trained on again and again."""
    batch = EpochPlans(run).host_batch(0)[1].to(run.device, run.dtype)
    for step in range(run.total):
        yield _train_step(run, run.model, autocast=autocast, batch=batch, step=step)[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="smollm2-135m", help="configs/shapes/*.json or a model directory")
    p.add_argument("--workdir", default="/tmp/draftsmith-bench-train-loop")
    p.add_argument("--samples", type=int, default=1500)
    p.add_argument("--prompt", default="30,200", help="prompt lengths MIN,MAX (uniform)")
    p.add_argument("--answer", default="40,256", help="answer lengths MIN,MAX (uniform; the loss is here)")
    p.add_argument("--drafter-layers", type=int, default=3)
    p.add_argument("--anchors", type=int, default=32)
    p.add_argument("--token-budget", type=int, default=65536)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    gpu = torch.cuda.is_available()
    shape, taps = load_shape(a.shape)
    if not gpu:
        shape, taps = {**shape, **TINY}, [0, 2]
        a.samples, a.steps, a.warmup, a.token_budget, a.anchors = 24, 3, 1, 2048, 4
        a.prompt, a.answer = "8,16", "8,24"
    taps = taps or [1, shape["num_hidden_layers"] // 2, shape["num_hidden_layers"] - 3]
    work = Path(a.workdir)
    write_target(work / "target", shape)
    lo_hi = [(int(s.split(",")[0]), int(s.split(",")[1])) for s in (a.prompt, a.answer)]
    device = torch.device("cuda" if gpu else "cpu")
    t = time.perf_counter()
    tokens = write_data(work, samples=a.samples, width=len(taps) * shape["hidden_size"],
                        hidden=shape["hidden_size"], taps=taps, vocab=shape["vocab_size"],
                        prompt=lo_hi[0], answer=lo_hi[1], device=device)  # fmt: skip
    print(f"data: {a.samples} samples, {tokens} tokens, fp8, written in {time.perf_counter() - t:.1f} s")
    drafter = with_defaults("drafter", {"num_layers": a.drafter_layers, "mask_token_id": 16 if gpu else 1})
    tcfg = with_defaults("train", {"anchors_per_seq": a.anchors, "token_budget": a.token_budget,
                                   "heldout_fraction": 0.0, "epochs": 100, "max_steps": a.warmup + a.steps,
                                   "dtype": "bf16" if gpu else "fp32"})  # fmt: skip
    results = {}
    for name in ("host", "ahead", "resident"):
        run = _set_up(work / "merged" / "manifest.json", work / "target", drafter_section=drafter, tcfg=tcfg,
                      preset_mask_token_id=None)  # fmt: skip
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.dtype == torch.bfloat16)
        if name == "ahead":
            steps = (s[3] for s in run_steps(run, run.model, autocast=autocast, start=0))
        else:
            steps = host_steps(run, autocast) if name == "host" else resident_steps(run, autocast)
        results[name] = _timed(run, steps, warmup=a.warmup, measured=a.steps)
        print(f"{name:>8}: {results[name]['steps_per_s']:.2f} steps/s, {results[name]['tokens_per_s']:,.0f} "
              f"tokens/s, {1000 * results[name]['s_per_step']:.0f} ms a step")  # fmt: skip
    r = results
    print(f"tokens/s, ahead / host: {r['ahead']['tokens_per_s'] / r['host']['tokens_per_s']:.2f}x; "
          f"ahead / resident: {r['ahead']['tokens_per_s'] / r['resident']['tokens_per_s']:.2f}; "
          f"threads {a.threads}, device {torch.cuda.get_device_name() if gpu else 'cpu'}")  # fmt: skip
    same = [abs(x - y) / abs(x) for x, y in zip(r["host"]["losses"], r["ahead"]["losses"])]
    print(f"loss, host vs ahead: step 1 {'equal' if same[0] == 0 else f'differs by {same[0]:.1e}'}, "
          f"largest relative difference over {len(same)} steps {max(same):.1e}")  # fmt: skip
    print(json.dumps(results))


if __name__ == "__main__":
    main()
