"""Per-round cost of the DFlash real loop (draft / verify / state restore+replay) on a real-size random
target."""

from __future__ import annotations

import argparse
import json

from draftsmith.core.runtime import setup_logging
from draftsmith.perf.round_cost import round_split


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="configs/shapes/qwen3.6-27b.json")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    setup_logging()
    rows = round_split(args.shape, args.prompt_len, args.new_tokens)
    print(
        f"{'drafter':8} {'rounds':>6} {'tau':>5} {'draft ms':>9} {'verify ms':>10} {'restore ms':>11} "
        f"{'ms/token':>9} {'AR ms/token':>12} lossless"
    )
    for r in rows:
        m = r["ms_per_round"]
        print(
            f"{r['drafter']:8} {r['rounds']:6d} {r['tau']:5.2f} {m['draft']:9.2f} {m['verify']:10.2f} "
            f"{m['restore']:11.2f} {r['ms_per_token']:9.2f} {r['ar_ms_per_token']:12.2f} {r['lossless']}"
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
