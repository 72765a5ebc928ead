"""Rounds: the training samples split so that each round's hidden states fit the disk budget.

The layout never depends on time or on the machine. Each base shard (the one-round run's shard, whose
answers are regenerated once) is carved into `rounds` pieces, balanced by the tokens a sample can take; round
r is piece r of every base shard, so every round keeps every GPU busy. Held-out samples are chosen by a hash
of their id and extracted once, apart from the rounds. Each epoch visits the rounds in its own seeded order;
with `extract.reuse_last_round` each epoch after the first begins with the round the one before ended with,
whose states are still on disk, so one round an epoch is not extracted again.
"""

from __future__ import annotations

import heapq
import math
import zlib

import numpy as np
import pandas as pd

HELDOUT = "heldout"  # the rows selector of the held-out samples (extracted once, kept)


def rounds_needed(bound_bytes: int, budget: int, *, base_shards: int, samples: int) -> int:
    """The fewest rounds whose pieces fit the budget. Raises when even one sample per base shard a round
    would not fit (the smallest round there can be)."""
    if budget <= 0:
        raise ValueError("no disk budget left")
    rounds = max(1, math.ceil(bound_bytes / budget))
    most = max(1, samples // max(1, base_shards))  # a piece holds at least one sample
    if rounds > most:
        raise ValueError(
            f"{rounds} rounds would be needed, but {samples} samples in {base_shards} shards allow {most}"
        )
    return rounds


def sample_bound(samples: pd.DataFrame, data: dict) -> np.ndarray:
    """Tokens each sample can take on disk: its prompt plus max_new_tokens when the target writes the answer
    (capped by max_length), else its tokens as prepared. The same figure whether read from a prepared shard or
    from its answers."""
    regen = data["regenerate"]
    if not regen["enabled"]:
        return samples["num_tokens"].to_numpy(dtype=np.int64)
    bound = samples["prompt_len"].to_numpy(dtype=np.int64) + int(regen["max_new_tokens"])
    return np.minimum(bound, int(data["max_length"]))


def sample_tokens(samples: pd.DataFrame, data: dict, answered: pd.Series | None = None) -> np.ndarray:
    """Tokens each sample takes on disk as far as is known: its prompt plus its answer where `answered`
    (answer tokens by sample id, from the answer cache) has it, else its bound. The layout stays the bound's;
    this is what the rounds weigh when the plan sizes them and checks them against the budget."""
    bound = sample_bound(samples, data)
    if answered is None or not len(answered) or not data["regenerate"]["enabled"]:
        return bound
    answer = samples["id"].map(answered)
    known = answer.notna().to_numpy()
    longest = int(data["regenerate"]["max_new_tokens"])  # an answer cached under a longer cap counts as cut
    tokens = samples["prompt_len"].to_numpy(dtype=np.int64) + np.minimum(
        answer.fillna(0).to_numpy(dtype=np.int64), longest
    )
    return np.where(known, np.minimum(tokens, int(data["max_length"])), bound)


def heldout_rows(ids: list[str], *, fraction: float, seed: int) -> np.ndarray:
    """Held-out by a hash of (seed, id): the same samples whatever the shard or round layout. A shard of two
    or more samples holds out at least one when the fraction is above 0."""
    draw = np.asarray([zlib.crc32(f"{seed}:{i}".encode()) / 2**32 for i in ids], dtype=np.float64)
    held = draw < fraction
    if fraction > 0 and len(ids) >= 2 and not held.any():
        held[int(np.argmin(draw))] = True
    return held


def piece_of_rows(bound: np.ndarray, rounds: int) -> np.ndarray:
    """The round of each row: longest first onto the lightest piece (ties to the fewest rows, then the lowest
    round), so pieces weigh about the same. A heap of (load, rows, round) keeps it O(n log rounds): the plan
    tries several round counts at parse time."""
    order = np.argsort(-bound, kind="stable")
    heap = [(0, 0, r) for r in range(rounds)]
    out = np.zeros(len(bound), dtype=np.int64)
    for i in order:
        load, count, r = heap[0]
        out[i] = r
        heapq.heapreplace(heap, (load + int(bound[i]), count + 1, r))
    return out


HELD = -1  # row_rounds' mark of a held-out sample


def row_rounds(samples: pd.DataFrame, data: dict, *, rounds: int, fraction: float, seed: int) -> np.ndarray:
    """The round of each row of a base shard, HELD for the held-out samples: the one layout that extraction,
    validation, the plan's check and training's schedule all read."""
    held = heldout_rows(samples["id"].tolist(), fraction=fraction, seed=seed)
    return _layout(held, sample_bound(samples, data), rounds)


def _layout(held: np.ndarray, bound: np.ndarray, rounds: int) -> np.ndarray:
    """row_rounds from a shard's held-out mask and its samples' bounds."""
    out = np.full(len(held), HELD, dtype=np.int64)
    out[~held] = piece_of_rows(bound[~held], rounds) if rounds > 1 else 0
    return out


def select_rows(samples: pd.DataFrame, rows: dict, data: dict) -> pd.DataFrame:
    """The rows of a base shard that one extraction job holds: `{"kind": "heldout"}` or `{"kind": "round",
    "round": r, "rounds": R}`, with `heldout_fraction` and `seed` (train's) in both."""
    where = row_rounds(
        samples,
        data,
        rounds=int(rows.get("rounds") or 1),
        fraction=float(rows["heldout_fraction"]),
        seed=int(rows["seed"]),
    )
    keep = where == (HELD if rows["kind"] == HELDOUT else int(rows["round"]))
    return samples[keep].reset_index(drop=True)


def answer_jobs(config: dict, *, rounds: int, base_shards: int, slots: int) -> int:
    """Jobs that answer each base shard's prompts when answers are regenerated ahead of the rounds:
    `data.regenerate.jobs_per_shard`, or with `auto` as many as let every slot answer at once (fewer shards
    than slots, as a run in rounds with few, cheap round jobs has). One in a single round: there each
    extraction job answers its own shard. Slots are GPUs: a target a copy of which spans several answers in
    waves."""
    regen = config["data"]["regenerate"]
    if rounds == 1 or not regen["enabled"]:
        return 1
    if regen["jobs_per_shard"] != "auto":
        return int(regen["jobs_per_shard"])
    return max(1, math.ceil(max(1, slots) / max(1, base_shards)))


def job_rows(count: int, job: int, jobs: int) -> np.ndarray:
    """The rows of a shard of `count` samples that job `job` of `jobs` answers: every jobs-th, so that each
    job's share is like the shard (a shard's rows run source by source) for its work and its answer checks."""
    return np.arange(job, count, jobs)


def whole_epochs(config: dict) -> int:
    """train.epochs as the rounds count them (a run in rounds refuses a fraction)."""
    return math.ceil(float(config["train"]["epochs"]))


def round_order(rounds: int, epoch: int, seed: int) -> list[int]:
    """The order an epoch visits the rounds in: a fresh seeded permutation each epoch."""
    return [int(r) for r in np.random.default_rng([seed, epoch, 7919]).permutation(rounds)]


def round_orders(rounds: int, epochs: int, seed: int, *, reuse_last: bool) -> list[list[int]]:
    """Each epoch's order of the rounds. With `reuse_last` an epoch after the first begins with the round the
    epoch before ended with (trained again at once on the states still on disk) and visits the others in its
    own seeded order; the first epoch's order is the same either way."""
    orders: list[list[int]] = []
    for epoch in range(epochs):
        order = round_order(rounds, epoch, seed)
        if reuse_last and orders:
            order = [orders[-1][-1], *(r for r in order if r != orders[-1][-1])]
        orders.append(order)
    return orders


def extracted_epoch(epoch: int, position: int, *, rounds: int, reuse_last: bool) -> int:
    """The epoch whose extraction of its round the (epoch, position) trains on: its own, or with `reuse_last`
    the epoch before's for an epoch's first position, which trains the round that epoch ended with."""
    return epoch - 1 if reuse_last and rounds > 1 and epoch > 0 and position == 0 else epoch


def extracted_rounds(orders: list[list[int]], *, reuse_last: bool) -> list[tuple[int, int]]:
    """Every (epoch, round) whose states are extracted, in training order."""
    rounds = len(orders[0]) if orders else 0
    return [
        (e, r)
        for e, order in enumerate(orders)
        for p, r in enumerate(order)
        if extracted_epoch(e, p, rounds=rounds, reuse_last=reuse_last) == e
    ]


def extraction_passes(epochs: int, rounds: int, *, reuse_last: bool) -> float:
    """Passes over the training samples' states that the rounds extract: one an epoch, less a round (of
    `rounds`, balanced) at each epoch's start after the first with `reuse_last`; one in all in one round."""
    if rounds == 1:
        return 1.0
    return epochs - ((epochs - 1) / rounds if reuse_last else 0.0)


def shards_fingerprint(shards: list[pd.DataFrame], data: dict) -> list[int]:
    """Samples and their bound in tokens over the base shards: what the kept rounds were weighed on."""
    return [sum(len(df) for df in shards), sum(int(sample_bound(df, data).sum()) for df in shards)]


Weighed = list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # each shard's held-out mask, bounds and tokens


def _weighed(shards: list[pd.DataFrame], config: dict, answered: pd.Series | None, *, rounds: int) -> Weighed:
    """What a count of rounds does not change: each shard's held-out samples (none in one round, where they
    are inside the one dataset), the bounds its layout is cut by and the tokens it is weighed by."""
    fraction = float(config["train"]["heldout_fraction"]) if rounds > 1 else 0.0
    seed, data = int(config["train"]["seed"]), config["data"]
    return [
        (
            heldout_rows(df["id"].tolist(), fraction=fraction, seed=seed),
            sample_bound(df, data),
            sample_tokens(df, data, answered),
        )
        for df in shards
    ]


def _tally(weighed: Weighed, rounds: int) -> tuple[np.ndarray, int]:
    total, held = np.zeros(rounds, dtype=np.int64), 0
    for held_rows, bound, tokens in weighed:
        where = _layout(held_rows, bound, rounds)
        np.add.at(total, where[where != HELD], tokens[where != HELD])
        held += int(tokens[where == HELD].sum())
    return total, held


def round_tokens(
    shards: list[pd.DataFrame], config: dict, *, rounds: int, answered: pd.Series | None = None
) -> tuple[np.ndarray, int]:
    """Tokens each round takes over all base shards, and the held-out samples': each sample's answer where
    `answered` has it, else its bound (prompt plus max_new_tokens when regenerating)."""
    return _tally(_weighed(shards, config, answered, rounds=rounds), rounds)


def peak_tokens(tokens: np.ndarray, held: int, *, in_flight: int) -> int:
    """The most tokens on disk at once: the held-out samples and the `in_flight` largest rounds (a round's
    extraction waits until the round `in_flight` places before it has trained and been deleted)."""
    return int(held + np.sort(np.asarray(tokens))[::-1][: max(1, in_flight)].sum())


def fewest_rounds(
    shards: list[pd.DataFrame], config: dict, *, budget_tokens: float, answered: pd.Series | None = None
) -> int:
    """The fewest rounds whose `extract.rounds_in_flight` largest pieces and the held-out samples fit
    `budget_tokens`, weighed on the prepared shards in the layout extraction will take, so the plan rule's
    check and each round's own check pass by construction. Raises ValueError when no round count fits."""
    in_flight = int(config["extract"]["rounds_in_flight"])
    whole = sum(int(sample_tokens(df, config["data"], answered).sum()) for df in shards)
    if whole <= budget_tokens:
        return 1
    samples = sum(len(df) for df in shards)
    most = max(1, samples // max(1, len(shards)))  # a piece holds at least one sample
    weighed = _weighed(shards, config, answered, rounds=2)  # the same at any count of rounds above one
    held = sum(int(tokens[held_rows].sum()) for held_rows, _, tokens in weighed)
    if held >= budget_tokens:
        raise ValueError("the held-out samples alone fill it")
    # the largest pieces weigh at least their share, so fewer rounds than this cannot fit
    start = max(2, math.ceil(in_flight * (whole - held) / (budget_tokens - held)))
    for rounds in range(start, most + 1):
        tokens, held = _tally(weighed, rounds)
        if peak_tokens(tokens, held, in_flight=in_flight) <= budget_tokens:
            return rounds
    raise ValueError(f"{samples} samples in {len(shards)} shards allow {most} rounds; none up to that fits")


def rounds_problems(config: dict, rounds: int, *, answers_bounded: bool = False) -> list[str]:
    """What training in rounds cannot do yet, named by key. `answers_bounded`: the rounds were sized before
    any answer was decoded, at their bound, so decoding them first may leave fewer rounds, or one."""
    if rounds == 1:
        return []
    problems = []
    epochs = float(config["train"]["epochs"])
    if epochs != int(epochs):
        problems.append(
            f"train.epochs: {epochs:g}; training in {rounds} rounds visits every sample once an epoch, so "
            "epochs must be a whole number"
        )
    if config["study"]["train_samples"] and config["study"]["budget"] == "steps":
        problems.append(
            f"study.budget: steps; in {rounds} rounds each size trains train.epochs passes over its own "
            "samples, beside the main run's, so sizes compare at equal epochs: set study.budget to epochs, "
            "or give a budget that holds every hidden state"
        )
    if config["train"]["max_samples"] or config["train"]["max_steps"]:
        problems.append(
            f"train.max_samples / train.max_steps: not used in {rounds} rounds; set them to null, or give a "
            "budget that holds every hidden state (extract.disk_budget)"
        )
    if problems and answers_bounded:
        problems.append(
            f"the {rounds} rounds are sized at the answers' bound (data.regenerate.max_new_tokens), none "
            "being decoded yet: `snakemake answers` decodes them without a plan (run it with the keys above "
            "at their defaults: the answers do not depend on them), and the next run weighs the rounds on "
            "their lengths, which may make one round"
        )
    return problems
