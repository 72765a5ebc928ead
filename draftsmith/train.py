"""Training a DFlash drafter on stored target hidden states.

Read top to bottom: anchors -> packed batch -> chunked loss -> one training step -> data plan -> the loop
(checkpoints, metrics, DDP) -> held-out evaluation -> throughput benchmark.

Every sequence contributes up to `anchors_per_seq` blocks, all in one forward/backward: the block-sparse mask
(drafter.mask_mod_for) lets each block see its sequence's context strictly before its anchor and nothing of the
other blocks. Anchors are drawn per (seed, epoch, sample), so a resumed run sees exactly the batches it would
have seen without the interruption.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from draftsmith import store
from draftsmith.drafter import (
    BlockLayout,
    Drafter,
    DrafterConfig,
    auto_gamma,
    build_masks,
    config_from_target,
    load_target_head,
    position_weights,
)

TRAIN_DEFAULTS = {
    "epochs": 6,
    "lr": 6.0e-4,
    "warmup_ratio": 0.04,
    "weight_decay": 0.0,
    "grad_clip": 1.0,
    "anchors_per_seq": 512,
    "gamma": "auto",
    "token_budget": 16384,
    "seed": 0,
    "gpus": 1,
    "checkpoint_every": 200,
    "dtype": "auto",
    "heldout_fraction": 0.05,
    "max_steps": None,
}

EVAL_EPOCH = 1_000_000  # anchor seed of the held-out evaluation: fixed, and never a training epoch

# ---------------------------------------------------------------------------------------------------- anchors


def anchor_candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a >= 1 whose next token is trained on: the block's first prediction is a real label."""
    t = loss_mask.shape[0]
    if t < 3:
        return torch.zeros(0, dtype=torch.long)
    return torch.nonzero(loss_mask[2:]).flatten() + 1


def pick_anchors(loss_mask: torch.Tensor, n: int, seed: list[int]) -> torch.Tensor:
    """Up to n distinct anchors, sorted; seeded by [seed, epoch, sample] so every epoch draws afresh."""
    cand = anchor_candidates(loss_mask).numpy()
    if len(cand) > n:
        cand = np.sort(np.random.default_rng(seed).choice(cand, size=n, replace=False))
    return torch.from_numpy(cand).long()


# ------------------------------------------------------------------------------------------------ the batch


@dataclass
class Batch:
    taps: torch.Tensor  # [T, n_taps*H] context tap states, sequences packed
    layout: BlockLayout  # positions / sequence ids of context tokens and blocks
    block_tokens: torch.Tensor  # [Q] anchor then MASK tokens, per block
    labels: torch.Tensor  # [Q] target token at each block position, -100 where not trained on
    num_tokens: int  # context tokens (target tokens) in the batch

    def query_positions(self) -> torch.Tensor:
        """RoPE positions of the block tokens: anchor .. anchor + B - 1."""
        lay = self.layout
        return (lay.anchor[:, None] + torch.arange(lay.block_size, device=lay.anchor.device)[None, :]).flatten()

    def to(self, device: torch.device, dtype: torch.dtype) -> Batch:
        lay = self.layout
        return Batch(
            self.taps.to(device, dtype, non_blocking=True),
            BlockLayout(*(x.to(device) for x in (lay.ctx_doc, lay.ctx_pos, lay.block_doc, lay.anchor)), lay.block_size),
            self.block_tokens.to(device),
            self.labels.to(device),
            self.num_tokens,
        )


