"""The report's tau: per-prompt mean first (as the papers and z-lab's and ddtree's scripts average it), pooled
beside it."""

import json

import pytest

from draftsmith.report import comparison, paired_differences, summarize


def _record(prompt: str, committed: list[int]) -> dict:
    return {"dataset": "d", "id": prompt, "method": "dflash", "budget": None, "block_size": 8,
            "committed": committed}  # fmt: skip


def test_tau_is_the_mean_over_prompts_and_the_pooled_one_stands_beside_it():
    df = summarize([_record("short", [2, 2]), _record("long", [8]), _record("empty", [])])
    row = df.iloc[0]
    assert row["tau"] == pytest.approx((2 + 8) / 2)  # a prompt without rounds does not count
    assert row["tau_pooled"] == pytest.approx(12 / 3)
    assert list(df.columns).index("tau") < list(df.columns).index("tau_pooled")


def test_another_runs_tau_is_compared_prompt_by_prompt_with_its_standard_error(tmp_path):
    """bench.compare: with the other run's records beside its summary, the difference is paired by prompt (the
    prompts both answered), with its standard error; without them, the two tau stand side by side alone."""
    mine = [_record("a", [4, 4]), _record("b", [2]), _record("c", [6]), _record("only-mine", [8])]
    theirs = [_record("a", [3, 3]), _record("b", [2]), _record("c", [4])]
    diffs = paired_differences(mine, theirs)
    mean, se, n = diffs[("d", "dflash", None)]
    assert n == 3 and mean == pytest.approx(1.0)  # (1 + 0 + 2) / 3 over the prompts both answered
    assert se == pytest.approx((1.0 / 3) ** 0.5)  # sample SD 1 over sqrt(3)
    other = tmp_path / "other"
    other.mkdir()
    summarize(theirs).to_csv(other / "summary.csv", index=False)
    alone = comparison(summarize(mine), "here", {"there": str(other / "summary.csv")}, mine)
    assert list(alone.columns) == ["dataset", "method", "budget", "tau (here)", "tau (there)"]
    (other / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in theirs))
    paired = comparison(summarize(mine), "here", {"there": str(other / "summary.csv")}, mine)
    assert paired["here - there (paired SE; prompts)"].tolist() == ["+1.000 (0.577; 3)"]
