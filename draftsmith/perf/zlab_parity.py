"""Served as trained, on a real run: a drafter the DAG exported, loaded by z-lab's class (PyPI `dflash`, the
reference the engines follow) and by draftsmith, both in fp32, on the target's own tap states from the merged
dataset. Prints the largest block-logit difference over a few anchors; exits 1 above the tolerance.

    python -m draftsmith.perf.zlab_parity --drafter results/drafter --dataset results/merged/manifest.json \
        --target results/demo/target
"""

from __future__ import annotations

import argparse
import sys

import torch

from draftsmith.dataset.merge import MergedDataset
from draftsmith.drafter.zlab import load_drafter
from draftsmith.speculative.proposers import BlockDrafter
from draftsmith.target.files import load_target_head

TOLERANCE = 1e-4  # fp32, max abs difference of the block logits


def zlab_block_logits(
    ref, ctx: torch.Tensor, block: torch.Tensor, *, embed: torch.Tensor, head: torch.Tensor
):
    """z-lab's forward as its generation loop calls it: context then block at positions 0..len(ctx)+B-1;
    the logits of block positions 1..B-1 [B-1, V]."""
    positions = torch.arange(len(ctx) + len(block))[None]
    with torch.no_grad():
        hidden = ref(position_ids=positions, noise_embedding=embed[block][None], target_hidden=ctx[None])
    return hidden[0, 1:] @ head.T


def block_logit_difference(drafter_dir: str, dataset: str, target: str, *, anchors: int, seed: int) -> float:
    from dflash import DFlashDraftModel

    ref = DFlashDraftModel.from_pretrained(drafter_dir, dtype=torch.float32).eval()
    ours = BlockDrafter(load_drafter(drafter_dir).float(), *(t.float() for t in load_target_head(target)))
    ds, g = MergedDataset(dataset), torch.Generator().manual_seed(seed)
    worst = 0.0
    for _ in range(anchors):
        sample = ds[int(torch.randint(len(ds), (1,), generator=g))]
        a = int(torch.randint(1, len(sample.input_ids) - 1, (1,), generator=g))
        ctx = sample.hidden[:a].float()
        block = torch.full((ours.block_size,), ours.mask_token_id)
        block[0] = sample.input_ids[a]
        ours.reset()
        ours.extend(ctx)
        got = ours.propose(int(block[0]))
        want = zlab_block_logits(ref, ctx, block, embed=ours.embed, head=ours.lm_head)
        worst = max(worst, (got - want).abs().max().item())
    return worst


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", required=True, help="an exported drafter directory")
    p.add_argument("--dataset", required=True, help="the merged manifest whose tap states feed both")
    p.add_argument("--target", required=True, help="the target directory (embedding and LM head)")
    p.add_argument("--anchors", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    worst = block_logit_difference(a.drafter, a.dataset, a.target, anchors=a.anchors, seed=a.seed)
    print(f"max |block logits, draftsmith - z-lab| over {a.anchors} anchors, fp32: {worst:.2e} "
          f"(tolerance {TOLERANCE:.0e})")  # fmt: skip
    sys.exit(0 if worst <= TOLERANCE else 1)


if __name__ == "__main__":
    main()
