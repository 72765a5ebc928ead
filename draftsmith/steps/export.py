"""Export a trained drafter to the z-lab DFlash directory format (config.json + model.safetensors)."""

from __future__ import annotations

import argparse

import torch

from draftsmith.config import section_arg
from draftsmith.drafter.zlab import export
from draftsmith.target.files import load_target_head, resolve_target
from draftsmith.target.load import load_tokenizer

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--train-dir", required=True, help="output directory of the train step")
    p.add_argument(
        "--target", required=True, help="target model directory (checked for the embedding/LM head)"
    )
    p.add_argument("--target-json", default="{}", help="the config's target section (trust_remote_code)")
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    a = p.parse_args(argv)
    target = resolve_target(a.target)
    load_target_head(target)  # fail now, not at serving time, if the target lacks what the drafter borrows
    tokenizer = load_tokenizer(target, section_arg(a.target_json, "target"))
    print(export(a.train_dir, a.out, DTYPES[a.dtype], tokenizer=tokenizer))


if __name__ == "__main__":
    main()
