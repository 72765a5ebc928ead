"""Merge benchmark parts into results/bench: summary.csv/.md, records.jsonl and PNG plots."""

import argparse

from draftsmith.report import markdown, write_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parts", nargs="+", required=True, help="per-part record files (JSON lines)")
    ap.add_argument("--out", required=True, help="output directory")
    a = ap.parse_args()
    print(markdown(write_report(a.parts, a.out)))


if __name__ == "__main__":
    main()
