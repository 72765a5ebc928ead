"""The round-cost benchmark runs on the CPU and its constructed drafters behave as built (not a timed
test)."""

from draftsmith.perf.round_cost import round_split


def test_round_split_on_a_tiny_hybrid_target():
    rows = {r["drafter"]: r for r in round_split("tiny-hybrid", prompt_len=24, new_tokens=33)}
    oracle, rand = rows["oracle"], rows["random"]
    assert oracle["lossless"] and rand["lossless"]  # fp32 on the CPU: the real loop is exactly greedy
    assert (
        oracle["tau"] == 16 and rand["tau"] < 2
    )  # the oracle is accepted whole (B=16), the random one is not
    assert oracle["ms_per_round"]["restore"] <= rand["ms_per_round"]["restore"] + 50
    assert set(rand["ms_per_round"]) == {"draft", "verify", "restore"}
