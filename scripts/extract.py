"""Extract one shard: take devices from the GPU pool, load the target once, (regenerate,) write tap states."""

import argparse
import logging
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from draftsmith import data, extract, gpu_pool, store
from draftsmith.cli import json_arg, set_threads, setup_logging
from draftsmith.config import content_hash, resolve_taps
from draftsmith.regenerate import NoRoomForAnswers, cache_key, regenerate_cached

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--target", required=True)
p.add_argument("--shard", required=True, help="prepared shard (parquet)")
p.add_argument("--probe", required=True)
p.add_argument("--target-json", required=True)
p.add_argument("--data-json", required=True)
p.add_argument("--taps-json", required=True)
p.add_argument("--extract-json", required=True)
p.add_argument("--budget-div", type=int, default=1, help="Snakemake's retry halves the token budget")
p.add_argument("--threads", type=int, default=None)
p.add_argument("--out", required=True, help="shard .safetensors")
p.add_argument("--manifest", required=True, help="shard manifest .json")
args = p.parse_args()
setup_logging()
set_threads(args.threads)
tcfg, dcfg, tapcfg, ecfg = (json_arg(x) for x in (args.target_json, args.data_json, args.taps_json, args.extract_json))
plan = store.read_json(args.probe)
samples = data.read_samples(args.shard)
regen = dcfg.get("regenerate") or {}
try:  # before any GPU work: a full disk is a message now, not a crash hours in
    need = extract.check_disk_space(args.out, extract.planned_tokens(samples, regen, int(dcfg["max_length"])),
                                    len(samples), len(plan["target"]["taps"]), int(plan["target"]["hidden_size"]),
                                    ecfg.get("storage", "bf16"))
except OSError as e:
    logging.error("%s", e)
    sys.exit(f"extract: {e}")
logging.info("disk: the shard needs about %.3f GB", need / 1e9)
with gpu_pool.acquire(plan["gpus_per_copy"]) as devices:
    model, tok, device = extract.load_configured_target(args.target, devices, tcfg)
    kernels = extract.report_kernels(model)
    cfg = model.config.get_text_config()
    taps = resolve_taps(cfg.num_hidden_layers, tapcfg)
    regen_stats = None
    if regen.get("enabled"):
        # answers kept beside the shards, reused by any rerun; a retry after running out of memory also halves
        # the slots
        cache = Path(args.out).parent / "regen" / f"{Path(args.out).stem}.parquet"
        slots = max(1, int(regen.get("batch_size", 64)) // max(1, args.budget_div))
        try:
            samples, regen_stats = regenerate_cached(
                model, tok, samples, cache, cache_key(tcfg, regen, int(dcfg["max_length"]), samples),
                max_new_tokens=int(regen["max_new_tokens"]), temperature=float(regen["temperature"]),
                max_length=int(dcfg["max_length"]), slots=slots, seed=int(regen.get("seed", 0)),
                top_p=float(regen.get("top_p", 1.0)), sync_every=int(regen.get("sync_every", 8)),
                cuda_graph=bool(regen.get("cuda_graph", True)))
        except torch.OutOfMemoryError as e:
            msg = (f"regeneration: out of memory with {slots} slots ({e}). Snakemake retries the job once with half "
                   f"the slots; if that fails too, set data.regenerate.batch_size below {slots}")
            logging.error("%s", msg)
            sys.exit(msg)
        except (NoRoomForAnswers, NotImplementedError) as e:
            logging.error("regeneration: %s", e)
            sys.exit(f"regeneration: {e}")
    budget = max(1, int(plan["token_budget"]) // max(1, args.budget_div))
    logging.info("shard %s: %d samples, %d tokens, taps %s, token budget %d, devices %s", args.shard, len(samples),
                 int(samples["num_tokens"].sum()), taps, budget, devices or "cpu")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    try:
        checksum, stats = extract.extract_samples(model, samples, taps, args.out, budget, ecfg.get("storage", "bf16"),
                                                  pad)
    except torch.OutOfMemoryError as e:
        msg = (f"extract: out of memory at token budget {budget} ({e}); the partial shard was removed. Snakemake "
               f"retries the job once with half the budget; if that fails too, set extract.token_budget below {budget}")
        logging.error("%s", msg)
        sys.exit(msg)
manifest = {
    "format": "draftsmith-shard-v1",
    "file": Path(args.out).name,
    "shard": Path(args.out).stem,
    "config_hash": content_hash(tcfg, dcfg, taps, ecfg.get("storage", "bf16")),
    "model": tcfg["model"],
    "revision": tcfg.get("revision"),
    "model_path": str(args.target),
    "taps": taps,
    "hidden_size": cfg.hidden_size,
    "num_layers": cfg.num_hidden_layers,
    "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    "storage": ecfg.get("storage", "bf16"),
    "regenerated": bool(regen.get("enabled")),
    "regeneration": None if regen_stats is None else asdict(regen_stats),
    "regeneration_reused": bool(regen.get("enabled")) and regen_stats is None,  # answers from extract/regen/
    "kernels": kernels,
    "num_samples": len(samples),
    "num_tokens": int(samples["num_tokens"].sum()),
    "loss_tokens": int(sum(int(np.sum(m)) for m in samples["loss_mask"])),
    "sample_ids": samples["id"].tolist(),
    "sample_tokens": samples["num_tokens"].astype(int).tolist(),
    "checksum": checksum,
    "stats": stats.as_dict(),
}
store.write_json(args.manifest, manifest)
