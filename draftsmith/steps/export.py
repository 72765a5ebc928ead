"""Export a trained drafter to the z-lab DFlash directory format (config.json + model.safetensors)."""

from __future__ import annotations

import argparse

import torch
from transformers import AutoTokenizer

from draftsmith.drafter.zlab import export
from draftsmith.target.files import load_target_head

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--train-dir", required=True, help="output directory of the train step")
    p.add_argument(
        "--target", required=True, help="target model directory (checked for the embedding/LM head)"
    )
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    a = p.parse_args(argv)
    load_target_head(a.target)  # fail now, not at serving time, if the target lacks what the drafter borrows
    print(export(a.train_dir, a.out, DTYPES[a.dtype], tokenizer=AutoTokenizer.from_pretrained(a.target)))


if __name__ == "__main__":
    main()
