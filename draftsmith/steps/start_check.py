"""Check `train.init_from`'s drafter against the target and the settled mask token, before any extraction.

A job of its own, present only when `train.init_from` is set: the parse checks what the config and a target
on this machine say, and this job repeats it for targets a job makes (the demo, a converted GGUF, a hub target
not cached), where the target's depth, width and taps are known only once that job ran. Its priority starts
it before the data jobs; training reads its output, so a drafter of another shape never reaches a step.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from draftsmith.core.io import write_json
from draftsmith.core.logs import json_arg, setup_logging
from draftsmith.drafter.start import start_problems
from draftsmith.preflight import problems_message
from draftsmith.target.files import resolve_target, text_config


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True, help="model directory, hub id or fetched lock file")
    p.add_argument("--token", required=True, help="the mask token id mask_check settled (a file)")
    p.add_argument("--start-json", required=True, help="results, drafter, taps and train.init_from")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    setup_logging()
    config, mask = json_arg(args.start_json), int(Path(args.token).read_text().strip())
    problems = start_problems(config, text_config(resolve_target(args.target)), mask_token_id=mask)
    if problems:
        raise SystemExit(problems_message(problems))
    logging.info("train.init_from: %s is a drafter of this config's shape", config["train"]["init_from"])
    write_json(args.out, {"init_from": config["train"]["init_from"], "mask_token_id": mask})


if __name__ == "__main__":
    main()
