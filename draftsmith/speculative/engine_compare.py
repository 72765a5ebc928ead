"""The engine bench's figures, read without the engine: the served drafter's outputs against the engine's own
greedy ones, and the engine's acceptance beside the replay's on the same prompts (docs/serving.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftsmith.speculative.engine_metrics import spec_decode_summary

GAP_TOLERANCE = 0.05  # the bar: engine and replay agree within 5% (pooled)


def parting(greedy: Sequence[int], spec: Sequence[int], top: Sequence[dict] | None) -> dict | None:
    """Where the drafter's output leaves the engine's greedy one (None where they are equal), and the margin
    there from the greedy pass's top log-probabilities: log p(greedy token) - log p(drafted-path token). The
    margin is a lower bound (`at_least`) when the other token is not among the top ones returned."""
    n = min(len(greedy), len(spec))
    i = next((k for k in range(n) if greedy[k] != spec[k]), n)
    if i == n and len(greedy) == len(spec):
        return None
    out: dict[str, Any] = {"index": i, "margin": None, "at_least": False}
    if i == n or not top or i >= len(top) or not top[i]:
        return out  # one stopped where the other went on: no token pair to weigh
    lps = {int(k): float(v) for k, v in top[i].items()}
    mine = lps.get(int(greedy[i]))
    if mine is None:
        return out
    other = lps.get(int(spec[i]))
    out["margin"] = mine - (other if other is not None else min(lps.values()))
    out["at_least"] = other is None
    return out


def tokens_per_s(timing: dict) -> float:
    return float(timing["tokens"]) / max(float(timing["seconds"]), 1e-9)


def engine_summary(run: dict) -> dict:
    """One dataset's engine run (`steps.engine_bench`'s record) summarized: acceptance from the counters of
    the batch-1 pass, tokens/s with and without the drafter at batch 1 and at the set batch, and where the
    drafter's outputs leave the engine's greedy ones."""
    base, spec = run["passes"]["target"], run["passes"]["dflash"]
    acc = spec_decode_summary(spec["metrics_after"], spec["metrics_before"])
    # The replay's own measure: tokens a verify step commits, the first token (the prefill's) left out and
    # each answer's last step cut where the answer ends. vLLM's acceptance length also counts the drafts its
    # last step accepts past the end (trimmed from the output only afterwards), so it reads slightly high.
    acc["tokens_a_step"] = sum(max(len(o) - 1, 0) for o in spec["outputs"]) / acc["drafts"]
    tops = base.get("top_logprobs") or [None] * len(base["outputs"])
    partings = [parting(g, s, top) for g, s, top in zip(base["outputs"], spec["outputs"], tops)]
    speed = {}
    for key in ("batch1", "batch"):
        without, with_ = tokens_per_s(base[key]), tokens_per_s(spec[key])
        speed[key] = {"without": without, "with": with_, "speedup": with_ / without}
    return {
        "dataset": run["dataset"],
        "prompts": len(base["outputs"]),
        "batch": int(run["batch"]),
        "acceptance": acc,
        "tokens_per_s": speed,
        "equal": sum(p is None for p in partings),
        "partings": [{"prompt": k, **p} for k, p in enumerate(partings) if p is not None],
        "notes": list(run.get("notes") or []),
        "on_engine_text": _on_engine_text(run),
    }


def _on_engine_text(run: dict) -> dict | None:
    """The replay on the engine's own answers (`speculative.engine_replay`), pooled; None for a run
    recorded without it."""
    mine = run.get("replay_on_engine_text")
    steps = [int(c) for committed in (mine or {}).get("committed", []) for c in committed]
    return {**pooled(steps), "dtype": mine["dtype"]} if mine and steps else None


def pooled(steps: Sequence[int]) -> dict:
    """Tokens a verify step commits (tau, the bonus token counted) and the share of steps that accept at
    least i drafts, over steps pooled across prompts as the engine pools them."""
    depth = max(steps) - 1
    return {
        "tau_pooled": sum(steps) / len(steps),
        "acceptance_by_position": [sum(c - 1 >= i for c in steps) / len(steps) for i in range(1, depth + 1)],
        "steps": len(steps),
    }


def replay_acceptance(records: Sequence[dict], dataset: str) -> dict:
    """The replay's DFlash figures on a dataset, pooled as the engine pools them."""
    mine = [r for r in records if r["dataset"] == dataset and r["method"] == "dflash" and "check" not in r]
    steps = [int(c) for r in mine for c in r["committed"]]  # the fp32 check's records hold no steps
    if not steps:
        raise ValueError(f"no DFlash records for dataset {dataset!r} in the bench's records")
    return pooled(steps)


