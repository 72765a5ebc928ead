"""Cost of one speculative round on a real-size target: draft, verify, state restore/replay.

A random-weight target of a real shape (built on the GPU from its config) and a random-weight drafter of the
matching DFlash shape. Two constructed drafters bound the cost: `random` is rejected almost every round (tau ~
1: every round pays the Gated DeltaNet restore and replay), `oracle` proposes the target's own greedy
continuation (tau = B: no restore). Both run through the same real loop, whose output is checked against
greedy decoding.
"""

from __future__ import annotations

import logging

import torch

from draftsmith.config import default_taps
from draftsmith.drafter.config import drafter_config
from draftsmith.drafter.model import Drafter
from draftsmith.perf.shapes import build_model, load_shape
from draftsmith.speculative.loop import speculative_generate
from draftsmith.speculative.proposers import BlockDrafter, Proposer, Wrapped
from draftsmith.speculative.replay import ar_generate, tau

log = logging.getLogger(__name__)


class OracleDrafter(Wrapped):
    """Wraps a real drafter (so drafting costs the same) but proposes the known greedy continuation."""

    def __init__(self, inner: BlockDrafter, continuation: list[int], prompt_len: int):
        super().__init__(inner)
        self.cont, self.p = continuation, prompt_len

    def propose(self, anchor_token: int) -> torch.Tensor:
        logits = self.inner.propose(anchor_token)
        start = self.context_length - self.p + 1  # index into the continuation of block position 1
        want = self.cont[start : start + self.block_size - 1]
        out = torch.full_like(logits, -1e4)
        for i, t in enumerate(want):
            out[i, t] = 0.0
        return out


def drafter_for(fields: dict, dflash: dict, device: torch.device, dtype: torch.dtype) -> Drafter:
    cfg = drafter_config(
        fields,
        dflash["target_layer_ids"],
        num_layers=int(dflash.get("drafter_layers", 5)),
        num_target_layers=fields["num_hidden_layers"],
        mask_token_id=int(dflash.get("mask_token_id") or fields["vocab_size"] - 1),
        block_size=int(dflash.get("block_size", 16)),
        layer_types=dflash.get("layer_types"),
        sliding_window=dflash.get("sliding_window"),
    )
    with torch.device(device):
        return Drafter(cfg).to(dtype).eval()


def round_split(shape: str, prompt_len: int = 512, new_tokens: int = 64, seed: int = 0) -> list[dict]:
    import json
    from pathlib import Path

    fields, taps = load_shape(shape)
    raw = json.loads(Path(shape).read_text()) if Path(shape).exists() else {}
    dflash = dict(raw.get("dflash") or {})
    dflash.setdefault("target_layer_ids", taps or default_taps(fields["num_hidden_layers"]))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = build_model(fields, None, device, dtype, seed)
    drafter = drafter_for(fields, dflash, device, dtype)
    block = BlockDrafter(drafter, target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, fields["vocab_size"], (prompt_len,), generator=gen).tolist()
    taps = list(dflash["target_layer_ids"])
    ar_generate(target, prompt[:32], 4)  # warm-up (kernels, autotuning)
    ar = ar_generate(target, prompt, new_tokens)
    rows = []
    drafters: list[tuple[str, Proposer]] = [
        ("random", block),
        ("oracle", OracleDrafter(block, ar.tokens, prompt_len)),
    ]
    for name, d in drafters:
        speculative_generate(target, d, prompt[:64], 8, taps)  # warm-up
        g, committed = speculative_generate(target, d, prompt, new_tokens, taps, timing=True)
        n = len(committed)
        row = {
            "drafter": name,
            "rounds": n,
            "tau": tau(committed),
            "lossless": g.tokens == ar.tokens,
            "ms_per_round": {k: 1000 * v / max(n, 1) for k, v in g.split.items() if k != "prefill"},
            "prefill_ms": 1000 * g.split["prefill"],
            "seconds": g.seconds,
            "ar_ms_per_token": 1000 * ar.seconds / len(ar.tokens),
            "ms_per_token": 1000 * g.seconds / len(g.tokens),
        }
        rows.append(row)
        log.info("%s", row)
    return rows
