"""Convert a GGUF checkpoint into a Hugging Face model directory (dequantized safetensors weights, config,
generation config, tokenizer with its chat template) that the other steps load as a target."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from draftsmith.core.runtime import setup_logging
from draftsmith.target.convert import check_gguf, convert_gguf

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gguf", required=True, metavar="FILE", help="the .gguf checkpoint")
    p.add_argument("--out", required=True, metavar="DIR", help="model directory to write (replaced whole)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="dtype of the saved weights")
    args = p.parse_args(argv)
    setup_logging()
    try:
        gguf = check_gguf(Path(args.gguf))
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"convert: {e}") from None
    convert_gguf(gguf, Path(args.out), dtype=DTYPES[args.dtype])  # logs tensors, parameters and seconds


if __name__ == "__main__":
    main()
