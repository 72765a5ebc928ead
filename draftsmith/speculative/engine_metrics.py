"""vLLM's own speculative-decoding counters, summarized and set beside draftsmith's replay tau (issue 38)."""

# Read from vLLM 0.22.0 as released (wheel vllm-0.22.0-cp38-abi3-manylinux_2_28_x86_64, commit g0b3ba88f1):
# - vllm/v1/spec_decode/metrics.py (SpecDecodingProm) registers four counters: vllm:spec_decode_num_drafts,
#   vllm:spec_decode_num_draft_tokens, vllm:spec_decode_num_accepted_tokens, and
#   vllm:spec_decode_num_accepted_tokens_per_pos (one counter per draft position, label `position`); its
#   SpecDecodingLogging takes the mean acceptance length as 1 + accepted / drafts (the bonus token counted)
#   and the acceptance at position i as accepted_per_pos[i] / drafts.
# - vllm/v1/metrics/reader.py: LLM.get_metrics() (vllm/entrypoints/llm.py -> LLMEngine.get_metrics) returns
#   Counter (.name, .labels, .value), Gauge (.value), Histogram (.count, .sum, .buckets) and, for the
#   per-position counter only, Vector (.values). One record per engine (label `engine`) under data parallel.
# - LLM(...) sets disable_log_stats=True unless told otherwise, and get_metrics() then fails an assertion:
#   the engine bench must pass disable_log_stats=False. The counters are the process's: subtract a snapshot
#   taken before the measured prompts (`baseline`) to leave out warm-up.

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def metric_records(metrics: Iterable[Any]) -> list[dict[str, Any]]:
    """vLLM's metric objects as plain dicts, so a run's figures can be saved as JSON and read without vLLM.

    Duck-typed on `.name` and `.values` (a Vector) or `.value` (a Counter or Gauge); histograms have neither
    and are left out, since the summary reads counters only.
    """
    records: list[dict[str, Any]] = []
    for metric in metrics:
        record: dict[str, Any] = {"name": str(metric.name)}
        labels = getattr(metric, "labels", None)
        if labels:
            record["labels"] = {str(k): str(v) for k, v in labels.items()}
        if getattr(metric, "values", None) is not None:
            record["values"] = [_number(v) for v in metric.values]
        elif getattr(metric, "value", None) is not None:
            record["value"] = _number(metric.value)
        else:
            continue
        records.append(record)
    return records


def _number(x: Any) -> int | float:
    """Counters as ints (vLLM's reader already makes them so), anything else as a float."""
    return int(x) if float(x).is_integer() else float(x)


def _total(records: Sequence[dict[str, Any]], name: str) -> int:
    """A counter summed over its records (one per engine under data parallel)."""
    found = [r for r in records if r["name"] == name]
    if not found:
        raise ValueError(f"no {name!r} among the engine's metrics: was speculative decoding enabled?")
    return sum(int(r["value"]) for r in found)


def _vector(records: Sequence[dict[str, Any]], name: str) -> list[int]:
    """A per-position counter summed position by position over its records."""
    found = [r["values"] for r in records if r["name"] == name]
    if not found:
        raise ValueError(f"no {name!r} among the engine's metrics: was speculative decoding enabled?")
    out = [0] * max(len(v) for v in found)
    for values in found:
        for i, v in enumerate(values):
            out[i] += int(v)
    return out


def spec_decode_summary(
    records: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The engine's acceptance as vLLM itself defines it, so it can be compared with the replay's tau.

    `baseline`, the records read before the measured prompts, is subtracted (vLLM's counters never reset).
    """
    names = (DRAFTS, DRAFT_TOKENS, ACCEPTED)
    drafts, draft_tokens, accepted = (_total(records, n) for n in names)
    per_pos = _vector(records, ACCEPTED_PER_POS)
    if baseline:
        drafts, draft_tokens, accepted = (
            now - _total(baseline, n) for now, n in zip((drafts, draft_tokens, accepted), names)
        )
        before = _vector(baseline, ACCEPTED_PER_POS)
        per_pos = [v - (before[i] if i < len(before) else 0) for i, v in enumerate(per_pos)]
    if drafts <= 0:
        raise ValueError(f"{DRAFTS} is {drafts}: the engine drafted nothing, so acceptance is undefined")
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "mean_acceptance_length": 1 + accepted / drafts,  # the bonus token counted, as vLLM logs it
        "acceptance_by_position": [a / drafts for a in per_pos],
        "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else float("nan"),
    }