def beside(summary: dict, replay: dict) -> dict:
    """One dataset's row: the engine against the replay, as gaps relative to the replay's tau (the engine's
    tokens a step against the replay's, the same measure): on the bench's answers, and where the run has it
    on the engine's own answers, which is the gap that says whether the engine drafts as draftsmith does."""
    engine = summary["acceptance"]["tokens_a_step"]
    gap = (engine - replay["tau_pooled"]) / replay["tau_pooled"]
    same = summary.get("on_engine_text")
    text_gap = None if same is None else (engine - same["tau_pooled"]) / same["tau_pooled"]
    return {
        "dataset": summary["dataset"],
        "prompts": summary["prompts"],
        "engine_length": summary["acceptance"]["mean_acceptance_length"],
        "engine": engine,
        "replay": replay["tau_pooled"],
        "gap": gap,
        "replay_on_engine_text": None if same is None else same["tau_pooled"],
        "text_gap": text_gap,
        "agree": abs(gap if text_gap is None else text_gap) <= GAP_TOLERANCE,
        "engine_by_position": summary["acceptance"]["acceptance_by_position"],
        "replay_by_position": replay["acceptance_by_position"],
        "tokens_per_s": summary["tokens_per_s"],
        "batch": summary["batch"],
        "equal": summary["equal"],
        "partings": summary["partings"],
        "notes": summary.get("notes", []),
    }


def _gap(gap: float | None) -> str:
    if gap is None:
        return "-"
    return f"{gap:+.1%}" + ("" if abs(gap) <= GAP_TOLERANCE else " (!)")


def _pos(values: Sequence[float], i: int) -> str:
    return f"{values[i]:.3f}" if i < len(values) else "0"


def markdown(rows: Sequence[dict], *, engine: str) -> str:
    """The report's page: acceptance beside the replay, speed with and without the drafter, and where the
    served outputs leave greedy decoding."""
    head = (
        f"| dataset | prompts | {engine}'s acceptance length | engine tokens a step | replay tau (pooled) "
        "| gap | replay on the engine's answers | gap there | pos 1 engine / replay | pos 2 engine / replay "
        "| tokens/s batch 1 without / with | speedup "
        "| tokens/s batch B without / with | speedup | equal to greedy |"
    )
    served = [r for r in rows if not r.get("skipped")]
    lines = [f"# The drafter served by {engine}", "", head, "|" + "---|" * 15]
    for r in served:
        b1, bb = r["tokens_per_s"]["batch1"], r["tokens_per_s"]["batch"]
        cells = [
            r["dataset"],
            str(r["prompts"]),
            f"{r['engine_length']:.3f}",
            f"{r['engine']:.3f}",
            f"{r['replay']:.3f}",
            _gap(r["gap"]),
            "-" if r.get("replay_on_engine_text") is None else f"{r['replay_on_engine_text']:.3f}",
            _gap(r.get("text_gap")),
            f"{_pos(r['engine_by_position'], 0)} / {_pos(r['replay_by_position'], 0)}",
            f"{_pos(r['engine_by_position'], 1)} / {_pos(r['replay_by_position'], 1)}",
            f"{b1['without']:.1f} / {b1['with']:.1f}",
            f"{b1['speedup']:.2f}x",
            f"{bb['without']:.1f} / {bb['with']:.1f} (B={r['batch']})",
            f"{bb['speedup']:.2f}x",
            f"{r['equal']}/{r['prompts']}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"(!) marks a gap past {GAP_TOLERANCE:.0%}. The gaps compare like with like: tokens a verify step "
        "commits, each answer's last step cut where it ends (the engine's own acceptance length also "
        "counts drafts accepted past an answer's end, so it reads slightly higher). The first gap is taken "
        "on the bench's answers, the second on the answers the engine served, replayed by draftsmith. A gap "
        "on the bench's answers alone means the engine answered otherwise (its kernels, or bf16 breaking "
        "near-ties another way); a gap on its own answers means it drafts otherwise than draftsmith.",
    ]
    lines += [f"- {r['dataset']}: not served: {r['skipped']}" for r in rows if r.get("skipped")]
    for r in served:
        lines += [f"- {r['dataset']}: {note}" for note in r.get("notes", [])]
        for p in r["partings"]:
            margin = (
                "no token pair to weigh"
                if p["margin"] is None
                else (f"margin {'>' if p['at_least'] else ''}{p['margin']:.3f} nats")
            )
            where = f"{r['dataset']} prompt {p['prompt']}: leaves greedy at token {p['index']}"
            lines.append(f"- {where} ({margin})")
    return "\n".join(lines) + "\n"
