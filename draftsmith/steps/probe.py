"""Probe GPUs, the target's size and the results disk's write rate; decide GPUs per model copy, slots and the
token budget."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from draftsmith.config import resolve_taps, section_arg, with_defaults
from draftsmith.core.gpu_memory import memory_cap
from draftsmith.core.io import disk_write_rate, write_json
from draftsmith.core.runtime import json_arg, setup_logging
from draftsmith.preflight import problems_message, target_problems
from draftsmith.target.files import resolve_target, text_config
from draftsmith.target.placement import activation_bytes_per_token, decide, gpu_info, target_bytes


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True, help="model directory, hub id or fetched lock file")
    p.add_argument("--extract-json", required=True, help="the config's `extract` section")
    p.add_argument("--taps-json", required=True, help="the config's `taps` section")
    p.add_argument("--max-length", type=int, required=True)
    p.add_argument("--preflight-json", default=None, help="target and taps, checked here")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    setup_logging()
    ext, taps_cfg = section_arg(args.extract_json, "extract"), section_arg(args.taps_json, "taps")
    try:
        target = resolve_target(args.target)
        cfg = text_config(target)
    except FileNotFoundError as e:
        raise SystemExit(f"probe: {e}") from None
    # the drafter's keys are checked by mask_check; here they stand at their defaults
    checked = {"drafter": with_defaults("drafter"), **json_arg(args.preflight_json or "")}
    if args.preflight_json and (problems := target_problems(checked, cfg)):
        raise SystemExit(problems_message(problems))
    taps = resolve_taps(cfg["num_hidden_layers"], taps_cfg)
    gpus = gpu_info()
    weights, source = target_bytes(target)
    budget = ext["token_budget"]
    decision = decide(
        gpus,
        weights,
        activation_bytes_per_token(cfg, len(taps)),
        None if budget in (None, "auto") else int(budget),
        args.max_length,
        int(ext["cpu_slots"]),
    )
    out = {
        "gpus": gpus,
        "target": {
            "model": args.target,
            "weight_bytes": weights,
            "size_source": source,
            "num_layers": cfg["num_hidden_layers"],
            "hidden_size": cfg["hidden_size"],
            "taps": taps,
        },
        **decision,
        "gpu_memory_cap": memory_cap(),  # bytes a job may use of a GPU (`gpu_memory`), null for all of it
        "disk_write_gbs": disk_write_rate(Path(args.out).parent),
    }
    logging.info("probe: %s", {k: v for k, v in out.items() if k != "gpus"} | {"gpus": len(gpus)})
    write_json(args.out, out)


if __name__ == "__main__":
    main()
