"""The engine bench's job around the engine: the two passes it asks vLLM for, their environment, and the
one clear stop where vLLM is missing from the job's environment. The passes themselves are GPU runs
(docs/serving.md)."""

import json
import subprocess
import sys

import pytest
from conftest import REPO, build_target

from draftsmith.speculative.engine_compare import markdown
from draftsmith.speculative.engine_run import (
    drafter_has_sliding_layers,
    engine_available,
    engine_env,
    engine_in_dag,
    engine_refusal,
)
from draftsmith.steps.engine_bench import EAGER_NOTE, SLIDING_NOTE, _notes, _passes, main

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


def _unservable(tmp_path, tokenizer):
    """A hybrid target whose Gated DeltaNet key heads are narrower than its value heads (as the demo's were
    until 2026-12-05): vLLM 0.22's prefill kernel does not compile for it."""
    target = build_target(tmp_path / "target", tokenizer, "hybrid")
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "linear_key_head_dim": 8}))
    return target


def test_a_target_vllm_cannot_serve_is_left_out_in_one_line(tmp_path, tokenizer, drafter):
    target = _unservable(tmp_path, tokenizer)
    hybrid = {"layer_types": ["linear_attention", "full_attention"]}
    assert engine_refusal({"linear_key_head_dim": 8, "linear_value_head_dim": 16}) is None  # no linear layers
    assert engine_refusal({**hybrid, "linear_key_head_dim": 16, "linear_value_head_dim": 16}) is None
    args = ["--target", str(target), "--drafter", str(drafter), "--prompts", "unread.jsonl", "--dataset", "d",
            "--out", str(tmp_path / "run.json")]  # fmt: skip
    main([*args, "--bench-json", "{}"])  # auto: no vLLM needed to know it, and the DAG goes on
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["dataset"] == "d"
    assert "linear_key_head_dim (8) differs from linear_value_head_dim (16)" in run["skipped"]
    page = markdown([{"dataset": "d", "skipped": run["skipped"]}], engine="vLLM")
    assert f"- d: not served: {run['skipped']}" in page.splitlines()
    with pytest.raises(SystemExit, match="bench.engine.enabled is true: set it to auto"):
        main([*args, "--bench-json", json.dumps({"engine": {"enabled": True}})])


def test_a_local_target_vllm_cannot_serve_is_known_at_parse_time(capsys):
    cfg = {"layer_types": ["linear_attention", "full_attention"], "linear_key_head_dim": 8,
           "linear_value_head_dim": 16}  # fmt: skip
    assert engine_in_dag("auto", conda=True, text_cfg=cfg) is False  # left out, as where vLLM is absent
    assert "engine bench: left out, vLLM 0.22's fused Gated DeltaNet" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="bench.engine.enabled is true, but vLLM 0.22's fused"):
        engine_in_dag(True, conda=True, text_cfg=cfg)
    assert engine_in_dag("auto", conda=True, text_cfg={**cfg, "linear_key_head_dim": 16}) is True
    assert engine_in_dag(False, conda=True, text_cfg=cfg) is False


@pytest.mark.skipif(engine_available(), reason="vLLM is installed here")
def test_without_vllm_the_job_stops_naming_the_extra(tmp_path, tokenizer, drafter):
    target = build_target(tmp_path / "target", tokenizer, "hybrid")
    proc = subprocess.run(
        [sys.executable, "-m", "draftsmith.steps.engine_bench", "--target", str(target), "--drafter",
         str(drafter), "--prompts", "p.jsonl", "--dataset", "d", "--bench-json", "{}", "--out",
         str(tmp_path / "o")],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "vLLM cannot be imported in this job's environment: pip install -e '.[serve]'" in proc.stderr
