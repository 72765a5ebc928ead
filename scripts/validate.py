"""Validate one extraction shard; a failure names the shard and the check, and moves the shard aside."""

import argparse
import logging
import sys
from pathlib import Path

from draftsmith import data, extract, gpu_pool, store, validate
from draftsmith.cli import json_arg, set_threads, setup_logging

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--target", required=True)
p.add_argument("--prepared", required=True, help="prepared shard (parquet)")
p.add_argument("--shard", required=True)
p.add_argument("--manifest", required=True)
p.add_argument("--probe", required=True)
p.add_argument("--target-json", required=True)
p.add_argument("--extract-json", required=True)
p.add_argument("--threads", type=int, default=None)
p.add_argument("--out", required=True)
args = p.parse_args()
setup_logging()
set_threads(args.threads)
tcfg, ecfg = json_arg(args.target_json), json_arg(args.extract_json)
shard, mpath = Path(args.shard), Path(args.manifest)
name = shard.stem


def fail(check: str, failures: list[str]) -> None:
    where = validate.quarantine(shard, mpath)
    msg = f"shard {name}: {check} check failed:\n  " + "\n  ".join(failures[:20])
    msg += f"\nmoved the shard to {where}/; rerun snakemake to recompute only this shard"
    logging.error(msg)
    sys.exit(msg)


manifest = store.read_json(mpath)
prepared = data.read_samples(args.prepared)
try:
    reader = store.ShardReader(shard)
except Exception as e:  # an unreadable file is a failed shard, not a crash
    fail("file", [f"cannot read {shard}: {e}"])
failures = validate.structural_checks(reader, manifest, prepared)
if failures:
    fail("structure", failures)
plan = store.read_json(args.probe)
with gpu_pool.acquire(plan["gpus_per_copy"]) as devices:
    model, _, _ = extract.load_configured_target(args.target, devices, tcfg)
    dtype = next(model.parameters()).dtype
    tol = ecfg.get("tolerance")
    tol = validate.default_tolerance(dtype, manifest["storage"]) if tol in (None, "auto") else float(tol)
    seed = int.from_bytes(name.encode(), "little") % (2**32)
    failures, rows = validate.recompute_checks(model, reader, manifest, int(ecfg.get("validate_samples", 3)), tol, seed)
if failures:
    fail("recomputation", failures)
report = {"shard": name, "ok": True, "samples": len(reader), "checks": ["structure", "checksum", "recomputation"],
          "recomputed": rows, "tolerance": tol, "checksum": manifest["checksum"]}
logging.info("shard %s valid; recomputation errors %s (tolerance %.3g)", name,
             [f"{r['rel_error']:.2e}" for r in rows], tol)
store.write_json(args.out, report)
