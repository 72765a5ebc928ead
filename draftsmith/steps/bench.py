"""Benchmark a drafter against its target on one part of a prompt set (see
draftsmith.speculative.bench.run_bench)."""

from __future__ import annotations

import json

from draftsmith.config import section_arg
from draftsmith.core.runtime import set_threads, setup_logging
from draftsmith.speculative.bench import run_bench
from draftsmith.speculative.bench_parts import part_job_parser
from draftsmith.target.files import resolve_target


def main(argv: list[str] | None = None) -> None:
    ap = part_job_parser(__doc__, out_help="records, JSON lines")
    ap.add_argument("--drafter", required=True, help="exported drafter directory (z-lab format)")
    ap.add_argument("--dataset", default=None, help="name in the report (default: the prompt file's stem)")
    ap.add_argument("--taps-json", default=None, help="tap layer ids as JSON (default: the drafter's config)")
    ap.add_argument("--reference", default=None, help="the target's answers to this part (bench_reference)")
    a = ap.parse_args(argv)
    setup_logging()
    set_threads(a.threads)
    taps = json.loads(a.taps_json) if a.taps_json else None
    n = run_bench(
        str(resolve_target(a.target)),
        a.drafter,
        prompts_path=a.prompts,
        part=a.part,
        parts=a.parts,
        out_path=a.out,
        bench=section_arg(a.bench_json, "bench"),
        taps=taps,
        dataset=a.dataset,
        gpus=a.gpus,
        target_cfg=section_arg(a.target_json, "target"),
        reference_path=a.reference,
    )
    print(f"{n} records -> {a.out}")


if __name__ == "__main__":
    main()