def make_batch(samples: list[store.Sample], anchors: list[torch.Tensor], block_size: int, mask_token_id: int) -> Batch:
    """Packs sequences into one flat context and all their blocks into one flat query set."""
    B = block_size
    ctx_doc, ctx_pos, block_doc, anchor, tokens, labels = [], [], [], [], [], []
    k = torch.arange(B)
    for s, (smp, a) in enumerate(zip(samples, anchors)):
        t = smp.input_ids.shape[0]
        ctx_doc.append(torch.full((t,), s, dtype=torch.long))
        ctx_pos.append(torch.arange(t))
        block_doc.append(torch.full((a.shape[0],), s, dtype=torch.long))
        anchor.append(a)
        p = a[:, None] + k[None, :]  # [n, B] position of each block slot
        inside = p < t
        pc = p.clamp(max=t - 1)
        lab = torch.where(inside & smp.loss_mask[pc], smp.input_ids[pc], -100)
        lab[:, 0] = -100  # the anchor is given, not predicted
        tok = torch.full_like(p, mask_token_id)
        tok[:, 0] = smp.input_ids[a]
        tokens.append(tok.flatten())
        labels.append(lab.flatten())
    layout = BlockLayout(torch.cat(ctx_doc), torch.cat(ctx_pos), torch.cat(block_doc), torch.cat(anchor), B)
    taps = torch.cat([smp.hidden for smp in samples])
    return Batch(taps, layout, torch.cat(tokens), torch.cat(labels), int(taps.shape[0]))


# ----------------------------------------------------------------------------------------------------- loss


class ChunkedCrossEntropy(torch.autograd.Function):
    """Weighted cross-entropy through a frozen LM head, in row chunks: logits never exist for all rows at once.

    The gradient w.r.t. the hidden states is computed chunk by chunk in the forward pass (the head is frozen, so
    that is all backward needs): memory is rows x H plus one chunk x V, whatever the vocabulary.
    """

    @staticmethod
    def forward(ctx, h, weight, labels, row_w, chunk: int):
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        pred = torch.empty_like(labels)
        grad = torch.empty_like(h) if h.requires_grad else None
        for i in range(0, h.shape[0], chunk):
            hc = h[i : i + chunk]
            logits = (hc.to(weight.dtype) @ weight.T).float()
            lab, w = labels[i : i + chunk], row_w[i : i + chunk]
            lse = torch.logsumexp(logits, dim=-1)
            loss += (w * (lse - logits.gather(1, lab[:, None]).squeeze(1))).sum()
            pred[i : i + chunk] = logits.argmax(-1)
            if grad is not None:
                g = torch.softmax(logits, dim=-1)
                g[torch.arange(lab.shape[0], device=h.device), lab] -= 1.0
                grad[i : i + chunk] = ((g * w[:, None]).to(weight.dtype) @ weight).to(h.dtype)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(pred)
        return loss, pred

    @staticmethod
    def backward(ctx, grad_loss, _grad_pred):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None


