"""Train a DFlash drafter on a merged hidden-state dataset (resumes from the last checkpoint in --out)."""

import argparse
import json
import sys

from draftsmith.train import run

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dataset", required=True, help="merged manifest.json")
    p.add_argument("--target", required=True, help="target model directory (config + safetensors)")
    p.add_argument("--out", required=True, help="output directory: final/, metrics.csv, curves.png, summary.json")
    p.add_argument("--drafter-json", default="{}", help="the config's `drafter` section as JSON")
    p.add_argument("--train-json", default="{}", help="the config's `train` section as JSON")
    p.add_argument("--preset-mask-token-id", type=int, default=None)
    a = p.parse_args()
    sys.exit(run(__file__, sys.argv[1:], a.dataset, a.target, a.out, json.loads(a.drafter_json),
                 json.loads(a.train_json), a.preset_mask_token_id))
