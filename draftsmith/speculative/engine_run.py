"""One pass of the engine bench in vLLM: the target served alone or with the exported drafter, on prompts
already rendered to token ids, timed at batch 1 and at a set batch, with the engine's counters read before and
after. Each pass runs in a process of its own (`run_pass`), so that the GPU memory of one engine is free
before the next starts. vLLM is imported only inside that process."""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from draftsmith.core.io import write_json
from draftsmith.preflight import layer_kinds
from draftsmith.speculative.engine_metrics import metric_records
from draftsmith.speculative.vllm_plugin import register

TOP_LOGPROBS = 5  # the greedy pass's top tokens a position, for the margin where the drafter's output parts
INSTALL = "pip install -e '.[serve]', docs/serving.md"


def engine_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def engine_in_dag(setting: object, *, conda: bool = False, text_cfg: dict | None = None) -> bool:
    """Whether the DAG holds the engine bench, from `bench.engine.enabled`; says so in one line where vLLM
    is absent and the setting is auto, and raises where it is absent and required. With `conda` (Snakemake's
    --use-conda) the job's own environment (envs/serve.yaml) brings vLLM, so it is in the DAG. Where the
    target's config is at hand (`text_cfg`: a local model directory), a target vLLM cannot serve is left out
    the same way, or stops the run before any job where the engine is required."""
    if setting is False:
        return False
    refusal = engine_refusal(text_cfg) if text_cfg else None
    if refusal and setting is True:
        raise RuntimeError(f"bench.engine.enabled is true, but {refusal}: set it to auto or false")
    if refusal:
        print(f"engine bench: left out, {refusal}", file=sys.stderr)
        return False
    if conda or engine_available():
        return True
    if setting is True:
        raise RuntimeError(
            f"bench.engine.enabled is true, but vLLM cannot be imported here: {INSTALL}, or set it to auto"
        )
    print(f"engine bench: vLLM is not installed, so the bench runs without it ({INSTALL})", file=sys.stderr)
    return False


def engine_refusal(text_cfg: dict) -> str | None:
    """Why vLLM 0.22 cannot serve this target, where the target's config says so without loading vLLM; None
    where nothing is known against it. Its fused Gated DeltaNet prefill kernel (`_fused_post_conv_kernel`)
    builds one mask for key heads and another for value heads, and Triton refuses to compile it where the
    two head sizes differ (docs/serving.md)."""
    k, v = text_cfg.get("linear_key_head_dim"), text_cfg.get("linear_value_head_dim")
    hybrid = "linear_attention" in layer_kinds(text_cfg)
    if hybrid and k and v and int(k) != int(v):
        return (
            "vLLM 0.22's fused Gated DeltaNet prefill kernel does not compile where "
            f"linear_key_head_dim ({k}) differs from linear_value_head_dim ({v}); every released Qwen3.5/3.6 "
            "has them equal"
        )
    return None


def drafter_has_sliding_layers(drafter_dir: str | Path) -> bool:
    cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
    return "sliding_attention" in (cfg.get("layer_types") or [])


def engine_env(devices: list[int], extra: dict) -> dict:
    """The pass's environment: the job's devices, a loopback address for the engine's own set-up (a machine's
    hostname can resolve to an address nothing routes, where vLLM waits for ever), no usage report, the V1
    model runner for both passes, PyTorch's sampler, then `bench.engine.env`. vLLM 0.22 picks its V2 runner
    for some targets alone (Qwen3) and falls back to V1 with a DFlash drafter: without the pin the two passes
    would run different runners, and the speedup would measure them. Its start-up warms the sampler with
    top-k/top-p even for greedy requests, and FlashInfer's sampler is compiled from source there when no
    prebuilt kernels are installed; the bench is greedy, so it never uses the one it would wait for."""
    env = dict(os.environ)
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in sorted(set(devices)))
    env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.update({str(k): str(v) for k, v in extra.items()})
    return env


def run_pass(spec: dict, out: Path, *, env: dict) -> dict:
    """Runs one pass (`spec`, see `main`) in a process of its own and returns what it wrote."""
    spec_file = out.with_suffix(".spec.json")
    write_json(spec_file, spec)
    cmd = [sys.executable, "-m", __spec__.name if __spec__ else "draftsmith.speculative.engine_run"]
    done = subprocess.run([*cmd, "--spec", str(spec_file), "--out", str(out)], env=env, check=False)
    if done.returncode:
        raise SystemExit(f"engine bench: the {spec['name']} pass failed (exit {done.returncode})")
    spec_file.unlink()
    return json.loads(out.read_text())


