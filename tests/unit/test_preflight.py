"""Preflight at parse time, before any download or job: the first records of each data file, every bad line of
a prompt file, and a hub target not fetched yet checked against its preset's `target.expect`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.config import with_defaults
from draftsmith.preflight import EXPECT_KEYS, preflight

SHAPE = {"num_hidden_layers": 24, "hidden_size": 64, "vocab_size": 1000}  # a preset's target.expect


def config(
    tmp_path: Path, records: list[dict], *, regenerate: bool, prompts: list[dict] | None = None, **target
):
    data, bench = tmp_path / "train.jsonl", tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    bench.write_text("".join(json.dumps(p) + "\n" for p in prompts or [{"prompt": "hi"}]))
    return {
        "results": str(tmp_path / "results"),
        "target": with_defaults("target", {"model": "someone/not-fetched", **target}),
        "data": with_defaults("data", {"path": str(data), "regenerate": {"enabled": regenerate}}),
        "taps": with_defaults("taps"),
        "drafter": with_defaults("drafter"),
        "train": with_defaults("train"),
        "bench": with_defaults("bench", {"datasets": [{"name": "b", "path": str(bench)}]}),
    }


def test_a_text_corpus_stops_naming_file_and_line(tmp_path):
    cfg = config(tmp_path, [{"text": "a document"}] * 3, regenerate=True)
    problems = preflight(cfg)
    assert any(f"{tmp_path}/train.jsonl:1: record has neither `messages`" in p for p in problems), problems
    assert any(":3:" in p for p in problems)  # every bad line of the first ones, not only the first


def test_prompts_without_answers_and_regeneration_off_stop(tmp_path):
    cfg = config(tmp_path, [{"prompt": "write a sort"}, {"prompt": "and a search"}], regenerate=False)
    problems = preflight(cfg)
    assert any(
        "train.jsonl:1: a prompt without an answer" in p and "data.regenerate.enabled" in p for p in problems
    )
    assert preflight(config(tmp_path, [{"prompt": "write a sort"}], regenerate=True)) == []


def test_a_bad_prompt_file_names_every_bad_line(tmp_path):
    prompts = [
        {"prompt": "ok"},
        {"text": "no prompt"},
        {"prompt": "ok"},
        {"turns": []},
        {"id": 1, "prompt": "a"},
    ]
    prompts.append({"id": 1, "prompt": "b"})
    problems = preflight(
        config(tmp_path, [{"prompt": "p", "response": "r"}], regenerate=False, prompts=prompts)
    )
    text = "\n".join(problems)
    assert (
        "prompts.jsonl:2:" in text and "prompts.jsonl:4:" in text and "prompts.jsonl:6: duplicate id" in text
    )


@pytest.mark.parametrize(
    ("target", "taps", "says"),
    [
        ({"expect": SHAPE}, [1, 30], "out of range"),
        ({"mask_token_id": 5000, "expect": SHAPE}, "auto", "outside the vocabulary"),
    ],
)  # fmt: skip
def test_a_hub_target_not_fetched_is_checked_against_expect(tmp_path, target, taps, says):
    cfg = config(tmp_path, [{"prompt": "p", "response": "r"}], regenerate=False, **target)
    cfg["taps"]["layers"] = taps
    assert any(says in p for p in preflight(cfg)), preflight(cfg)


def test_a_hybrids_preset_on_an_attention_only_model_of_its_shape_stops(tmp_path, attention_target):
    """The Qwen3.6 preset's expect (linear and full attention) against a target whose layers are all full
    attention: the shape keys alone would let it pass."""
    text = json.loads((attention_target / "config.json").read_text())
    hybrid = {**{k: text[k] for k in EXPECT_KEYS}, "layer_kinds": ["full_attention", "linear_attention"]}
    cfg = config(tmp_path, [{"prompt": "p", "response": "r"}], regenerate=False, expect=hybrid)
    cfg["target"]["model"] = str(attention_target)
    problems = preflight(cfg)
    assert any(p.startswith("target.expect.layer_kinds:") and "full_attention, linear_attention" in p
               for p in problems), problems  # fmt: skip
    cfg["target"]["expect"]["layer_kinds"] = ["full_attention"]
    assert not any("layer_kinds" in p for p in preflight(cfg))


def test_drafter_layer_kinds_must_match_its_depth_and_window(tmp_path):
    cfg = config(tmp_path, [{"prompt": "p", "response": "r"}], regenerate=False)
    cfg["drafter"].update(num_layers=3, layer_types=["sliding_attention", "full_attention"])
    problems = preflight(cfg)
    assert any(p.startswith("drafter.layer_types: 2 kinds for drafter.num_layers 3") for p in problems)
    assert any(p.startswith("drafter.sliding_window: null") for p in problems), problems


def test_a_bench_thinking_unlike_the_datas_stops_unless_meant(tmp_path):
    cfg = config(tmp_path, [{"prompt": "p", "response": "r"}], regenerate=False)
    cfg["bench"]["thinking"] = True
    said = "bench.thinking: True, and the training answers are rendered with data.thinking: False"
    assert any(p.startswith(said) and "bench.thinking_unlike_data: true" in p for p in preflight(cfg))
    cfg["bench"]["thinking_unlike_data"] = True
    assert not any("thinking" in p for p in preflight(cfg))


def test_a_window_shorter_than_the_contexts_is_named_for_vllm(tmp_path):
    """vLLM 0.22 serves a sliding DFlash layer as full attention: where the window is shorter than the
    contexts trained on, parse time says so, names both keys, and stops nothing."""
    cfg = config(tmp_path, [{"prompt": "hi"}], regenerate=True)
    cfg["drafter"] = with_defaults("drafter", {"layer_types": ["sliding_attention", "full_attention"],
                                               "sliding_window": 64})  # fmt: skip
    notes: list[str] = []
    problems = preflight(cfg, notes)
    assert not any("sliding" in p for p in problems)
    (note,) = [n for n in notes if "vLLM" in n]
    assert "drafter.sliding_window 64 is shorter than data.max_length 512" in note
    cfg["drafter"]["sliding_window"] = 512  # the whole context trained on: vLLM serves what was trained
    notes = []
    preflight(cfg, notes)
    assert not any("vLLM" in n for n in notes)


def test_the_workflows_parse_imports_no_torch():
    """Every `snakemake` call parses the workflow, and the plan, preflight and pool run there. Through the
    shard sizes, the target's files and the fault hooks they imported torch: 2.2 of a dry run's 4.6 s on the
    demo (2026-12-06), paid by every dry run of the workflow tests and of users. What the rules import, and
    the demo's preflight and plan, must not."""
    import re
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    smk = "\n".join(p.read_text() for p in sorted((root / "workflow").rglob("*.smk")))
    modules = sorted(set(re.findall(r"^ *from (draftsmith[\w.]*) import", smk, re.M)))
    assert "draftsmith.plan.plan" in modules and "draftsmith.preflight" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "from draftsmith.plan.cli import bench_prompts, load_config\n"
        "from draftsmith.preflight import preflight\n"
        "from draftsmith.plan.plan import make_plan\n"
        "config = load_config(['config.yaml'])\n"
        "assert preflight(config) == []\n"
        "make_plan(config, paths=[], gpus=0, gpu_name=None, base_shards=2,\n"
        "          bench_prompts=bench_prompts(config))\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:300]


