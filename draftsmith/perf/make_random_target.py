"""Save a random-weight target of a real shape (and long-sample data) to run the whole workflow at real
size."""

from __future__ import annotations

import argparse

from draftsmith.core.runtime import setup_logging
from draftsmith.perf.shapes import save_random_target, write_long_records


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", required=True, help="configs/shapes/*.json or a preset name")
    p.add_argument("--tokenizer", required=True, help="a model directory whose tokenizer the target borrows")
    p.add_argument("--out", required=True)
    p.add_argument("--num-layers", type=int, default=None)
    p.add_argument("--data-out", default=None, help="also write prompt/response records of realistic lengths")
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--lengths", default="loguniform:64:8192")
    args = p.parse_args(argv)
    setup_logging()
    save_random_target(args.shape, args.tokenizer, args.out, args.num_layers)
    if args.data_out:
        write_long_records(args.data_out, args.tokenizer, args.samples, args.lengths)


if __name__ == "__main__":
    main()
