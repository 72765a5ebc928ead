"""The report's tau: per-prompt mean first (as the papers and z-lab's and ddtree's scripts average it), pooled
beside it."""

import pytest

from draftsmith.report import summarize


def _record(prompt: str, committed: list[int]) -> dict:
    return {"dataset": "d", "id": prompt, "method": "dflash", "budget": None, "block_size": 8,
            "committed": committed}  # fmt: skip


def test_tau_is_the_mean_over_prompts_and_the_pooled_one_stands_beside_it():
    df = summarize([_record("short", [2, 2]), _record("long", [8]), _record("empty", [])])
    row = df.iloc[0]
    assert row["tau"] == pytest.approx((2 + 8) / 2)  # a prompt without rounds does not count
    assert row["tau_pooled"] == pytest.approx(12 / 3)
    assert list(df.columns).index("tau") < list(df.columns).index("tau_pooled")
