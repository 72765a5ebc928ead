"""Check the plan against the run: the GPU-hours each stage's jobs took (their benchmark files) beside the
plan's, written to RESULTS/plan/measured.json and a page of the report."""

from __future__ import annotations

import argparse
import json
import logging

from draftsmith.core.gpu_pool import copies_sharing_a_gpu
from draftsmith.core.io import read_json, write_json, write_text
from draftsmith.core.logs import setup_logging
from draftsmith.plan.measured import benchmark_files, compare, measured_hours, render


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--plan", required=True, help="RESULTS/plan.json")
    p.add_argument("--probe", required=True, help="RESULTS/probe.json: how many slots share a GPU")
    p.add_argument(
        "--layout-json", required=True, help="benchmark templates by stage, their wildcards' values"
    )
    p.add_argument("--out", required=True)
    p.add_argument("--md", required=True)
    args = p.parse_args(argv)
    setup_logging()
    plan, probe = read_json(args.plan), read_json(args.probe)
    per_copy = max(1, int(probe["gpus_per_copy"]))  # a target job's slots
    stages = benchmark_files(json.loads(args.layout_json))
    files = {stage: [(f, n or per_copy) for f, n in jobs] for stage, jobs in stages.items()}
    rows = compare(plan, measured_hours(files, slots_a_gpu=copies_sharing_a_gpu(probe)))
    source = next((s["source"] for s in plan.get("stages", {}).values()), "none: the plan had no data")
    table = render(rows, source=source)
    logging.info("the plan against the run:\n%s", table)
    write_json(args.out, {"rows": rows, "source": source})
    write_text(args.md, "# The plan against the run\n\n" + table)


if __name__ == "__main__":
    main()
