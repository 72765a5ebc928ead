"""The engine bench's figures without the engine: where the served outputs leave greedy decoding and by how
much, the replay's acceptance pooled as vLLM pools it, and the report's page."""

import json
from pathlib import Path

import pytest

from draftsmith.speculative.engine_compare import (
    beside,
    engine_summary,
    markdown,
    parting,
    replay_acceptance,
)

RECORDED = Path(__file__).resolve().parents[1] / "data" / "vllm_metrics_smollm2.json"
RECORDED_RUN = RECORDED.with_name("vllm_engine_run_smollm2.json")  # a whole engine_bench record


def test_parting_finds_the_first_token_and_weighs_it():
    assert parting([5, 6, 7], [5, 6, 7], None) is None
    top = [{"5": -0.1}, {"6": -0.5, "9": -0.6, "3": -2.0}, {"7": -0.2}]
    assert parting([5, 6, 7], [5, 9, 7], top) == {"index": 1, "margin": pytest.approx(0.1), "at_least": False}
    # the drafted-path token is not among the top ones: the margin is at least the last one's
    assert parting([5, 6, 7], [5, 4, 7], top) == {"index": 1, "margin": pytest.approx(1.5), "at_least": True}
    # one stopped where the other went on: no pair of tokens to weigh
    assert parting([5, 6, 7], [5, 6], top) == {"index": 2, "margin": None, "at_least": False}


def test_replay_acceptance_pools_steps_as_the_engine_counts_drafts():
    records = [
        {"dataset": "gsm8k", "method": "dflash", "committed": [1, 3, 2]},
        {"dataset": "gsm8k", "method": "dflash", "committed": [4]},
        {"dataset": "gsm8k", "method": "ddtree", "committed": [9, 9]},
        {"dataset": "other", "method": "dflash", "committed": [1]},
        {"dataset": "gsm8k", "method": "dflash", "check": "fp32", "exact": True},  # no steps: the fp32 check
    ]
    r = replay_acceptance(records, "gsm8k")
    assert r["tau_pooled"] == pytest.approx(10 / 4) and r["steps"] == 4
    # accepted drafts per step 0, 2, 1, 3: at least 1 in 3 of 4 steps, at least 2 in 2, at least 3 in 1
    assert r["acceptance_by_position"] == pytest.approx([0.75, 0.5, 0.25])
    assert 1 + sum(r["acceptance_by_position"]) == pytest.approx(r["tau_pooled"])
    with pytest.raises(ValueError, match="no DFlash records for dataset 'none'"):
        replay_acceptance(records, "none")


PAD = list(range(100, 682))  # 585-token answers: 2 x 584 tokens after the first over 1000 drafts: 1.168


def _run(records: list[dict]) -> dict:
    base = {
        "outputs": [[1, 2, 3, *PAD], [1, 2, 3, *PAD]],
        "top_logprobs": [[{"1": -0.1}] * 3, [{"1": -0.1}, {"2": -0.3, "8": -0.31}, {"3": -0.1}]],
        "batch1": {"seconds": 2.0, "tokens": 6},
        "batch": {"seconds": 1.0, "tokens": 6},
    }
    spec = {
        "outputs": [[1, 2, 3, *PAD], [1, 8, 3, *PAD]],
        "batch1": {"seconds": 1.0, "tokens": 6},
        "batch": {"seconds": 0.75, "tokens": 6},
        "metrics_before": [],
        "metrics_after": records,
    }
    notes = ["the drafter has sliding layers"]
    return {"dataset": "humaneval", "batch": 2, "notes": notes, "passes": {"target": base, "dflash": spec}}


def test_engine_run_beside_the_replay_and_its_page():
    recorded = json.loads(RECORDED.read_text())
    s = engine_summary(_run(recorded["records"]))
    assert s["acceptance"]["mean_acceptance_length"] == pytest.approx(1.164)
    assert s["acceptance"]["tokens_a_step"] == pytest.approx(1.168)
    assert s["tokens_per_s"]["batch1"] == {"without": 3.0, "with": 6.0, "speedup": 2.0}
    assert s["tokens_per_s"]["batch"]["speedup"] == pytest.approx(8 / 6)
    assert s["equal"] == 1
    assert s["partings"] == [{"prompt": 1, "index": 1, "margin": pytest.approx(0.01), "at_least": False}]
    steps = [2] * 176 + [1] * 824  # a replay whose pooled tau is 1.176, as on the hand-run's prompts
    records = [{"dataset": "humaneval", "method": "dflash", "committed": steps}]
    replay = replay_acceptance(records, "humaneval")
    row = beside(s, replay)
    assert row["gap"] == pytest.approx((1.168 - 1.176) / 1.176) and row["agree"]
    page = markdown([row, {**row, "dataset": "far", "gap": 0.2, "agree": False}], engine="vLLM")
    lines = page.splitlines()
    assert lines[0] == "# The drafter served by vLLM"
    assert lines[2].startswith("| dataset | prompts | vLLM's acceptance length | engine tokens a step |")
    row_cells = "| humaneval | 2 | 1.164 | 1.168 | 1.176 | -0.7% | - | - | 0.152 / 0.176 | 0.012 / 0 |"
    assert lines[4].startswith(row_cells)
    assert "| 3.0 / 6.0 | 2.00x | 6.0 / 8.0 (B=2) | 1.33x | 1/2 |" in lines[4]
    assert "| far | 2 | 1.164 | 1.168 | 1.176 | +20.0% (!) |" in lines[5]
    assert "- humaneval prompt 1: leaves greedy at token 1 (margin 0.010 nats)" in lines
    assert "- humaneval: the drafter has sliding layers" in lines


