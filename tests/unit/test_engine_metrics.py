"""The engine bench's CPU side: vLLM's spec-decoding counters from a recorded SmolLM2 run, summarized and
set beside draftsmith's replay tau."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsmith.speculative.engine_metrics import (
    ACCEPTED,
    ACCEPTED_PER_POS,
    DRAFTS,
    metric_records,
    spec_decode_summary,
)

RECORDED = Path(__file__).resolve().parents[1] / "data" / "vllm_metrics_smollm2.json"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(RECORDED.read_text())


def test_summary_reproduces_the_engines_figures(recorded):
    s = spec_decode_summary(recorded["records"])
    assert (s["drafts"], s["draft_tokens"], s["accepted_tokens"]) == (1000, 15000, 164)
    assert s["mean_acceptance_length"] == pytest.approx(1.164)
    by_pos = s["acceptance_by_position"]
    assert len(by_pos) == recorded["run"]["num_speculative_tokens"] == 15
    assert by_pos[:2] == pytest.approx([0.152, 0.012])
    assert by_pos[2:] == [0.0] * 13
    # vLLM's mean acceptance length is 1 + the sum of the per-position rates
    assert s["mean_acceptance_length"] == pytest.approx(1 + sum(by_pos))
    assert s["draft_acceptance_rate"] == pytest.approx(164 / 15000)


def test_baseline_snapshot_is_subtracted_and_engines_are_summed():
    def counters(drafts: int, accepted: int, per_pos: list[int], engine: str) -> list[dict]:
        labels = {"engine": engine}
        return [
            {"name": DRAFTS, "labels": labels, "value": drafts},
            {"name": "vllm:spec_decode_num_draft_tokens", "labels": labels, "value": 3 * drafts},
            {"name": ACCEPTED, "labels": labels, "value": accepted},
            {"name": ACCEPTED_PER_POS, "labels": labels, "values": per_pos},
        ]

    after = counters(30, 20, [12, 6, 2], "0") + counters(10, 5, [4, 1, 0], "1")
    warmup = counters(10, 8, [5, 2, 1], "0")
    s = spec_decode_summary(after, warmup)
    assert (s["drafts"], s["draft_tokens"], s["accepted_tokens"]) == (30, 90, 17)
    assert s["acceptance_by_position"] == pytest.approx([11 / 30, 5 / 30, 1 / 30])
    assert s["mean_acceptance_length"] == pytest.approx(1 + 17 / 30)


@pytest.mark.parametrize("missing", [DRAFTS, ACCEPTED, ACCEPTED_PER_POS])
def test_a_missing_metric_is_named(recorded, missing):
    records = [r for r in recorded["records"] if r["name"] != missing]
    with pytest.raises(ValueError, match=f"no '{missing}' among"):
        spec_decode_summary(records)


def test_no_drafts_is_an_error(recorded):
    records = [dict(r, value=0) if r["name"] == DRAFTS else r for r in recorded["records"]]
    with pytest.raises(ValueError, match="drafted nothing"):
        spec_decode_summary(records)


def test_adapter_reads_name_value_and_values():
    objs = [
        SimpleNamespace(name=DRAFTS, labels={"engine": 0}, value=1000),
        SimpleNamespace(name=ACCEPTED_PER_POS, labels={}, values=[152, 12, 0]),
        SimpleNamespace(name="vllm:kv_cache_usage_perc", value=0.25),
        SimpleNamespace(name="vllm:e2e_request_latency_seconds", count=10, sum=1.5, buckets={"+Inf": 10}),
    ]
    assert metric_records(objs) == [
        {"name": DRAFTS, "labels": {"engine": "0"}, "value": 1000},
        {"name": ACCEPTED_PER_POS, "values": [152, 12, 0]},
        {"name": "vllm:kv_cache_usage_perc", "value": 0.25},
    ]
    assert isinstance(metric_records(objs)[0]["value"], int)


def test_adapter_output_round_trips_through_json_into_the_summary(recorded):
    objs = [SimpleNamespace(**r) for r in recorded["records"]]
    records = json.loads(json.dumps(metric_records(objs)))
    assert records == recorded["records"]
    assert spec_decode_summary(records)["mean_acceptance_length"] == pytest.approx(1.164)
