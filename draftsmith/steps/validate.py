"""Validate one extraction shard; a failure names the shard and the check, and moves the shard aside."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from draftsmith.config import section_arg
from draftsmith.core.gpu_pool import acquire
from draftsmith.core.io import read_json, read_samples, write_json
from draftsmith.core.runtime import set_threads, setup_logging
from draftsmith.dataset.shards import ShardReader
from draftsmith.dataset.validate import default_tolerance, quarantine, recompute_checks, structural_checks
from draftsmith.plan.rounds import select_rows
from draftsmith.target.load import load_configured_target


def main(argv: list[str] | None = None) -> None:
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
    p.add_argument("--data-json", default=None, help="the data section (rounds: which rows the shard holds)")
    p.add_argument("--rows-json", default=None, help="the rows of --prepared the shard holds (rounds)")
    args = p.parse_args(argv)
    setup_logging()
    set_threads(args.threads)
    tcfg, ecfg = section_arg(args.target_json, "target"), section_arg(args.extract_json, "extract")
    shard, mpath = Path(args.shard), Path(args.manifest)
    name = shard.stem

    def fail(check: str, failures: list[str]) -> None:
        where = quarantine(shard, mpath, keep_states=not args.rows_json)
        msg = f"shard {name}: {check} check failed:\n  " + "\n  ".join(failures[:20])
        what = (
            "moved the shard"
            if not args.rows_json
            else "deleted its states (disk budget) and moved its manifest"
        )
        msg += f"\n{what} to {where}/; rerun snakemake to recompute only this shard"
        logging.error(msg)
        sys.exit(msg)

    manifest = read_json(mpath)
    prepared = read_samples(args.prepared)
    if args.rows_json:
        prepared = select_rows(prepared, json.loads(args.rows_json), section_arg(args.data_json, "data"))
    try:
        reader = ShardReader(shard)
    except Exception as e:  # an unreadable file is a failed shard, not a crash
        fail("file", [f"cannot read {shard}: {e}"])
    failures = structural_checks(reader, manifest, prepared)
    if failures:
        fail("structure", failures)
    plan = read_json(args.probe)
    with acquire(plan["gpus_per_copy"]) as devices:
        model, _, _ = load_configured_target(args.target, devices, tcfg)
        dtype = next(model.parameters()).dtype
        tol = ecfg["tolerance"]
        tol = default_tolerance(dtype, manifest["storage"]) if tol in (None, "auto") else float(tol)
        seed = int.from_bytes(name.encode(), "little") % (2**32)
        failures, rows = recompute_checks(model, reader, manifest, int(ecfg["validate_samples"]), tol, seed)
    if failures:
        fail("recomputation", failures)
    report = {
        "shard": name,
        "ok": True,
        "samples": len(reader),
        "checks": ["structure", "checksum", "recomputation"],
        "recomputed": rows,
        "tolerance": tol,
        "checksum": manifest["checksum"],
    }
    logging.info(
        "shard %s valid; recomputation errors %s (tolerance %.3g)",
        name,
        [f"{r['rel_error']:.2e}" for r in rows],
        tol,
    )
    write_json(args.out, report)


if __name__ == "__main__":
    main()
