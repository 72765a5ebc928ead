"""The target's answers to one part of a bench prompt set, for every drafter's bench job to replay against
(see draftsmith.speculative.reference)."""

from __future__ import annotations

import argparse

from draftsmith.config import section_arg
from draftsmith.core.runtime import set_threads, setup_logging
from draftsmith.speculative.reference import run_reference
from draftsmith.target.files import resolve_target


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", required=True, help="target: model directory, hub id or fetched lock file")
    ap.add_argument("--prompts", required=True, help="prompt records, .jsonl or .parquet")
    ap.add_argument("--dataset", required=True, help="the prompt set's name in the config")
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--out", required=True, help="the answers, JSON lines")
    ap.add_argument("--bench-json", default="{}", help="the config's bench section as JSON")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs per model copy (the probe's decision)")
    ap.add_argument("--target-json", default="{}", help="the config's target section (dtype, revision, ...)")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    setup_logging()
    set_threads(a.threads)
    n = run_reference(
        str(resolve_target(a.target)),
        prompts_path=a.prompts,
        part=a.part,
        parts=a.parts,
        out_path=a.out,
        bench=section_arg(a.bench_json, "bench"),
        dataset=a.dataset,
        gpus=a.gpus,
        target_cfg=section_arg(a.target_json, "target"),
    )
    print(f"{n} prompts answered -> {a.out}")


if __name__ == "__main__":
    main()
