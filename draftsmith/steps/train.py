"""Train a DFlash drafter on a merged hidden-state dataset (a killed run resumes from its last checkpoint in
--out; a run of other settings or data starts afresh)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftsmith.config import section_arg
from draftsmith.core.runtime import set_threads, setup_logging
from draftsmith.drafter.train import run
from draftsmith.target.files import resolve_target
from draftsmith.target.mask import no_mask_message, settle_mask_token


def settled_drafter(
    target: Path, drafter_json: str, target_json: str, *, mask_file: str | None = None
) -> dict:
    """The drafter section with its mask token settled against the target (or a stop that names why not).
    `mask_file`: mask_check's settled id, which spares the job loading the tokenizer to settle it again (a
    run in rounds has a training job a round, each of which would load it)."""
    drafter = section_arg(drafter_json, "drafter")
    if mask_file is not None:
        token = int(Path(mask_file).read_text().strip())
        print(f"mask token {token}: settled by the mask check ({mask_file})", file=sys.stderr)
        return {**drafter, "mask_token_id": token}
    choice = settle_mask_token(target, section_arg(target_json, "target"), drafter["mask_token_id"])
    if choice.token_id is None:
        sys.exit(f"train: {no_mask_message(choice)}")
    print(f"mask token {choice.token_id}: {choice.reason}", file=sys.stderr)
    return {**drafter, "mask_token_id": choice.token_id}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dataset", required=True, help="merged manifest.json")
    p.add_argument("--target", required=True, help="target: model directory, hub id or fetched lock file")
    p.add_argument(
        "--out", required=True, help="output directory: final/, metrics.csv, curves.png, summary.json"
    )
    p.add_argument("--drafter-json", default="{}", help="the config's `drafter` section as JSON")
    p.add_argument("--train-json", default="{}", help="the config's `train` section as JSON")
    p.add_argument("--target-json", default="{}", help="the config's `target` section (mask token, template)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: every core)")
    a = p.parse_args(argv)
    setup_logging()  # the GPU pool's lines (devices taken, peak memory) go to the job's log
    set_threads(a.threads)
    import torch

    print(f"torch threads: {torch.get_num_threads()}", file=sys.stderr)
    target = resolve_target(a.target)
    drafter = settled_drafter(target, a.drafter_json, a.target_json)
    sys.exit(
        run(
            __spec__.name if __spec__ else "draftsmith.steps.train",
            sys.argv[1:] if argv is None else argv,
            a.dataset,
            str(target),
            a.out,
            drafter,
            section_arg(a.train_json, "train"),
            None,
        )
    )


if __name__ == "__main__":
    main()