def test_a_recorded_engine_run_of_the_h100_reads_as_its_report_did():
    """vLLM 0.22.0's own record of demo-real's drafter (engine_bench's output on an H100): the counters are
    read between the batch-1 prompts alone, as the report read them on the machine."""
    run = json.loads(RECORDED_RUN.read_text())
    s = engine_summary(run)
    acc = s["acceptance"]
    assert (acc["drafts"], acc["accepted_tokens"]) == (706, 146)  # the warm-up's and the batch's left out
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 146 / 706)
    assert acc["acceptance_by_position"][:3] == pytest.approx([134 / 706, 12 / 706, 0.0])
    assert acc["tokens_a_step"] == pytest.approx(851 / 706)  # 861 tokens, the first of each of 10 answers out
    assert s["equal"] == 10 and s["partings"] == []
    assert s["tokens_per_s"]["batch1"]["speedup"] == pytest.approx(0.5815, abs=1e-4)
    replay = {"tau_pooled": 1.197, "acceptance_by_position": [0.183, 0.014]}  # the bench's, on those prompts
    assert beside(s, replay)["agree"]


def test_a_gap_on_the_bench_answers_alone_is_the_engine_answering_otherwise():
    """The demo's hybrid target on an H100 (2026-12-05): the engine's bf16 answers left the replay's fp32 ones
    on 9 of 16 prompts, at near-ties. Its tokens a step were 8% over the replay's tau on the bench's answers,
    and 1% under it on its own answers, replayed: the engine drafts as draftsmith does."""
    run = _run(json.loads(RECORDED.read_text())["records"])
    s = engine_summary(run)
    assert s["on_engine_text"] is None  # a run recorded before the engine job replayed its answers
    engine = s["acceptance"]["tokens_a_step"]  # 1.168
    on_text = [2] * 180 + [1] * 820  # pooled 1.180
    run["replay_on_engine_text"] = {"dtype": "float32", "committed": [on_text[:400], on_text[400:], []]}
    s = engine_summary(run)
    assert s["on_engine_text"]["tau_pooled"] == pytest.approx(1.18) and s["on_engine_text"]["steps"] == 1000
    assert s["on_engine_text"]["dtype"] == "float32"
    bench_answers = {"tau_pooled": 1.08, "acceptance_by_position": [0.08]}
    row = beside(s, bench_answers)
    assert row["gap"] == pytest.approx(engine / 1.08 - 1) and row["gap"] > 0.05
    assert row["text_gap"] == pytest.approx(engine / 1.18 - 1) and row["agree"]
    line = markdown([row], engine="vLLM").splitlines()[4]
    assert "| 1.080 | +8.1% (!) | 1.180 | -1.0% |" in line
    far = beside({**s, "on_engine_text": {**s["on_engine_text"], "tau_pooled": 1.5}}, bench_answers)
    assert not far["agree"] and "| 1.500 | -22.1% (!) |" in markdown([far], engine="vLLM")


def test_a_recorded_hybrid_run_names_its_gap_the_engines_own_answers():
    """vLLM 0.22.0 serving the demo's hybrid target compiled on an H100 (2026-12-05), with the replay on its
    answers added on a CPU in fp32: 13% over the bench's replay, 1% under it on the engine's own answers."""
    run = json.loads(RECORDED_RUN.with_name("vllm_engine_run_demo_hybrid.json").read_text())
    s = engine_summary(run)
    assert s["acceptance"]["tokens_a_step"] == pytest.approx(4.021, abs=5e-4)
    assert s["on_engine_text"]["tau_pooled"] == pytest.approx(4.064, abs=5e-4)
    assert s["equal"] == 11 and [p["index"] for p in s["partings"]] == [35, 75, 57, 17, 64]
    assert s["partings"][0]["margin"] == pytest.approx(0.0, abs=1e-3)  # a tie in bf16
    replay = {"tau_pooled": 3.560, "acceptance_by_position": [0.576, 0.478]}  # the bench's, in fp32
    row = beside(s, replay)
    assert row["gap"] > 0.12 and abs(row["text_gap"]) < 0.02 and row["agree"]
