"""Check the drafter's mask token against the prepared data: an id real text produces is refused, naming
the key.

A rule of its own after prepare, so that the drafter's and the preset's mask keys reach no job that makes
data: changing them reruns this check, not the preparation or the extraction.
"""

from __future__ import annotations

import argparse
import logging

from transformers import AutoTokenizer

from draftsmith.core.io import read_samples, write_json
from draftsmith.core.runtime import setup_logging
from draftsmith.dataset.prepare import mask_token_uses
from draftsmith.target.files import text_config


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True, help="model directory or hub id (its tokenizer and config)")
    p.add_argument("--revision", default=None)
    p.add_argument("--samples", required=True, help="prepared samples (parquet)")
    p.add_argument("--mask-token-id", type=int, default=None, help="the configured mask token, if any")
    p.add_argument("--mask-key", default="drafter.mask_token_id", help="the config key it comes from")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    setup_logging()
    mid, key = args.mask_token_id, args.mask_key
    report: dict = {"mask_token_id": mid, "key": key, "uses": 0}
    if mid is not None:
        vocab = int(text_config(args.target, args.revision)["vocab_size"])
        if not 0 <= mid < vocab:
            raise SystemExit(
                f"mask_check: {key} = {mid} is outside the target's vocabulary ({vocab} rows); use an unused "
                "id below that, or auto"
            )
        uses, first = mask_token_uses(read_samples(args.samples), mid)
        if uses:
            tok = AutoTokenizer.from_pretrained(args.target, revision=args.revision)
            raise SystemExit(
                f"mask_check: {key} = {mid} is a token the data uses ({tok.convert_ids_to_tokens(mid)!r}, "
                f"{uses} times, first in sample {first}); the drafter's mask token must be an id real text "
                "never produces. Set it to an unused id of this tokenizer, or to null (target) / auto "
                "(drafter) to pick a free row of the padded vocabulary"
            )
    logging.info("mask token: %s", "a free row of the padded vocabulary (auto)" if mid is None else f"{mid}")
    write_json(args.out, report)


if __name__ == "__main__":
    main()
