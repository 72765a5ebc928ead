"""The fp32 check: a bench that runs in bf16 reruns its first prompts with target and drafter in fp32, where
the real DFlash loop must equal greedy decoding token for token; the report counts them and lists
differences."""

import json

import torch
from conftest import save_untrained_drafter

from draftsmith.config import with_defaults
from draftsmith.report import write_report
from draftsmith.speculative.bench import run_bench


def test_bf16_bench_reruns_prompts_in_fp32_and_reports_them(attention_target, tmp_path):
    save_untrained_drafter(attention_target, tmp_path / "drafter")
    prompts = tmp_path / "prompts.jsonl"
    lines = [
        json.dumps({"id": f"p{i}", "prompt": t}) for i, t in enumerate(["def main():", "import os", "x = 1"])
    ]
    prompts.write_text("\n".join(lines) + "\n")
    bench = with_defaults("bench", {"max_new_tokens": 12, "methods": ["ar", "dflash"], "warmup": 0,
                                    "fp32_check_prompts": 2})  # fmt: skip
    out = tmp_path / "part.jsonl"
    target_cfg = with_defaults("target", {"model": str(attention_target), "dtype": "bf16"})
    run_bench(str(attention_target), str(tmp_path / "drafter"), prompts_path=str(prompts), part=0, parts=1,
              out_path=str(out), bench=bench, dataset="d", gpus=0, target_cfg=target_cfg)  # fmt: skip
    records = [json.loads(x) for x in out.read_text().splitlines()]
    main = [r for r in records if "check" not in r]
    checks = [r for r in records if r.get("check") == "fp32"]
    assert {r["dtype"] for r in main} == {"bfloat16"} and len(main) == 6
    assert [r["id"] for r in checks] == ["p0", "p1"] and all(r["exact"] for r in checks)
    assert all(r["divergence"] is None for r in checks)

    # a rerun that found every prompt done reads the models from disk again: the same records
    from draftsmith.speculative.bench import fp32_check, part_prompts

    mine = part_prompts(str(prompts), bench, part=0, parts=1)
    again = fp32_check(str(attention_target), str(tmp_path / "drafter"), mine, dataset="d", part=0, parts=1,
                       rows=main, gpus=0, target_cfg=target_cfg, bench=bench, taps=[1, 3])  # fmt: skip
    assert again == checks

    df = write_report([str(out)], tmp_path / "report")
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "fp32 check (target and drafter in fp32, DFlash): 2/2 prompts exact" in summary
    assert "in bfloat16:" in summary and len(df) == 2  # the checks stay out of the tau table


def test_no_fp32_rerun_where_the_bench_ran_in_fp32(attention_target, tmp_path):
    from draftsmith.speculative.bench import fp32_check

    bench = with_defaults("bench", {"fp32_check_prompts": 2})
    rows = [{"dtype": "float32", "method": "dflash"}]
    assert fp32_check("unused", "unused", [{}], dataset="d", part=0, parts=1, rows=rows, gpus=0,
                      target_cfg={}, bench=bench, taps=[1]) == []  # fmt: skip


def test_the_drafter_is_cast_where_it_is_and_the_target_stays_in_its_dtype(attention_target, tmp_path):
    from draftsmith.speculative.bench import load_models
    from draftsmith.speculative.proposers import ShorterBlock, fp32_drafter

    save_untrained_drafter(attention_target, tmp_path / "drafter")
    bench = with_defaults("bench", {"block_size": 3})
    target_cfg = with_defaults("target", {"model": str(attention_target), "dtype": "bf16"})
    models = load_models(str(attention_target), str(tmp_path / "drafter"), devices=[],
                          target_cfg=target_cfg, bench=bench)  # fmt: skip
    cast = fp32_drafter(models.drafter, bench)
    assert isinstance(cast, ShorterBlock) and cast.block_size == 3
    inner = cast.inner
    assert {p.dtype for p in inner.model.parameters()} == {torch.float32}
    assert inner.embed.dtype == inner.lm_head.dtype == torch.float32
    # the check computes the target in fp32 a layer at a time (tests/unit/test_upcast.py): its weights stay
    assert {p.dtype for p in models.target.parameters()} == {torch.bfloat16}
    # and inside it the drafter's embedding and head are the target's fp32 tensors, not copies
    from draftsmith.target.upcast import fp32_by_layer

    with fp32_by_layer(models.target) as target:
        shared = fp32_drafter(models.drafter, bench, target=target).inner
        assert shared.embed.data_ptr() == target.get_input_embeddings().weight.data_ptr()
        assert shared.lm_head.data_ptr() == target.get_output_embeddings().weight.data_ptr()
