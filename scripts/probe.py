"""Probe GPUs and the target's size; decide GPUs per model copy, slots and the token budget."""

import argparse
import logging

from draftsmith import preflight, probe, store
from draftsmith.cli import json_arg, setup_logging
from draftsmith.config import resolve_taps, text_config

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--target", required=True, help="model directory or hub id")
p.add_argument("--revision", default=None)
p.add_argument("--extract-json", required=True, help="the config's `extract` section")
p.add_argument("--taps-json", required=True, help="the config's `taps` section")
p.add_argument("--max-length", type=int, required=True)
p.add_argument("--preflight-json", default=None, help="target, taps and drafter.mask_token_id, checked here")
p.add_argument("--out", required=True)
args = p.parse_args()
setup_logging()
ext, taps_cfg = json_arg(args.extract_json), json_arg(args.taps_json)
try:
    cfg = text_config(args.target, args.revision)
except FileNotFoundError as e:
    raise SystemExit(f"probe: {e}") from None
if args.preflight_json and (problems := preflight.target_problems(json_arg(args.preflight_json), cfg)):
    raise SystemExit(preflight.report(problems))
taps = resolve_taps(cfg["num_hidden_layers"], taps_cfg)
gpus = probe.gpu_info()
weights, source = probe.target_bytes(args.target, args.revision)
budget = ext.get("token_budget")
decision = probe.decide(
    gpus,
    weights,
    probe.activation_bytes_per_token(cfg, len(taps)),
    None if budget in (None, "auto") else int(budget),
    args.max_length,
    int(ext.get("cpu_slots", 2)),
)
out = {"gpus": gpus, "target": {"model": args.target, "weight_bytes": weights, "size_source": source,
       "num_layers": cfg["num_hidden_layers"], "hidden_size": cfg["hidden_size"], "taps": taps}, **decision}
logging.info("probe: %s", {k: v for k, v in out.items() if k != "gpus"} | {"gpus": len(gpus)})
store.write_json(args.out, out)