def chunk_rows(vocab_size: int, budget_elems: int = 1 << 27) -> int:
    """Rows per loss chunk so one chunk of fp32 logits stays ~512 MB (248k vocab: 540 rows)."""
    return max(1, budget_elems // vocab_size)


def block_loss(
    model: torch.nn.Module,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    batch: Batch,
    masks: dict,
    pos_w: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean weighted CE over trained block positions; also per-position (correct, count) over [B]."""
    B = batch.layout.block_size
    x = F.embedding(batch.block_tokens, embed)
    h = model(batch.taps, batch.layout.ctx_pos, x, batch.query_positions(), masks)
    slot = torch.arange(batch.labels.shape[0], device=h.device) % B
    keep = batch.labels >= 0
    rows, lab, slot = h[keep], batch.labels[keep], slot[keep]
    w = pos_w.to(h.device)[slot]
    total, pred = ChunkedCrossEntropy.apply(rows, lm_head, lab, w, chunk_rows(lm_head.shape[0]))
    denom = w.sum().clamp_min(1e-9)
    loss = total / denom if rows.shape[0] else h.sum() * 0.0  # keeps DDP's graph whole on an empty batch
    correct = torch.zeros(B, device=h.device).index_add_(0, slot, (pred == lab).float())
    count = torch.zeros(B, device=h.device).index_add_(0, slot, torch.ones_like(w))
    return loss, correct, count


# ------------------------------------------------------------------------------------------------ data plan


def split_indices(n: int, heldout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed held-out set (at least one sample when the fraction is > 0 and there are >= 2 samples)."""
    perm = np.random.default_rng([seed, 12345]).permutation(n)
    k = int(round(n * heldout_fraction))
    if heldout_fraction > 0 and n >= 2:
        k = max(1, k)
    return np.sort(perm[k:]), np.sort(perm[:k])


def sample_cost(length: int, anchors_per_seq: int, block_size: int) -> int:
    """Tokens a sample puts through the drafter: its context plus (at most) all its block positions."""
    return int(length) + block_size * min(anchors_per_seq, max(0, int(length) - 2))


def plan_epoch(
    lengths: np.ndarray, indices: np.ndarray, budget: int, anchors: int, block: int, seed: int, epoch: int
) -> list[list[int]]:
    """Shuffled indices packed greedily into batches under the token budget (an oversize sample goes alone)."""
    order = np.random.default_rng([seed, epoch]).permutation(indices)
    batches, cur, used = [], [], 0
    for i in order.tolist():
        c = sample_cost(lengths[i], anchors, block)
        if cur and used + c > budget:
            batches.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += c
    if cur:
        batches.append(cur)
    return batches


def load_batch(ds: store.MergedDataset, idx: list[int], epoch: int, tcfg: dict, cfg: DrafterConfig) -> Batch:
    samples = [ds[i] for i in idx]
    anchors = [pick_anchors(s.loss_mask, tcfg["anchors_per_seq"], [tcfg["seed"], epoch, i]) for s, i in zip(samples, idx)]
    return make_batch(samples, anchors, cfg.block_size, cfg.mask_token_id)


# --------------------------------------------------------------------------------------------- distributed


def dist_info() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) when run directly."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def setup_device() -> tuple[int, int, torch.device]:
    """Rank, world size and this process's device: one GPU per rank under torchrun (NCCL), else GPU 0 or CPU.

    Without GPUs, torchrun ranks run on the CPU over gloo: the same DDP code path, testable anywhere."""
    rank, world, local = dist_info()
    if world > 1 and not torch.cuda.is_available():
        torch.distributed.init_process_group("gloo")
        return rank, world, torch.device("cpu")
    if world > 1:
        torch.distributed.init_process_group("nccl")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        return rank, world, device
    return rank, world, torch.device("cuda" if torch.cuda.is_available() else "cpu")


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DDP over this rank's GPU, or over CPU processes (gloo) when there is none."""
    ids = None if device.type == "cpu" else [device.index]
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def run(script: str, argv: list[str], dataset: str, target: str, out: str, drafter_section: dict,
        train_section: dict, preset_mask_token_id: int | None) -> int:
    """The CLI's body: takes `train.gpus` devices from the pool; with two or more, re-runs `script` under torchrun
    on them (one process per GPU, rank 0 writes); inside torchrun, or with one device or none, trains in place."""
    gpus = int(train_section.get("gpus") or 1)
    if os.environ.get("DRAFTSMITH_DISTRIBUTED") == "1":
        train(dataset, target, out, drafter_section, train_section, preset_mask_token_id)
        return 0
    from draftsmith import gpu_pool

    with gpu_pool.acquire(gpus) as devices:
        if len(devices) >= 2:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={len(devices)}", script, *argv]
            return subprocess.call(cmd, env=dict(os.environ, DRAFTSMITH_DISTRIBUTED="1"))
        if gpus > 1:
            print(f"train.gpus={gpus} but the pool gave {devices}: training in one process", file=sys.stderr)
        train(dataset, target, out, drafter_section, train_section, preset_mask_token_id)
    return 0


def resolve_dtype(setting: str, device: torch.device) -> torch.dtype:
    if setting in ("auto", None):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}[setting]


# ------------------------------------------------------------------------------------------------ the loop


