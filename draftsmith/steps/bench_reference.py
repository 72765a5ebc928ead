"""The target's answers to one part of a bench prompt set, for every drafter's bench job to replay against
(see draftsmith.speculative.reference)."""

from __future__ import annotations

from draftsmith.config import section_arg
from draftsmith.core.runtime import set_threads, setup_logging
from draftsmith.speculative.bench_parts import part_job_parser
from draftsmith.speculative.reference import run_reference
from draftsmith.target.files import resolve_target


def main(argv: list[str] | None = None) -> None:
    ap = part_job_parser(__doc__, out_help="the answers, JSON lines")
    ap.add_argument("--dataset", required=True, help="the prompt set's name in the config")
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
