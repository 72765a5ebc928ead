"""The engine bench's job around the engine: the two passes it asks vLLM for, their environment, and the
one clear stop where vLLM is missing from the job's environment. The passes themselves are GPU runs
(docs/serving.md)."""

import json
import subprocess
import sys

import pytest
from conftest import REPO, build_target

from draftsmith.speculative.engine_run import drafter_has_sliding_layers, engine_available, engine_env
from draftsmith.steps.engine_bench import EAGER_NOTE, SLIDING_NOTE, _notes, _passes

BENCH = {"block_size": None, "max_new_tokens": 32, "engine": {"max_model_len": "auto", "batch": 4,
         "gpu_memory_utilization": 0.5, "env": {}, "enforce_eager": False}, "temperature": 0.0}  # fmt: skip


@pytest.fixture
def drafter(tmp_path):
    d = tmp_path / "drafter"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"block_size": 8, "layer_types": ["sliding_attention", "full_attention"]})
    )
    return d


def test_both_passes_serve_the_same_prompts_one_with_the_drafter(tmp_path, tokenizer, drafter):
    target = build_target(tmp_path / "target", tokenizer, "hybrid")
    base, spec = _passes(target, str(drafter), [[1, 2, 3], [4] * 10], bench=BENCH, stop_ids=[7])
    assert (base["name"], base["drafter"], spec["name"], spec["drafter"]) == (
        "target",
        None,
        "dflash",
        str(drafter),
    )
    assert {k: v for k, v in base.items() if k not in ("name", "drafter")} == {
        k: v for k, v in spec.items() if k not in ("name", "drafter")
    }
    assert spec["num_speculative_tokens"] == 7  # a block of 8: its first slot holds the last committed token
    assert spec["max_model_len"] == 10 + 32 + 8 and spec["stop_ids"] == [7] and spec["batch"] == 4
    assert spec["hybrid"] is True  # Gated DeltaNet layers: vLLM sizes their recurrent states
    assert spec["enforce_eager"] is False  # compiled, with CUDA graphs, as an engine is served
    attention = build_target(tmp_path / "attention", tokenizer, "attention")
    assert _passes(attention, str(drafter), [[1]], bench=BENCH, stop_ids=[])[0]["hybrid"] is False
    assert drafter_has_sliding_layers(drafter)


def test_the_report_names_what_makes_the_engine_differ_from_the_replay(drafter):
    assert _notes(str(drafter), BENCH) == [SLIDING_NOTE]
    eager = {**BENCH, "engine": {**BENCH["engine"], "enforce_eager": True}, "temperature": 0.7}
    notes = _notes(str(drafter), eager)
    assert notes[:2] == [SLIDING_NOTE, EAGER_NOTE] and "0.7" in notes[2]


def test_the_engines_environment_keeps_what_the_config_sets():
    env = engine_env([0, 0, 0], {"VLLM_HOST_IP": "10.0.0.5"})
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["VLLM_HOST_IP"] == "10.0.0.5"
    assert engine_env([1, 0], {})["VLLM_HOST_IP"] == "127.0.0.1"
    # both passes on one model runner, unless the config asks for the other (the sliding-drafter case)
    assert engine_env([0], {})["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert engine_env([0], {"VLLM_USE_V2_MODEL_RUNNER": 1})["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert engine_env([0], {})["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert engine_env([0], {"VLLM_USE_FLASHINFER_SAMPLER": 1})["VLLM_USE_FLASHINFER_SAMPLER"] == "1"


@pytest.mark.skipif(engine_available(), reason="vLLM is installed here")
def test_without_vllm_the_job_stops_naming_the_extra(tmp_path, drafter):
    proc = subprocess.run(
        [sys.executable, "-m", "draftsmith.steps.engine_bench", "--target", str(tmp_path), "--drafter",
         str(drafter), "--prompts", "p.jsonl", "--dataset", "d", "--bench-json", "{}", "--out",
         str(tmp_path / "o")],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "vLLM cannot be imported in this job's environment: pip install -e '.[serve]'" in proc.stderr
