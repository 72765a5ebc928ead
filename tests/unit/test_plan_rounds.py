"""The rounds weighed on the prepared shards: the answers known count at their length, the fewest rounds that
fit are taken, the layout is the one it always was, and only such a plan is kept for later parses."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from draftsmith.config import with_defaults
from draftsmith.plan.data import answered_lengths, read_shards, shard_files
from draftsmith.plan.plan import PINNED, PlanError, decide_budget, decide_rounds, pin
from draftsmith.plan.rounds import fewest_rounds, peak_tokens, piece_of_rows, round_tokens, sample_tokens
from draftsmith.plan.sizes import token_bytes

MAX_NEW = 512


def _config(in_flight: int = 2) -> dict:
    data = {"max_length": 1024, "regenerate": {"enabled": True, "max_new_tokens": MAX_NEW}}
    return {
        "data": with_defaults("data", data),
        "train": with_defaults("train", {"heldout_fraction": 0.05}),
        "extract": with_defaults("extract", {"rounds_in_flight": in_flight}),
    }


def _shards(count: int = 2, n: int = 300, seed: int = 0) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    out = []
    for s in range(count):
        prompt = rng.integers(20, 200, n)
        ids = [f"s{s}-{i}" for i in range(n)]
        out.append(pd.DataFrame({"id": ids, "prompt_len": prompt, "num_tokens": prompt}))
    return out


def _answers(shards: list[pd.DataFrame], seed: int = 1) -> pd.Series:
    rng = np.random.default_rng(seed)
    ids = [i for df in shards for i in df["id"]]
    return pd.Series(rng.integers(50, 300, len(ids)), index=ids)  # about half the cap, as SmolLM2's were


def test_known_answers_weigh_their_length_and_the_rest_their_bound():
    config = _config()
    df = _shards(1, 4)[0]
    # the second answer was cached under a longer cap: it counts as cut at this run's
    answered = pd.Series([100, 9999], index=[df["id"][0], df["id"][1]])
    tokens = sample_tokens(df, config["data"], answered)
    prompt = df["prompt_len"].to_numpy()
    assert tokens.tolist() == [prompt[0] + 100, prompt[1] + MAX_NEW, prompt[2] + MAX_NEW, prompt[3] + MAX_NEW]
    assert sample_tokens(df, config["data"]).tolist() == (prompt + MAX_NEW).tolist()


@pytest.mark.parametrize("in_flight", [1, 2])
def test_the_fewest_rounds_that_fit_are_taken_and_the_answers_known_make_them_fewer(in_flight):
    """The count chosen fits its `in_flight` largest rounds and the held-out samples into the budget, weighed
    as extraction lays them out, and one round fewer would not; the answers known shrink it."""
    config, shards = _config(in_flight), _shards()
    answered = _answers(shards)
    whole = sum(int(sample_tokens(df, config["data"]).sum()) for df in shards)
    budget = whole * 0.45  # tokens
    counts = {}
    for name, known in (("bound", None), ("answered", answered)):
        rounds = fewest_rounds(shards, config, budget_tokens=budget, answered=known)
        tokens, held = round_tokens(shards, config, rounds=rounds, answered=known)
        assert peak_tokens(tokens, held, in_flight=in_flight) <= budget
        if rounds > 2:
            fewer, held = round_tokens(shards, config, rounds=rounds - 1, answered=known)
            assert peak_tokens(fewer, held, in_flight=in_flight) > budget
        counts[name] = rounds
    assert counts["answered"] < counts["bound"], counts
    assert fewest_rounds(shards, config, budget_tokens=whole, answered=None) == 1  # all fit: one round


def test_the_plan_decides_on_the_shards_when_it_has_them_and_says_when_none_fit():
    config, shards = _config(), _shards()
    answered = _answers(shards)
    per_token = 10.0
    whole = sum(int(sample_tokens(df, config["data"], answered).sum()) for df in shards)
    budget = int(whole * per_token * 0.45)
    kw = {"config": config, "samples": 600, "base_shards": 2, "per_token": per_token}
    rounds, _ = decide_rounds(whole * per_token, budget, shards=(shards, answered), **kw)
    assert rounds == fewest_rounds(shards, config, budget_tokens=budget / per_token, answered=answered)
    with pytest.raises(PlanError, match=r"extract.disk_budget.*smallest round.*held-out samples alone"):
        decide_rounds(whole * per_token, int(whole * per_token * 0.01), shards=(shards, answered), **kw)


def test_the_layout_is_the_one_runs_in_rounds_were_laid_out_with():
    """Longest first onto the lightest piece, ties to the fewest rows and then the lowest round: the rule that
    pieces of runs already under way were cut by, now kept with a heap."""

    def by_sorting(bound: np.ndarray, rounds: int) -> np.ndarray:
        load, count = np.zeros(rounds, dtype=np.int64), np.zeros(rounds, dtype=np.int64)
        out = np.zeros(len(bound), dtype=np.int64)
        for i in np.argsort(-bound, kind="stable"):
            r = int(np.lexsort((np.arange(rounds), count, load))[0])
            out[i], load[r], count[r] = r, load[r] + bound[i], count[r] + 1
        return out

    rng = np.random.default_rng(7)
    for rounds in (2, 3, 7):
        bound = rng.integers(1, 6, 500)  # many ties
        assert (piece_of_rows(bound, rounds) == by_sorting(bound, rounds)).all(), rounds


def test_only_rounds_weighed_on_the_prepared_shards_are_kept(tmp_path):
    """A parse before `prepare` plans from an estimate; keeping its rounds held a run to them after the data
    said otherwise. The plan keeps (pins) rounds only when the shards were read."""
    config = {**_config(), "results": str(tmp_path)}
    files = shard_files(tmp_path, 2)
    assert read_shards(config, files, base_shards=2) is None  # not written yet
    plan = {"identity": {"setting": "30GB"}, "rounds": 7, "budget_bytes": 30, "rounds_measured": False}
    pin(config, plan)
    assert not (tmp_path / PINNED).exists()
    shards = _shards()
    (tmp_path / "shards").mkdir()
    for df, f in zip(shards, files, strict=True):
        df.to_parquet(f)
    (tmp_path / "answers/cache").mkdir(parents=True)
    cached = shards[0].iloc[:5].assign(num_tokens=shards[0]["prompt_len"].iloc[:5] + 40)
    cached.to_parquet(tmp_path / "answers/cache/shard000.j0.ofN.parquet")
    frames, answered = read_shards(config, files, base_shards=2)
    assert len(frames) == 2 and answered is not None and answered.tolist() == [40] * 5
    assert answered_lengths(tmp_path).index.tolist() == cached["id"].tolist()
    pin(config, {**plan, "rounds": 3, "rounds_measured": True})
    assert json.loads((tmp_path / PINNED).read_text())["rounds"] == 3


def test_a_rounds_extraction_stops_when_the_plan_kept_another_count(tmp_path):
    """The round jobs of a DAG built from an estimate meet the count the plan rule kept from the prepared
    shards: another count stops them before any GPU work, and says to rerun."""
    from draftsmith.steps.extract import settled_rounds

    path = tmp_path / PINNED
    assert settled_rounds(path, 3) is None  # not weighed yet: the job goes on, as before any plan rule
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"identity": {"in_flight": 2}, "rounds": 3, "budget_bytes": 30}))
    assert settled_rounds(path, 3)["rounds"] == 3
    with pytest.raises(SystemExit, match=r"DAG has 7 rounds, but the plan kept 3.*Rerun snakemake"):
        settled_rounds(path, 7)


def _decide(config: dict, shards) -> dict:
    plan = {"storage": "bf16", "taps": 5, "hidden_size": 32, "tokens": 10**6}
    decide_budget(config, plan, per_token=10.0, reserves=0, samples=600, base_shards=2, shards=shards)
    return plan


def test_kept_rounds_hold_for_the_shards_they_were_weighed_on_only(tmp_path):
    """A data change rebuilds the shards: rounds kept for the old ones are decided again. A parse that can
    only estimate drops another setting's kept rounds, so no round job meets them."""
    config = {**_config(), "results": str(tmp_path)}
    config["extract"] = {**config["extract"], "disk_budget": "2MB"}
    shards = _shards()
    first = _decide(config, (shards, None))
    pin(config, first)
    assert _decide(config, (shards, None))["pinned"]  # the same shards: kept
    fewer = [df.iloc[:150] for df in shards]
    again = _decide(config, (fewer, None))
    assert not again["pinned"] and again["rounds"] < first["rounds"]
    config["extract"] = {**config["extract"], "disk_budget": "2.5MB"}
    assert not _decide(config, None)["pinned"] and not (tmp_path / PINNED).exists()