def lr_at(step: int, total: int, warmup: int, lr: float) -> float:
    """Linear warm-up, then cosine to zero."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def _latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = sorted(ckpt_dir.glob("step_*.pt"))
    return found[-1] if found else None


def _save_checkpoint(ckpt_dir: Path, step: int, model: Drafter, opt: torch.optim.Optimizer, keep: int = 2) -> None:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step_{step:08d}.pt"
    tmp = store.tmp_path(path)
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict(), "cfg": model.cfg.to_json()}, tmp)
    os.replace(tmp, path)
    for old in sorted(ckpt_dir.glob("step_*.pt"))[:-keep]:
        old.unlink()


def _metrics_columns(block_size: int) -> list[str]:
    return ["step", "epoch", "lr", "loss", "grad_norm", "tokens", "elapsed_s"] + [
        f"acc_{k}" for k in range(1, block_size)
    ]


def _reopen_metrics(path: Path, columns: list[str], resume_step: int):
    """Keeps rows up to the resumed step (a killed run may have logged past its last checkpoint)."""
    rows = []
    if resume_step > 0 and path.exists():
        with path.open() as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
    f = path.open("w", newline="")
    w = csv.DictWriter(f, fieldnames=columns)
    w.writeheader()
    w.writerows(rows)
    f.flush()
    return f, w


def train(
    dataset: str | Path,
    target_dir: str | Path,
    out_dir: str | Path,
    drafter_section: dict | None = None,
    train_section: dict | None = None,
    preset_mask_token_id: int | None = None,
    stop_after: int | None = None,
) -> dict:
    """Trains (or resumes) a drafter; writes final/, metrics.csv, curves.png, summary.json on rank 0.

    `stop_after` ends the process-equivalent early after that step (tests use it to simulate a kill).
    """
    tcfg = {**TRAIN_DEFAULTS, **{k: v for k, v in (train_section or {}).items() if v is not None}}
    tcfg["max_steps"] = (train_section or {}).get("max_steps")
    rank, world, device = setup_device()
    dtype = resolve_dtype(tcfg["dtype"], device)
    out, target_dir = Path(out_dir), Path(target_dir)
    ckpt_dir = out / "checkpoints"

    ds = store.MergedDataset(dataset)
    target_cfg = json.loads((target_dir / "config.json").read_text())
    cfg = config_from_target(target_cfg, ds.taps, drafter_section, preset_mask_token_id, target_dir)
    if ds.hidden_size != cfg.hidden_size:
        raise ValueError(f"dataset hidden size {ds.hidden_size} != target hidden size {cfg.hidden_size}")
    gamma = auto_gamma(cfg.block_size) if tcfg["gamma"] in (None, "auto") else float(tcfg["gamma"])
    pos_w = position_weights(cfg.block_size, gamma)

    embed, head = load_target_head(target_dir)
    head_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    embed, head = embed.to(device, head_dtype), head.to(device, head_dtype)

    torch.manual_seed(tcfg["seed"])
    model = Drafter(cfg).to(device)
    opt = torch.optim.AdamW(
        model.parameters(), lr=tcfg["lr"], betas=(0.9, 0.95), weight_decay=tcfg["weight_decay"],
        fused=device.type == "cuda",
    )
    train_idx, held_idx = split_indices(len(ds), tcfg["heldout_fraction"], tcfg["seed"])
    args = (ds.lengths, train_idx, tcfg["token_budget"], tcfg["anchors_per_seq"], cfg.block_size, tcfg["seed"])
    steps_per_epoch = len(plan_epoch(*args, 0)) // world
    if steps_per_epoch == 0:
        raise ValueError(f"{len(train_idx)} training samples make no full step on {world} ranks")
    total = steps_per_epoch * int(tcfg["epochs"])
    if tcfg["max_steps"]:
        total = min(total, int(tcfg["max_steps"]))
    warmup = max(1, int(round(tcfg["warmup_ratio"] * total)))

    step = 0
    last = _latest_checkpoint(ckpt_dir)
    if last is not None:
        state = torch.load(last, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    ddp = model
    if world > 1:
        ddp = wrap_ddp(model, device)

    columns = _metrics_columns(cfg.block_size)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        mfile, mwriter = _reopen_metrics(out / "metrics.csv", columns, step)
    from tqdm import tqdm

    bar = tqdm(total=total, initial=step, desc="train", disable=rank != 0, dynamic_ncols=True)
    use_flex = device.type == "cuda"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    t0, tokens_seen, plan_epoch_no, plan = time.time(), 0, -1, []
    while step < total:
        epoch = step // steps_per_epoch
        if epoch != plan_epoch_no:
            plan, plan_epoch_no = plan_epoch(*args, epoch), epoch
        idx = plan[(step % steps_per_epoch) * world + rank]
        batch = load_batch(ds, idx, epoch, tcfg, cfg).to(device, dtype)
        masks = build_masks(batch.layout, cfg, use_flex)
        lr = lr_at(step, total, warmup, tcfg["lr"])
        for g in opt.param_groups:
            g["lr"] = lr
        with autocast:
            loss, correct, count = block_loss(ddp, embed, head, batch, masks, pos_w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg["grad_clip"])
        opt.step()
        step += 1
        stats = torch.cat([loss.detach().float().view(1), correct, count, torch.tensor([batch.num_tokens], device=device)])
        if world > 1:
            torch.distributed.all_reduce(stats)
            stats[0] /= world
        B = cfg.block_size
        tokens_seen += int(stats[-1].item())
        if rank == 0:
            acc = (stats[1 : 1 + B] / stats[1 + B : 1 + 2 * B].clamp_min(1)).tolist()
            row = {"step": step, "epoch": epoch, "lr": lr, "loss": float(stats[0]), "grad_norm": float(gnorm),
                   "tokens": int(stats[-1].item()), "elapsed_s": round(time.time() - t0, 3)}
            row.update({f"acc_{k}": acc[k] for k in range(1, B)})
            mwriter.writerow(row)
            mfile.flush()
            bar.set_postfix(loss=f"{row['loss']:.3f}", acc1=f"{acc[1]:.3f}")
        bar.update(1)
        if step % int(tcfg["checkpoint_every"]) == 0 or step == total:
            if rank == 0:
                _save_checkpoint(ckpt_dir, step, model, opt)
            if world > 1:
                torch.distributed.barrier()
        if stop_after is not None and step >= stop_after:
            break
    bar.close()
    elapsed = time.time() - t0
    summary: dict = {}
    if rank == 0:
        mfile.close()
        if step >= total:
            from draftsmith.export import save_zlab

            save_zlab(model, out / "final", torch.float32)
            summary = _summarise(out, model, embed, head, ds, held_idx, tcfg, cfg, device, dtype)
            summary["tokens_per_s"] = tokens_seen / max(elapsed, 1e-9)
            summary["steps"] = step
            summary["world_size"] = world
            store.write_json(out / "summary.json", summary)
            plot_curves(out / "metrics.csv", out / "curves.png")
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return summary


# ------------------------------------------------------------------------------------------------ evaluation


@torch.no_grad()
def evaluate(
    model: Drafter,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    ds: store.MergedDataset,
    indices: np.ndarray,
    tcfg: dict,
    cfg: DrafterConfig,
    device: torch.device,
    dtype: torch.dtype,
) -> dict:
    """Held-out accuracy per block position, and the frequency baseline for position 1 (always predicting the most
    frequent position-1 label of the held-out set: what a drafter that ignores the context would get)."""
    B = cfg.block_size
    correct, count = torch.zeros(B), torch.zeros(B)
    first_labels: list[torch.Tensor] = []
    pos_w = position_weights(B, 1.0)
    model.eval()
    batches = plan_epoch(ds.lengths, indices, tcfg["token_budget"], tcfg["anchors_per_seq"], B, tcfg["seed"], EVAL_EPOCH)
    for idx in batches:
        batch = load_batch(ds, idx, EVAL_EPOCH, tcfg, cfg)
        first_labels.append(batch.labels.view(-1, B)[:, 1])
        batch = batch.to(device, dtype)
        masks = build_masks(batch.layout, cfg, device.type == "cuda")
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            _, c, n = block_loss(model, embed, lm_head, batch, masks, pos_w)
        correct += c.cpu()
        count += n.cpu()
    model.train()
    labels = torch.cat(first_labels) if first_labels else torch.zeros(0, dtype=torch.long)
    labels = labels[labels >= 0]
    baseline = float(torch.bincount(labels).max() / labels.numel()) if labels.numel() else float("nan")
    acc = (correct / count.clamp_min(1)).tolist()
    return {
        "heldout_samples": int(len(indices)),
        "heldout_blocks": int(count[1].item()),
        "heldout_acc": {str(k): acc[k] for k in range(1, B)},
        "heldout_acc_1": acc[1],
        "frequency_baseline_1": baseline,
    }


def _summarise(out, model, embed, head, ds, held_idx, tcfg, cfg, device, dtype) -> dict:
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["loss"]) for r in rows]
    tail = losses[-max(1, len(losses) // 10) :]
    s = {"first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None,
         "final_loss_mean_last10pct": sum(tail) / len(tail) if tail else None}
    s.update(evaluate(model, embed, head, ds, held_idx, tcfg, cfg, device, dtype))
    s["drafter"] = cfg.to_json()
    return s


def plot_curves(metrics_csv: str | Path, png: str | Path) -> None:
    """Loss and accuracy at a few block positions against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.read_csv(metrics_csv)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(df["step"], df["loss"], lw=0.8)
    a.set_xlabel("step")
    a.set_ylabel("weighted CE loss")
    a.set_yscale("log")
    accs = [c for c in df.columns if c.startswith("acc_")]
    for c in [accs[0], accs[len(accs) // 4], accs[len(accs) // 2], accs[-1]] if accs else []:
        b.plot(df["step"], df[c].rolling(10, min_periods=1).mean(), lw=0.8, label=f"position {c[4:]}")
    b.set_xlabel("step")
    b.set_ylabel("train accuracy (10-step mean)")
    b.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def clear_run(out_dir: str | Path) -> None:
    """Removes a previous run's checkpoints (a fresh start instead of a resume)."""
    shutil.rmtree(Path(out_dir) / "checkpoints", ignore_errors=True)


# ------------------------------------------------------------------------------------------ throughput bench


def step_flops(cfg: DrafterConfig, layout: BlockLayout, num_labels: int) -> float:
    """Model FLOPs of one training step (forward + backward), counting only work the model must do: matmuls at
    2 FLOPs/MAC, attention only over unmasked keys, no recomputation; backward = 2x forward except where no
    gradient is needed (fc and the LM head get no input gradient; layer 0's block q/k/v get no input gradient)."""
    H, nh, nkv, d, inter, B = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.block_size
    Q, T = layout.num_queries, layout.num_ctx
    q_o = 2 * (2 * H * nh * d)  # q_proj + o_proj per query
    kv = 2 * (2 * H * nkv * d)  # k_proj + v_proj per token
    mlp = 3 * (2 * H * inter)
    anchors = layout.anchor.double().cpu()  # the count is host arithmetic: no device tensors, no syncs
    k = torch.arange(B, dtype=torch.float64)
    total = 0.0
    for i, t in enumerate(cfg.layer_types):
        per_query_linear = q_o + kv + mlp
        total += 3 * Q * per_query_linear - (Q * (2 * H * nh * d + kv) if i == 0 else 0)
        total += 3 * T * kv  # context keys/values (their gradient flows back to fc)
        if t == "sliding_attention":
            ctx_keys = torch.minimum(anchors[:, None], (cfg.sliding_window - k)[None, :].clamp_min(0)).sum()
        else:
            ctx_keys = anchors.sum() * B
        keys = float(ctx_keys) + Q * B  # every query also sees its whole block
        total += 3 * 4 * nh * d * keys  # QK^T and PV, forward + 2x backward
    total += 2 * T * 2 * (cfg.num_taps * H) * H  # fc: forward + weight gradient
    total += 2 * num_labels * 2 * H * cfg.vocab_size  # LM head: forward + input gradient
    return total


def matmul_ceiling(device: torch.device, n: int = 8192, iters: int = 20) -> float:
    """Measured FLOP/s of a square bf16 matmul (fp32 on CPU): the ceiling the training step is compared to."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type != "cuda":
        n, iters = min(n, 1024), min(iters, 5)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync_device(device)
    return 2 * n**3 * iters / (time.perf_counter() - t0)


def sync_device(device: torch.device) -> None:
    """Waits for the device's queued work (a no-op on the CPU): timers read wall time only after it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def benchmark(cfg: DrafterConfig, seq_len: int, seqs_per_step: int, anchors_per_seq: int, steps: int,
              warmup: int, seed: int = 0) -> dict:
    """The real training step (block-sparse forward, chunked loss, backward, clip, AdamW) on random weights and
    data of the given shape; under torchrun each rank runs it on its own GPU with DDP."""
    rank, world, device = setup_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(seed + rank)
    with torch.device(device):  # initialised on the device: a 1.8B-parameter CPU init takes minutes
        model = Drafter(cfg)
    ddp = wrap_ddp(model, device) if world > 1 else model
    embed = (torch.randn(cfg.vocab_size, cfg.hidden_size, device=device) * 0.02).to(dtype)
    head = (torch.randn(cfg.vocab_size, cfg.hidden_size, device=device) * 0.02).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    g = torch.Generator().manual_seed(seed + rank)
    samples, anchors = [], []
    for _ in range(seqs_per_step):
        ids = torch.randint(0, cfg.vocab_size, (seq_len,), generator=g)
        mask = torch.ones(seq_len, dtype=torch.bool)
        samples.append(store.Sample(torch.randn(seq_len, cfg.num_taps * cfg.hidden_size, generator=g).to(torch.bfloat16), ids, mask))
        anchors.append(pick_anchors(mask, anchors_per_seq, [seed, rank, len(samples)]))
    batch = make_batch(samples, anchors, cfg.block_size, cfg.mask_token_id).to(device, dtype)
    pos_w = position_weights(cfg.block_size, auto_gamma(cfg.block_size))
    masks = build_masks(batch.layout, cfg, device.type == "cuda")
    flops = step_flops(cfg, batch.layout, int((batch.labels >= 0).sum()))
    ceiling = matmul_ceiling(device)

    def one_step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss, _, _ = block_loss(ddp, embed, head, batch, masks, pos_w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(warmup):
        one_step()
    sync_device(device)
    if world > 1:
        torch.distributed.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    sync_device(device)
    if world > 1:
        torch.distributed.barrier()
    dt = (time.perf_counter() - t0) / steps
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "world_size": world,
        "params": sum(p.numel() for p in model.parameters()),
        "context_tokens_per_step": batch.num_tokens * world,
        "block_positions_per_step": batch.layout.num_queries * world,
        "step_s": dt,
        "tokens_per_s": batch.num_tokens * world / dt,
        "model_flops_per_token": flops / batch.num_tokens,
        "achieved_tflops_per_gpu": flops / dt / 1e12,
        "matmul_ceiling_tflops": ceiling / 1e12,
        "fraction_of_ceiling": flops / dt / ceiling,
        "peak_mem_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    if world > 1:
        torch.distributed.destroy_process_group()
    return result
