"""Train a DFlash drafter on a merged hidden-state dataset (resumes from the last checkpoint in --out)."""

from __future__ import annotations

import argparse
import sys

from draftsmith.config import section_arg
from draftsmith.drafter.train import run


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dataset", required=True, help="merged manifest.json")
    p.add_argument("--target", required=True, help="target model directory (config + safetensors)")
    p.add_argument(
        "--out", required=True, help="output directory: final/, metrics.csv, curves.png, summary.json"
    )
    p.add_argument("--drafter-json", default="{}", help="the config's `drafter` section as JSON")
    p.add_argument("--train-json", default="{}", help="the config's `train` section as JSON")
    p.add_argument("--preset-mask-token-id", type=int, default=None)
    a = p.parse_args(argv)
    sys.exit(
        run(
            __spec__.name if __spec__ else "draftsmith.steps.train",
            sys.argv[1:] if argv is None else argv,
            a.dataset,
            a.target,
            a.out,
            section_arg(a.drafter_json, "drafter"),
            section_arg(a.train_json, "train"),
            a.preset_mask_token_id,
        )
    )


if __name__ == "__main__":
    main()