def test_a_round_that_does_not_fit_with_this_runs_answers_drops_the_kept_rounds(tmp_path):
    """The plan may weigh answers cached under other settings; a round's extraction weighs this run's, and
    when they do not fit it stops and drops the kept rounds, so the rerun plans again instead of stopping on
    the same count."""
    from draftsmith.steps.extract import check_round

    config, shards = _config(in_flight=1), _shards()
    files = shard_files(tmp_path, 2)
    (tmp_path / "shards").mkdir()
    for df, f in zip(shards, files, strict=True):
        df.to_parquet(f)
    rows = {"kind": "round", "round": 0, "rounds": 3, "heldout_fraction": 0.05, "seed": 0}
    probe = {"target": {"taps": [1, 2, 3, 4, 5], "hidden_size": 32}}
    short = _answers(shards)
    tokens, held = round_tokens(shards, config, rounds=3, answered=short)
    budget = int(peak_tokens(tokens, held, in_flight=1) * token_bytes(taps=5, hidden=32, storage="bf16"))
    pinned = tmp_path / PINNED
    pinned.parent.mkdir()
    pinned.write_text("{}")
    kw = {"in_flight": 1, "pin": pinned}
    check_round(files, rows, config["data"], budget, probe, "bf16", answered=short, **kw)  # exactly fits
    assert pinned.exists()
    longer = short + 40  # this run's answers, decoded under other settings than the cached ones
    with pytest.raises(SystemExit, match=r"with the answers written now.*rerun snakemake"):
        check_round(files, rows, config["data"], budget, probe, "bf16", answered=longer, **kw)
    assert not pinned.exists()