def _llm(spec: dict):
    """vLLM's offline engine for the pass: the target, and the drafter as DFlash's speculative model. Paths
    are absolute (vLLM reads a drafter path with a dot and no slash as a class name); no prefix caching, so
    the repeated prompts of the batch-B pass are computed again, as the first time."""
    from vllm import LLM

    kwargs = dict(
        model=str(Path(spec["target"]).resolve()),
        tokenizer=str(Path(spec["target"]).resolve()),
        dtype=spec["dtype"],
        seed=0,
        max_model_len=int(spec["max_model_len"]),
        max_num_seqs=int(spec["batch"]),
        gpu_memory_utilization=float(spec["gpu_memory_utilization"]),
        tensor_parallel_size=int(spec["tensor_parallel_size"]),
        enable_prefix_caching=False,
        disable_log_stats=False,  # LLM.get_metrics() needs the engine's stats
        enforce_eager=bool(spec.get("enforce_eager", False)),
    )
    if spec["hybrid"]:  # Triton's Gated DeltaNet prefill: FlashInfer's compiles at start with nvcc
        kwargs["gdn_prefill_backend"] = "triton"
    if spec.get("drafter"):
        kwargs["speculative_config"] = {
            "method": "dflash",
            "model": str(Path(spec["drafter"]).resolve()),
            "num_speculative_tokens": int(spec["num_speculative_tokens"]),
        }
    return LLM(**kwargs)


def _timed(llm, prompts: list, params) -> tuple[list, dict]:
    """Outputs of `prompts` served together, and the seconds and new tokens it took."""
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t
    return outs, {"seconds": seconds, "tokens": sum(len(o.outputs[0].token_ids) for o in outs)}


def _top(llm, prompt, params, want: list[int]) -> list[dict] | None:
    """A prompt's top log-probabilities a token, or None where this answer is not the one timed (the
    margins would then be read on another prefix)."""
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    if [int(t) for t in out.outputs[0].token_ids] != want:
        return None
    return [{str(k): float(v.logprob) for k, v in pos.items()} for pos in (out.outputs[0].logprobs or [])]


def serve(spec: dict) -> dict:
    """The pass: a warm-up, then every prompt alone (batch 1, counters read around it), then the prompts
    `batch` at a time; the target-alone pass also asks for the top log-probabilities of each token.

    The warm-up serves the first `batch` prompts together to their end, then the first alone: vLLM compiles
    some of its Triton kernels (the drafter's input preparation, the rejection sampler) only when a step
    first needs them, and a shorter warm-up left those compilations inside the timed answers."""
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = _llm(spec)
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in spec["prompts"]]
    greedy = dict(temperature=0.0, max_tokens=int(spec["max_new_tokens"]), stop_token_ids=spec["stop_ids"])
    params = SamplingParams(**greedy)
    b = int(spec["batch"])
    for warm in (prompts[:b], prompts[:1]):
        llm.generate(warm, params, use_tqdm=False)
    before = metric_records(llm.get_metrics())
    outputs, seconds, tokens = [], 0.0, 0
    for p in prompts:
        (out,), timing = _timed(llm, [p], params)
        outputs.append([int(t) for t in out.outputs[0].token_ids])
        seconds, tokens = seconds + timing["seconds"], tokens + timing["tokens"]
    result = {"name": spec["name"], "vllm": vllm.__version__, "outputs": outputs}
    result["batch1"] = {"seconds": seconds, "tokens": tokens}
    result["metrics_before"], result["metrics_after"] = before, metric_records(llm.get_metrics())
    batch = {"seconds": 0.0, "tokens": 0}
    for i in range(0, len(prompts), b):
        _, timing = _timed(llm, prompts[i : i + b], params)
        batch = {k: batch[k] + timing[k] for k in batch}
    result["batch"] = batch
    if not spec.get("drafter"):  # one prompt at a time, as the timed answers were made
        result["top_logprobs"] = [
            _top(llm, p, SamplingParams(**greedy, logprobs=TOP_LOGPROBS), want)
            for p, want in zip(prompts, outputs)
        ]
    del llm
    gc.collect()
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--spec", required=True, help="the pass as JSON: name, target, drafter (or null), ...")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    spec = json.loads(Path(a.spec).read_text())
    register()  # the text-only Qwen3.5/3.6 class, where the entry point is not installed (a plain checkout)
    write_json(a.out, serve(spec))


if __name__ == "__main__":
    main()
