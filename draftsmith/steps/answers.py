"""The answers' statistics of every shard as a report page: a table per shard and in all, and the lengths."""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from draftsmith.core.io import atomic, read_json, write_text  # noqa: E402
from draftsmith.dataset.answers import NGRAM, WINDOW, answers_table, combined  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--stats", nargs="+", required=True, help="shard manifests, or the answer stamps (rounds)")
    p.add_argument("--md", required=True)
    p.add_argument("--png", required=True)
    a = p.parse_args(argv)
    by_shard = {}
    for path in a.stats:
        doc = read_json(path)
        stats = doc.get("answers") if "judged" not in doc else doc["judged"]
        if stats:
            by_shard[Path(path).stem] = stats
    text = (
        "# The target's answers, judged before extraction\n\n"
        + answers_table(by_shard)
        + "\n\nShares of each shard's answers: ended with an end-of-turn token, cut at the token cap, "
        f"empty, looping (some {NGRAM}-token run twice within the last {WINDOW} tokens), writing a new turn "
        "(the template's role markers inside), thinking markers unlike data.thinking. The thresholds are "
        "data.regenerate.checks.\n"
    )
    write_text(a.md, text)
    hist = combined(list(by_shard.values()))["histogram"]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    edges = hist["edges"]
    ax.bar(edges[:-1], hist["counts"], width=[b - a for a, b in zip(edges, edges[1:])], align="edge")
    ax.set_xlabel("answer tokens")
    ax.set_ylabel("answers")
    ax.set_title("answer lengths, all shards (the last bin ends at max_new_tokens)")
    fig.tight_layout()
    with atomic(a.png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    print(text)


if __name__ == "__main__":
    main()
