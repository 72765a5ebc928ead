"""Build the embedded demo: a tiny hybrid target model (trained on stdlib sources) and its chat data."""

from __future__ import annotations

import argparse

from draftsmith.core.runtime import setup_logging
from draftsmith.demo.data import build_demo_data
from draftsmith.demo.target import DEFAULT_STEPS, build_demo_target


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target-out", required=True, help="directory for the model + tokenizer (hub layout)")
    p.add_argument("--data-out", required=True, help="directory for train.jsonl and prompts.jsonl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps of the target")
    p.add_argument("--n-train", type=int, default=400, help="conversations in train.jsonl")
    p.add_argument("--n-prompts", type=int, default=16, help="benchmark prompts in prompts.jsonl")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: every CPU this job may use)"
    )
    args = p.parse_args(argv)
    setup_logging()
    build_demo_target(args.target_out, seed=args.seed, steps=args.steps, threads=args.threads)
    build_demo_data(
        args.target_out, args.data_out, seed=args.seed, n_train=args.n_train, n_prompts=args.n_prompts
    )


if __name__ == "__main__":
    main()
