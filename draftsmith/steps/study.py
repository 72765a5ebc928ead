"""The data-scaling study's table and plots from each size's training summary and bench records."""

from __future__ import annotations

import argparse

from draftsmith.study import load_size, parse_size, write_study


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", nargs="+", required=True, metavar="NAME=TRAIN_SUMMARY:PART,PART")
    ap.add_argument("--out", required=True, help="output directory: summary.csv/.md, tau_vs_tokens.png, ...")
    a = ap.parse_args(argv)
    sizes = [load_size(*parse_size(s)) for s in a.sizes]
    print(write_study(sizes, a.out).to_string())


if __name__ == "__main__":
    main()
