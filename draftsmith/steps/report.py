"""Merge benchmark parts into results/bench: summary.csv/.md, records.jsonl and PNG plots."""

from __future__ import annotations

import argparse

from draftsmith.report import markdown, write_report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parts", nargs="+", required=True, help="per-part record files (JSON lines)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--train-summary", default=None, help="results/train/summary.json (drafter accuracy)")
    ap.add_argument("--label", default="this run", help="this run's name in the comparison table")
    ap.add_argument(
        "--compare",
        nargs="*",
        default=[],
        metavar="NAME=SUMMARY_CSV",
        help="other runs' summary.csv to show tau side by side (e.g. bf16 vs fp8 storage)",
    )
    a = ap.parse_args(argv)
    compare = dict(c.split("=", 1) for c in a.compare)
    print(markdown(write_report(a.parts, a.out, a.train_summary, a.label, compare)))


if __name__ == "__main__":
    main()
