"""The bench in vLLM for one prompt set: the bench's prompts, rendered as the bench renders them, served by
the target alone and with the exported drafter (each in a process of its own), then the drafter's answers
replayed by draftsmith, written with a summary."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from draftsmith.config import section_arg
from draftsmith.core.gpu_pool import acquire
from draftsmith.core.io import write_json
from draftsmith.core.runtime import setup_logging
from draftsmith.preflight import layer_kinds
from draftsmith.speculative.bench import part_prompts, prompt_ids_of
from draftsmith.speculative.engine_compare import engine_summary
from draftsmith.speculative.engine_replay import engine_text_replay
from draftsmith.speculative.engine_run import (
    INSTALL,
    drafter_has_sliding_layers,
    engine_available,
    engine_env,
    engine_refusal,
    run_pass,
)
from draftsmith.target.files import resolve_target, text_config
from draftsmith.target.load import load_tokenizer, stop_ids
from draftsmith.target.mask import eos_ids_on_disk

# read from vLLM 0.22.0's DFlash drafter (qwen3_dflash.py), which reads no layer_types nor sliding_window,
# and its V2 runner, which refuses the dflash method (docs/serving.md)
SLIDING_NOTE = (
    "the drafter has sliding layers: vLLM 0.22 runs every DFlash drafter layer as full attention, so a "
    "sliding layer sees context past its window there, which training never showed it; the gap on the "
    "engine's own answers is what that costs (docs/serving.md)"
)
EAGER_NOTE = (
    "bench.engine.enforce_eager: served without compilation or CUDA graphs, so its tokens/s are not a served "
    "engine's"
)


def _notes(drafter: str, bench: dict) -> list[str]:
    """What makes the engine's figures differ from the replay's by design."""
    notes = [SLIDING_NOTE] if drafter_has_sliding_layers(drafter) else []
    if bench["engine"]["enforce_eager"]:
        notes.append(EAGER_NOTE)
    if float(bench["temperature"]) > 0:
        notes.append(
            f"the engine decodes greedily; the replay's tau at bench.temperature {bench['temperature']} "
            "is not its figure"
        )
    return notes


def _passes(
    target: Path, drafter: str, ids: list[list[int]], *, bench: dict, stop_ids: list[int]
) -> list[dict]:
    """The two passes' specs: the target alone, then with the drafter; the same prompts and settings."""
    engine, dcfg = bench["engine"], json.loads((Path(drafter) / "config.json").read_text())
    block = int(bench["block_size"] or dcfg["block_size"])
    length = engine["max_model_len"]
    if length == "auto":
        length = max(len(x) for x in ids) + int(bench["max_new_tokens"]) + block
    common = {
        "target": str(target),
        "dtype": "bfloat16",
        "prompts": ids,
        "max_new_tokens": int(bench["max_new_tokens"]),
        "stop_ids": stop_ids,
        "max_model_len": int(length),
        "gpu_memory_utilization": float(engine["gpu_memory_utilization"]),
        "batch": int(engine["batch"]),
        "num_speculative_tokens": block - 1,  # the block's first slot holds the last committed token
        "hybrid": "linear_attention" in layer_kinds(text_config(target)),
        "enforce_eager": bool(engine["enforce_eager"]),
    }
    return [{**common, "name": "target", "drafter": None}, {**common, "name": "dflash", "drafter": drafter}]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True, help="the exported drafter (z-lab format)")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--bench-json", required=True)
    ap.add_argument("--target-json", default="{}")
    ap.add_argument("--gpus", type=int, default=1, help="pool slots to hold (all of its GPUs')")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    setup_logging()
    bench, tcfg = section_arg(a.bench_json, "bench"), section_arg(a.target_json, "target")
    target = resolve_target(a.target)
    refusal = engine_refusal(text_config(target))
    if refusal and bench["engine"]["enabled"] is True:
        raise SystemExit(
            f"engine bench: {refusal}. bench.engine.enabled is true: set it to auto to go on without it"
        )
    if refusal:  # auto: the report says why in one line, and the DAG goes on
        print(f"engine bench skipped: {refusal}")
        write_json(a.out, {"dataset": a.dataset, "engine": "vllm", "skipped": refusal})
        return
    if not engine_available():
        raise SystemExit(f"engine bench: vLLM cannot be imported in this job's environment: {INSTALL}")
    tok = load_tokenizer(target, tcfg)
    records = part_prompts(a.prompts, bench, part=0, parts=1)
    ids = [prompt_ids_of(r, tok, bool(bench["thinking"])) for r in records]
    stop = stop_ids(eos_ids_on_disk(target), tok)
    specs = _passes(target, a.drafter, ids, bench=bench, stop_ids=stop)
    out = Path(a.out)
    with acquire(a.gpus) as slots, tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        gpus = list(dict.fromkeys(slots))  # the slots held are every slot of each GPU: one model on each GPU
        env = engine_env(gpus, bench["engine"]["env"])
        for spec in specs:
            spec["tensor_parallel_size"] = max(1, len(gpus))
        passes = {s["name"]: run_pass(s, Path(tmp) / f"{s['name']}.json", env=env) for s in specs}
        # the engine's processes have ended and let the GPUs go: draftsmith replays its served answers there
        on_text = engine_text_replay(str(target), a.drafter, ids, passes["dflash"]["outputs"],
                                     devices=gpus, target_cfg=tcfg, bench=bench)  # fmt: skip
    run = {
        "dataset": a.dataset,
        "engine": "vllm",
        "ids": [str(r.get("id", i)) for i, r in enumerate(records)],
        "batch": int(bench["engine"]["batch"]),
        "num_speculative_tokens": specs[0]["num_speculative_tokens"],
        "env": {k: env[k] for k in sorted(env) if k.startswith("VLLM_")},
        "notes": _notes(a.drafter, bench),
        "passes": passes,
        "replay_on_engine_text": on_text,
    }
    run["summary"] = engine_summary(run)
    write_json(out, run)
    print(json.dumps(run["summary"], indent=1))


if __name__ == "__main__":
    main()