def test_a_grown_data_set_keeps_its_held_out_samples_held_out():
    """One round's training holds out by the ids' hash, as rounds do. With a permutation of the indices, a
    data set grown by a fifth held out mostly samples the earlier run had trained on, so a drafter trained
    further on it (train.init_from) was measured on its own training data: held-out tau 5.98 where the
    earlier held-out set gave 5.29 (docs/measurements.md, "More math prompts")."""
    from draftsmith.drafter.batches import split_indices
    from draftsmith.plan.rounds import heldout_rows

    ids = [f"gsm8k:{i}" for i in range(2000)]
    grown = ids + [f"mathqa:{i}" for i in range(400)]
    trained, held = split_indices(ids, 0.05, 0)
    trained_later, held_later = split_indices(grown, 0.05, 0)
    assert {grown[i] for i in held_later} & {ids[i] for i in trained} == set()
    assert {ids[i] for i in held} <= {grown[i] for i in held_later}
    assert 0.03 < len(held_later) / len(grown) < 0.07 and len(trained_later) + len(held_later) == len(grown)
    assert held_later.tolist() == np.flatnonzero(heldout_rows(grown, fraction=0.05, seed=0)).tolist()
    assert split_indices(grown, 0.05, 1)[1].tolist() != held_later.tolist()  # the seed draws another set


def _answered(rows: pd.DataFrame, answers: pd.Series) -> pd.DataFrame:
    """The rows as regeneration writes them: each prompt followed by its answer's tokens."""
    ids = [np.concatenate([x, np.full(answers[i], 7)]) for i, x in zip(rows["id"], rows["input_ids"])]
    return rows.assign(input_ids=ids, num_tokens=[len(x) for x in ids])


def test_an_extraction_job_weighs_the_answers_it_will_reuse_at_their_length(tmp_path):
    """The pre-GPU disk check of a one-round extraction job weighs an answer at its length where its
    regeneration will reuse it, found as regeneration finds it (the target, decoding settings and prompt all
    the same), and the rest at the bound. At the bound, a job beside carried answers stopped for 53 GB when
    its states took 29.5 GB."""
    from draftsmith.dataset.regenerate import cache_key
    from draftsmith.steps.extract import job_tokens

    config = _config()
    data, target = config["data"], {"path": "some/target", "dtype": "bfloat16"}
    df = _shards(1, 8)[0]
    df["input_ids"] = [np.arange(n, dtype=np.int32) for n in df["prompt_len"]]
    known = _answers([df])
    changed = df.iloc[3:4].assign(input_ids=lambda d: [x + 1 for x in d["input_ids"]])  # another prompt
    files = {  # name: (rows, the target they were answered by)
        "answers/cache/shard000": (df.iloc[0:3], target),
        "answers/cache/old": (df.iloc[4:5], {**target, "path": "another/target"}),
        "extract/regen/other": (changed, target),
    }
    for name, (rows, by) in files.items():
        path = tmp_path / f"{name}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = _answered(rows, known)
        rows.to_parquet(path)
        key = cache_key(by, data["regenerate"], int(data["max_length"]), rows)
        path.with_suffix(".json").write_text(json.dumps({"key": key}))
    out = tmp_path / "extract" / "shard000.safetensors"

    tokens = job_tokens(df, out, tcfg=target, dcfg=data, regenerate=True)
    prompt = df["prompt_len"].to_numpy()
    reused = prompt[:3] + known[df["id"][:3]].to_numpy()
    assert tokens == reused.sum() + (prompt[3:] + MAX_NEW).sum()
    assert job_tokens(df, out, tcfg=target, dcfg=data, regenerate=False) == df["num_tokens"].sum()
