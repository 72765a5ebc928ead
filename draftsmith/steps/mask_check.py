"""Settle the drafter's mask token and check it against the prepared data: an id real text produces is
refused, naming the key.

A rule of its own after prepare, so that the drafter's and the preset's mask keys reach no job that makes
data: changing them reruns this check, not the preparation or the extraction. The workflow's parse-time
preflight makes the same choice for local targets; this job makes it for hub and converted ones, before any
extraction.
"""

from __future__ import annotations

import argparse
import logging

from draftsmith.config import section_arg
from draftsmith.core.io import read_samples, write_json, write_text
from draftsmith.core.runtime import setup_logging
from draftsmith.dataset.prepare import mask_token_uses
from draftsmith.target.files import resolve_target, text_config
from draftsmith.target.load import load_tokenizer
from draftsmith.target.mask import no_mask_message, settle_mask_token


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True, help="model directory, hub id or fetched lock file")
    p.add_argument("--target-json", default="{}", help="the config's target section (preset mask, template)")
    p.add_argument("--drafter-mask", default="auto", help="drafter.mask_token_id")
    p.add_argument("--samples", required=True, help="prepared samples (parquet)")
    p.add_argument("--out", required=True)
    p.add_argument("--token-out", default=None, help="the chosen token id alone (what training depends on)")
    args = p.parse_args(argv)
    setup_logging()
    target, tcfg = resolve_target(args.target), section_arg(args.target_json, "target")
    choice = settle_mask_token(target, tcfg, args.drafter_mask)
    mid = choice.token_id
    if mid is None:
        raise SystemExit(f"mask_check: {no_mask_message(choice)}")
    vocab = int(text_config(target)["vocab_size"])
    if not 0 <= mid < vocab:
        raise SystemExit(
            f"mask_check: mask token {mid} ({choice.reason}) is outside the target's vocabulary ({vocab} "
            "rows); use an unused id below that, or auto"
        )
    uses, first = mask_token_uses(read_samples(args.samples), mid)
    if uses:
        name = load_tokenizer(target, tcfg).convert_ids_to_tokens(mid)
        raise SystemExit(
            f"mask_check: mask token {mid} ({name!r}, {choice.reason}) is a token the data uses ({uses} "
            f"times, first in sample {first}); the drafter's mask token must be an id real text never "
            "produces. Set drafter.mask_token_id to an unused id of this tokenizer (unused special ids: "
            f"{', '.join(map(str, choice.candidates)) or 'see the tokenizer'})"
        )
    logging.info("mask token %d: %s; the prepared data never uses it", mid, choice.reason)
    write_json(args.out, {"mask_token_id": mid, "reason": choice.reason, "uses": 0})
    if args.token_out:
        write_text(args.token_out, f"{mid}\n")


if __name__ == "__main__":
    main()