def test_records_of_another_shape_are_pointed_at_data_templates_and_a_bad_template_is_named(tmp_path):
    svamp = [{"Body": "Jack had 8 pens.", "Question": "How many are left?"}] * 2
    cfg = config(tmp_path, svamp, regenerate=True)
    problems = preflight(cfg)
    assert any("train.jsonl:1: record has neither" in p and "data.templates" in p for p in problems), problems
    cfg["data"]["templates"] = ["{Body} {Question}"]
    assert preflight(cfg) == []
    for bad, says in (("{Body", "expected '}'"), ("no fields", "names no field"), ("{} {}", "must be named")):
        cfg["data"]["templates"] = ["{Problem}", bad]
        problems = preflight(cfg)
        assert len(problems) == 1 and problems[0].startswith("data.templates[1]: ") and says in problems[0], (
            problems
        )


def test_a_start_drafter_of_another_shape_or_inside_the_results_stops_at_parse_time(
    tmp_path, attention_target
):
    """train.init_from, before any extraction: a folder that is not a drafter, one that this run's training
    would replace, and one whose depth, block or taps are not this config's."""
    cfg = config(tmp_path, [{"prompt": "p", "response": "r"}], regenerate=False)
    cfg["target"]["model"] = str(attention_target)
    text = json.loads((attention_target / "config.json").read_text())
    layers = text["num_hidden_layers"]
    start = tmp_path / "start"
    start.mkdir()
    cfg["train"]["init_from"] = str(start)
    assert any(p.startswith(f"train.init_from: {start} has no config.json and no model.safetensors")
               for p in preflight(cfg)), preflight(cfg)  # fmt: skip
    theirs = {
        "num_hidden_layers": cfg["drafter"]["num_layers"] + 1,
        "block_size": cfg["drafter"]["block_size"],
        "hidden_size": text["hidden_size"],
        "num_target_layers": layers,
        "dflash_config": {"target_layer_ids": [0, 1]},
    }
    (start / "config.json").write_text(json.dumps(theirs))
    (start / "model.safetensors").write_bytes(b"")
    problems = [p for p in preflight(cfg) if p.startswith("train.init_from")]
    assert len(problems) == 2, problems
    assert (
        f"drafter.num_layers is {cfg['drafter']['num_layers']} here, and {theirs['num_hidden_layers']}"
        in problems[0]
    )
    assert problems[1].startswith("train.init_from: taps is [") and "and [0, 1] in" in problems[1]
    from draftsmith.drafter.start import start_problems  # what mask_check adds, the mask token settled

    theirs["dflash_config"]["mask_token_id"] = 3
    (start / "config.json").write_text(json.dumps(theirs))
    assert start_problems(cfg, text, mask_token_id=4)[-1].startswith(
        "train.init_from: the drafter's mask token is 4 here, and 3 in"
    )
    inside = Path(cfg["results"]) / "drafter"
    inside.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (inside / name).write_bytes((start / name).read_bytes())
    cfg["train"]["init_from"] = str(inside)
    assert any("lies in what this run's training replaces" in p for p in preflight(cfg)), preflight(cfg)
    cfg["train"]["init_from"] = str(start)  # beside the results' own outputs: the run's inputs, say
    assert not any("replaces" in p for p in preflight(cfg))
