"""GPU-hours of each stage of a run, from this node's timed rates (RESULTS/rates.json, made by the rates job)
or from the rates table (rates.yaml) scaled to the target. A job on a GPU that several slots share counts its
share of the GPU, so the hours are what the stage takes of the node either way."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace
from pathlib import Path

import yaml

from draftsmith.plan.data import DataSize
from draftsmith.plan.rounds import answer_jobs, whole_epochs
from draftsmith.plan.sizes import target_params

RATES = Path(__file__).with_name("rates.yaml")
TIMED = "rates.json"  # under RESULTS: the rates job's figures


@functools.cache
def rate_table() -> dict:
    return yaml.safe_load(RATES.read_text())


def gpu_class(name: str | None) -> dict:
    """The rates of the GPU class whose name `name` contains (the CPU's without a GPU; the H200's, marked as
    another class's, for a GPU not in the table)."""
    classes = rate_table()["classes"]
    if not name:
        return next(c for c in classes if c["name"] == "CPU")
    for c in classes:
        if any(m.lower() in name.lower() for m in c["match"]):
            return c
    return {**classes[0], "name": f"{name} (rates of the {classes[0]['name']})"}


def timed_file(config: dict) -> dict | None:
    """What the rates job wrote (its figures, or why it could not time the node), where plan.rates is `node`
    and it has run."""
    if config.get("plan", {}).get("rates", "node") != "node":
        return None
    try:
        return json.loads((Path(config["results"]) / TIMED).read_text())
    except (OSError, ValueError):
        return None


def node_rates(config: dict) -> dict | None:
    """The rates job's figures, where it timed this node."""
    timed = timed_file(config)
    return timed if timed and "rates" in timed else None


def study_sizes(config: dict) -> list[int]:
    """The study's sizes (`study.train_samples`): each trains and benches a drafter beside the main run's."""
    return sorted(int(n) for n in config.get("study", {}).get("train_samples", []))


def job_counts(config: dict, *, rounds: int, base_shards: int, slots: int) -> dict:
    """Jobs of each stage: each pays its start-up (and the target's loading) once. A study's sizes each train
    and bench as the main run does. In rounds each training job trains one extracted round's states: a
    position's, or with extract.reuse_last_round an epoch's turn (its last position and the next epoch's
    first, on one extraction)."""
    epochs = whole_epochs(config)
    turns = epochs - 1 if rounds > 1 and config["extract"]["reuse_last_round"] else 0
    chain = rounds * epochs - turns  # a drafter's training jobs, and the rounds extracted
    extract = base_shards if rounds == 1 else base_shards * (chain + 1)  # + the held-out pieces
    parts = config["bench"]["parts"]
    datasets = len(config["bench"]["datasets"]) or 1
    answering = base_shards * answer_jobs(config, rounds=rounds, base_shards=base_shards, slots=slots)
    drafters = 1 + len(study_sizes(config))
    return {
        "regeneration": answering if rounds > 1 else 0,  # in one round, the extraction jobs regenerate
        "extraction": extract,
        "validation": extract,
        "training": drafters * (1 if rounds == 1 else chain + 1),  # + the held-out evaluation
        # each drafter's jobs, and without real loops the reference jobs that decode the target's answers
        "bench": (drafters + (not config["bench"]["real_loop"]))
        * datasets
        * (max(1, slots) if parts == "auto" else int(parts)),
    }


def bench_runs(bench: dict) -> int:
    """The drafter's runs a bench prompt takes: DFlash, and DDTree at each budget."""
    return ("dflash" in bench["methods"]) + len(bench["ddtree_budgets"]) * ("ddtree" in bench["methods"])


def bench_decodes(bench: dict, *, drafters: int = 1) -> int:
    """Decodes a bench prompt costs for `drafters` drafters: the target's greedy answer (and above
    temperature 0 a sample), and a real loop per method where they run. Without real loops the answers are
    decoded once for all of them (a reference job)."""
    answers = 1 + (float(bench["temperature"]) > 0)
    return drafters * (answers + bench_runs(bench)) if bench["real_loop"] else answers


def bench_steps(w: dict, config: dict, shape: dict) -> float:
    """The bench's work in the target's batch-1 decode steps: its decodes (`_work`'s bench_tokens), and every
    drafter's replays of each run over the target's answer. A replay round (one drafter forward over a block)
    costs their layers' ratio of a decode step, and the plan counts a round a token, as an untrained drafter
    commits."""
    replay_share = int(config["drafter"]["num_layers"]) / max(1, int(shape["num_hidden_layers"]))
    return w["bench_tokens"] + w["bench_replayed"] * replay_share


def _work(config: dict, size: DataSize, *, bench_prompts: int | None) -> dict:
    """What each stage computes: tokens (and samples and steps for training)."""
    n, epochs = size.samples, float(config["train"]["epochs"])
    trained = n * (1 - float(config["train"]["heldout_fraction"]))
    bench = config["bench"]
    sizes = study_sizes(config)
    # the bench's answer tokens, at their cap
    bench_answers = (bench_prompts or 0) * int(bench["max_new_tokens"])
    equal_steps = config.get("study", {}).get("budget") == "steps"  # each size takes the main run's steps
    # what every drafter trains in an epoch (a study's sizes beside the main run), in main runs
    drafters = 1 + sum(1.0 if equal_steps else min(1.0, k / max(trained, 1.0)) for k in sizes)
    unanswered = n - size.answered  # cached answers are not decoded again
    return {
        "new": unanswered * size.answer_tokens,
        "prompt": unanswered * size.prompt_tokens,
        "epoch": n * size.tokens_bound,
        "trained_samples": trained,
        "trained_tokens": trained * size.tokens_bound,
        "epochs": epochs,
        "study_sizes": len(sizes),
        "training_runs": drafters,
        "bench_prompts": (bench_prompts or 0) * (1 + len(sizes)),
        "bench_tokens": bench_answers * bench_decodes(bench, drafters=1 + len(sizes)),
        # answer tokens replayed: every drafter's every run, a round a token
        "bench_replayed": bench_answers * (1 + len(sizes)) * bench_runs(bench),
    }


def _cached_note(size: DataSize) -> str:
    """What regeneration's row leaves out: the samples whose answers are written already."""
    return f"; {size.answered:,} of {size.samples:,} answers cached" if size.answered else ""


def _study_note(w: dict) -> str:
    k = w["study_sizes"]
    return f", with the study's {k} size{'s' * (k != 1)}" if k else ""


def timed_answers(size: DataSize, mean: float | None) -> DataSize:
    """Before any answer is regenerated the plan knows only their bound; the rates job regenerated some from
    the run's own prompts with its settings, so regeneration's GPU-hours take their mean length. Extraction
    and training keep the bound, as the disk does: their tokens a sample are capped by data.max_length
    sample by sample, which a mean cannot say."""
    if mean is None or not size.answers_bounded or not 0 < mean < size.answer_tokens:
        return size
    return replace(size, answer_tokens=float(mean), answers_bounded=False)


def _row(seconds: float, rate: float, unit: str, source: str, gpus: int, fixed: float = 0.0) -> dict:
    return {
        "gpu_hours": (seconds + fixed) / 3600,
        "fixed_hours": fixed / 3600,
        "rate": rate,
        "unit": unit,
        "source": source,
        "gpus": gpus,
    }


def table_hours(
    config: dict,
    size: DataSize,
    shape: dict,
    params: int,
    *,
    gpu_name: str | None,
    gpus: int,
    passes: float,
    bench_prompts: int | None,
    devices: int | None = None,
) -> dict:
    """GPU-hours from the class's rates scaled to this target and drafter by parameter count. `devices`: the
    node's GPUs, each once (slots of one GPU share it), which the wall hours divide by."""
    cls, ref = gpu_class(gpu_name), rate_table()["reference"]
    tscale = float(ref["target_params"]) / target_params(shape)
    dscale = float(ref["drafter_params"]) / max(1, params)
    w, every = _work(config, size, bench_prompts=bench_prompts), max(1, devices or gpus)
    trainers = max(1, min(int(config["train"]["gpus"]), gpus))

    def rate(key: str, scale: float) -> tuple[float, str]:
        return float(cls[key]["value"]) * scale, f"{cls['name']}: {cls[key]['source']}"

    (regen, rsrc), (ext, esrc) = rate("regenerate_new_tokens_s", tscale), rate("extract_tokens_s", tscale)
    (trn, tsrc), (bch, bsrc) = rate("train_tokens_s", dscale), rate("bench_tokens_s", tscale)
    layers = int(shape["num_hidden_layers"])
    bch, bsrc = layer_floor(cls, "bench_layer_step_s", bch, bsrc, layers=layers)
    tokens = size.answer_tokens  # an answer's admission and its share of the decode steps
    regen, rsrc = layer_floor(
        cls, "regenerate_layer_answer_s", regen, rsrc, layers=layers, units=tokens,
        what=f", {tokens:.0f}-token answers",
    )  # fmt: skip
    out: dict = {}
    if config["data"]["regenerate"]["enabled"]:  # decoding, and the prompts' prefill at the forward's rate
        rsrc += _cached_note(size)
        out["regeneration"] = _row(w["new"] / regen + w["prompt"] / ext, regen, "new tokens/s", rsrc, every)
    out["extract per epoch"] = _row(w["epoch"] / ext, ext, "tokens/s", esrc, every)
    out["extract, all passes"] = _row(
        w["epoch"] * passes / ext, ext, "tokens/s", f"{round(passes, 2):g} pass(es); {esrc}", every
    )
    out["train per epoch"] = _row(w["trained_tokens"] / trn, trn, "tokens/s", tsrc, trainers)
    out["train, all epochs"] = _row(
        w["trained_tokens"] * w["epochs"] * w["training_runs"] / trn,
        trn,
        "tokens/s",
        f"{w['epochs']:g} epochs{_study_note(w)}; {tsrc}",
        trainers,
    )
    note = f"{w['bench_prompts']} prompts{_study_note(w)}, replays included; {bsrc}"
    out["bench"] = _row(bench_steps(w, config, shape) / bch, bch, "tokens/s", note, every)
    return out


def layer_floor(
    cls: dict, key: str, rate: float, source: str, *, layers: int, units: float = 1.0, what: str = ""
) -> tuple[float, str]:
    """A parameter-scaled rate capped where each of its `units` (a bench step's token, an answer's tokens)
    costs the target's layers' launches through Python, `key` seconds a layer: a small target is
    launch-bound, and scaled by parameters alone its bench and answers are planned far under what they take
    (planning.md)."""
    floor = cls.get(key)
    if not floor or units <= 0:
        return rate, source
    cap = units / (layers * float(floor["value"]))
    if rate <= cap:
        return rate, source
    return cap, f"{cls['name']}: {floor['source']}; {layers} layers{what} (scaled by parameters: {rate:,.0f})"


def bench_answer_share(rates: dict, *, cap: int) -> float:
    """A bench answer's expected length over bench.max_new_tokens: the rates job's answers to the run's own
    prompts, each cut at the bench's cap (an answer cut at regeneration's cap counts as that long). Rates
    files older than the lengths give their mean, at most the cap."""
    lengths = rates.get("answer_lengths")
    if lengths:
        return sum(min(int(n), cap) for n in lengths) / len(lengths) / max(1, cap)
    return min(1.0, float(rates.get("answer_tokens_mean", cap)) / max(1, cap))


def timed_hours(
    config: dict,
    size: DataSize,
    timed: dict,
    *,
    gpus: int,
    passes: float,
    rounds: int,
    base_shards: int,
    bench_prompts: int | None,
    shape: dict,
    devices: int | None = None,
) -> dict:
    """GPU-hours from this node's timed rates, each job's start-up and loading included (at a shared GPU's
    share for a job that holds one slot of it). `gpus` counts slots (the jobs at once); `devices` the GPUs."""
    r, every = timed["rates"], max(1, devices or gpus)
    answered = timed_answers(size, r.get("answer_tokens_mean"))
    w = _work(config, size, bench_prompts=bench_prompts)
    share = max(1, int(timed.get("gpus_per_copy", 1))) / max(1, int(r.get("copies", 1)))  # of a GPU, a job
    slots = gpus or int(config["extract"]["cpu_slots"])
    jobs = job_counts(config, rounds=rounds, base_shards=base_shards, slots=slots)
    trainers = max(1, min(int(config["train"]["gpus"]), gpus))
    target_job = r["start_s"] + r["load_s"]
    src = f"timed on this node ({timed['device']}, {r['copies']} at once)"
    ext = r["extract_tokens_s"]
    out: dict = {}
    if config["data"]["regenerate"]["enabled"]:
        regen, new = r["regenerate_new_tokens_s"], _work(config, answered, bench_prompts=bench_prompts)["new"]
        note = "" if answered is size else f"; answers {answered.answer_tokens:.0f} tokens, the rates job's"
        out["regeneration"] = _row(  # timed end to end on the run's prompts: their prefill included
            new / regen,
            regen,
            "new tokens/s",
            src + note + _cached_note(size),
            every,
            jobs["regeneration"] * target_job * share,  # a job loads the target before it finds its answers
        )
    out["extract per epoch"] = _row(w["epoch"] / ext, ext, "tokens/s", src, every)
    # a validation job loads the target and recomputes samples of new shapes: an extraction job's start
    fixed = (jobs["extraction"] + jobs["validation"]) * (target_job + r["extract_first_batch_s"]) * share
    out["extract, all passes"] = _row(
        w["epoch"] * passes / ext,
        ext,
        "tokens/s",
        f"{round(passes, 2):g} pass(es), {jobs['extraction']} extraction and validation jobs; {src}",
        every,
        fixed,
    )
    budget = int(config["train"]["token_budget"])
    per_epoch = (
        w["trained_samples"] * r["train_s_per_sample"]
        + math.ceil(w["trained_tokens"] / budget) * r["train_s_per_step"]
    )
    # timed alone on one GPU (rounds train one at a time): DDP over train.gpus splits the work, and every
    # rank pays the start-up and the end (timed in a fresh process as a job runs; older rates files lack them)
    train_job = r.get("train_start_s", r["start_s"]) + r["train_setup_s"] + r["train_first_step_s"]
    train_job += r.get("train_end_s", 0.0)
    rate = w["trained_tokens"] / max(per_epoch, 1e-9)
    out["train per epoch"] = _row(per_epoch * share, rate, "tokens/s", src, trainers)
    out["train, all epochs"] = _row(
        per_epoch * w["epochs"] * w["training_runs"] * share,
        rate,
        "tokens/s",
        f"{w['epochs']:g} epochs{_study_note(w)}, {jobs['training']} jobs; {src}",
        trainers,
        jobs["training"] * train_job * share * trainers,
    )
    bench = r["bench_tokens_s"]
    out["bench"] = _row(
        bench_steps(w, config, shape)
        * bench_answer_share(r, cap=int(config["bench"]["max_new_tokens"]))
        / bench,
        bench,
        "tokens/s",
        f"{w['bench_prompts']} prompts{_study_note(w)}, {jobs['bench']} jobs, replays included; {src}",
        every,
        jobs["bench"] * target_job * share,
    )
    return out
