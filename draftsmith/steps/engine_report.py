"""The engine bench's page of the report: each prompt set's engine run beside the replay's figures on the same
prompts (bench/engine.md and .json)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.core.io import read_json, write_json, write_text
from draftsmith.core.runtime import setup_logging
from draftsmith.speculative.engine_compare import beside, engine_summary, markdown, replay_acceptance


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", nargs="+", required=True, help="engine_bench's records, one a prompt set")
    ap.add_argument("--records", required=True, help="the bench's records (bench/records.jsonl)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args(argv)
    setup_logging()
    records = [json.loads(line) for line in Path(a.records).read_text().splitlines() if line.strip()]
    rows = []
    for path in a.runs:
        run = read_json(path)
        if run.get("skipped"):  # the engine could not serve this target (steps.engine_bench says why)
            rows.append({"dataset": run["dataset"], "skipped": run["skipped"]})
            continue
        rows.append(beside(engine_summary(run), replay_acceptance(records, run["dataset"])))
    write_json(a.json, rows)
    write_text(a.md, markdown(rows, engine="vLLM"))


if __name__ == "__main__":
    main()
