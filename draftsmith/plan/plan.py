"""The plan of a run: samples and tokens, hidden-state bytes against the disk budget, the rounds, and the
GPU-hours of each stage. Made at parse time (preflight prints it at `snakemake -n`), by `python -m draftsmith
plan`, and by the plan rule, which writes RESULTS/plan.json once the data is prepared."""

from __future__ import annotations

import json
import os
from pathlib import Path

from draftsmith.core.units import human, parse_size
from draftsmith.plan.data import DataSize, Shards, answer_settings, estimate, measured
from draftsmith.plan.hours import gpu_class, node_rates, table_hours, timed_file, timed_hours
from draftsmith.plan.memory import memory_plan, memory_rows
from draftsmith.plan.rounds import (
    extraction_passes,
    fewest_rounds,
    rounds_needed,
    shards_fingerprint,
    whole_epochs,
)
from draftsmith.plan.sizes import drafter_params, target_params, token_bytes, training_bytes

SHAPES = Path(__file__).resolve().parents[2] / "configs" / "shapes"  # real targets' text shapes
PINNED = "plan/rounds.json"  # under RESULTS: the rounds decided for this budget setting, kept across parses
STATE_DIRS = ("extract", "rounds")  # under RESULTS: where this run's hidden states lie
ROUNDS_FROM = ("; estimated until the plan rule weighs the shards", "; weighed on the prepared shards")


class PlanError(ValueError):
    """A run that cannot fit: the message gives the numbers and the options."""


def target_shape(config: dict) -> tuple[dict | None, str]:
    """The target's text shape without loading weights: the demo's, a local or cached config.json, or the
    preset's `target.expect`."""
    from draftsmith.preflight import parse_time_target
    from draftsmith.target.files import text_config

    if config["target"]["model"] == "demo":
        from draftsmith.demo.shape import DEMO_SHAPE

        return dict(DEMO_SHAPE), "the demo's shape"
    path = parse_time_target(config["target"])
    if path is not None:
        return text_config(path), f"{path}/config.json"
    expect = config["target"].get("expect") or {}
    if "hidden_size" in expect and "num_hidden_layers" in expect:
        for shape_file in sorted(SHAPES.glob("*.json")):
            shape = json.loads(shape_file.read_text())
            if all(shape.get(k) == v for k, v in expect.items()):
                return shape, f"configs/shapes/{shape_file.name}, which matches target.expect"
        return dict(expect), "target.expect"
    return None, "unknown before the target is fetched (set target.expect)"


def tap_count(config: dict, shape: dict) -> int:
    from draftsmith.config import resolve_taps

    return len(resolve_taps(int(shape["num_hidden_layers"]), config["taps"]))


def data_size(config: dict, paths: list[str], shards: Shards = None) -> DataSize | None:
    """Measured when prepare has run (with the answers `shards` holds, read once), else estimated from the
    files."""
    answered = shards[1] if shards is not None else None
    data = config["data"]
    settings = answer_settings(config["target"], data["regenerate"], data["max_length"])
    return measured(config["results"], data, answered=answered, settings=settings) or estimate(paths, data)


def free_space(results: str | Path) -> int:
    """Free bytes on the results disk (its nearest existing folder), DRAFTSMITH_FREE_BYTES in fault drills."""
    from draftsmith.core.faults import free_bytes

    return free_bytes(results)


def states_on_disk(results: str | Path) -> int:
    """Bytes of hidden states this run already holds: an `auto` budget counts them as its own."""
    total = 0
    for d in STATE_DIRS:
        for f in (Path(results) / d).rglob("*.safetensors*"):
            total += f.stat().st_blocks * 512
    return total


def hub_cache_bytes(config: dict, shape: dict | None) -> int:
    """What a hub target not cached yet will add to the Hugging Face cache (its bf16 weights), when that
    cache shares the results disk."""
    from draftsmith.preflight import parse_time_target
    from draftsmith.target.files import is_hub_id

    model = config["target"]["model"]
    if not is_hub_id(model) or shape is None or parse_time_target(config["target"]) is not None:
        return 0
    cache = Path(
        os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub"
    )
    cache = cache.expanduser()
    while not cache.exists():
        cache = cache.parent
    results = Path(config["results"]).resolve()
    while not results.exists():
        results = results.parent
    same_disk = os.stat(cache).st_dev == os.stat(results).st_dev
    return int(2 * target_params(shape)) if same_disk else 0


def budget_bytes(config: dict, *, reserves: int) -> tuple[int, str]:
    """`extract.disk_budget` in bytes: a size as given, or `auto`: free space (with this run's states counted
    as its own) less what training, the export and the Hugging Face cache will need."""
    setting = config["extract"]["disk_budget"]
    if setting != "auto":
        return parse_size(setting), f"extract.disk_budget {setting}"
    results = config["results"]
    free = free_space(results) + states_on_disk(results)
    return (
        free - reserves,
        f"auto: {human(free)} free on {results}'s disk less {human(reserves)} kept for training, export "
        "and cache",
    )


def _pinned(config: dict, identity: dict) -> dict | None:
    """The rounds an earlier parse decided for this same budget setting and data shape."""
    path = Path(config["results"]) / PINNED
    try:
        pinned = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return pinned if pinned.get("identity") == identity else None


def pin(config: dict, plan: dict) -> None:
    """Keeps the rounds decided at this parse, so a later parse (a resume after a kill, with less free space
    since this run's own files were written) plans the same rounds while the budget setting stays. Only rounds
    weighed on the prepared shards are kept: an estimate's would hold the run to the estimate's count."""
    from draftsmith.core.io import write_json

    if "identity" in plan and not plan.get("pinned") and plan.get("rounds_measured"):
        write_json(
            Path(config["results"]) / PINNED, {k: plan[k] for k in ("identity", "rounds", "budget_bytes")}
        )


def unpin(config: dict) -> None:
    (Path(config["results"]) / PINNED).unlink(missing_ok=True)


def decide_rounds(
    states: float,
    budget: int,
    *,
    config: dict,
    samples: int,
    base_shards: int,
    per_token: float,
    shards: Shards = None,
) -> tuple[int, float]:
    """(rounds, held-out bytes): one round when everything fits, else as few rounds as fit the budget after
    the held-out samples (kept all run), `extract.rounds_in_flight` rounds at a time. With the prepared shards
    (and the answers known) the rounds are weighed as extraction will lay them out; before them, from the
    mean with one sample of slack per base shard. Raises PlanError with the options."""
    if shards is not None:
        frames, answered = shards
        try:
            rounds = fewest_rounds(frames, config, budget_tokens=budget / per_token, answered=answered)
        except ValueError as e:
            raise PlanError(_no_round_fits(config, states, budget, str(e))) from None
        return rounds, float(config["train"]["heldout_fraction"]) * states if rounds > 1 else 0.0
    if states <= budget:
        return 1, 0.0
    fraction = float(config["train"]["heldout_fraction"])
    in_flight = int(config["extract"]["rounds_in_flight"])
    heldout = fraction * states
    slack = base_shards * int(config["data"]["max_length"]) * per_token * in_flight
    room = budget - heldout - slack
    try:
        if room <= 0:
            raise ValueError("the held-out samples alone fill it")
        return rounds_needed(
            int((1 - fraction) * states * in_flight), int(room), base_shards=base_shards, samples=samples
        ), heldout
    except ValueError as e:
        raise PlanError(_no_round_fits(config, states, budget, str(e))) from None


def _no_round_fits(config: dict, states: float, budget: int, why: str) -> str:
    storage = config["extract"]["storage"]
    return (
        f"extract.disk_budget: the hidden states need {human(states)} ({storage}) and the budget is "
        f"{human(budget)}; even the smallest round does not fit ({why}). Options: extract.storage: fp8 (half "
        "the bytes), `results` on a larger disk, a larger extract.disk_budget, or fewer samples "
        "(data.max_samples)"
    )


def decide_budget(
    config: dict,
    plan: dict,
    *,
    per_token: float,
    reserves: int,
    samples: int,
    base_shards: int,
    shards: Shards = None,
) -> None:
    """The budget and the rounds into `plan`: as pinned for this setting and data shape, or decided now
    (from the prepared shards when they are there; only then are they pinned)."""
    identity = {
        "setting": str(config["extract"]["disk_budget"]),
        "storage": plan["storage"],
        "taps": plan["taps"],
        "hidden": plan["hidden_size"],
        "max_length": int(config["data"]["max_length"]),
        "answers": [config["data"]["regenerate"][k] for k in ("enabled", "max_new_tokens")],
        "base_shards": base_shards,
        "heldout_fraction": float(config["train"]["heldout_fraction"]),
        "in_flight": int(config["extract"]["rounds_in_flight"]),
    }
    if shards is not None:  # other shards (a data change rebuilds them) are another decision
        identity["shards"] = shards_fingerprint(shards[0], config["data"])
    pinned = _pinned(config, identity)
    if not pinned and shards is None:
        unpin(config)  # another setting's rounds, which this run's round jobs must not meet
    if pinned:
        plan.update(identity=identity, rounds=int(pinned["rounds"]), budget_bytes=int(pinned["budget_bytes"]))
        plan.update(pinned=True, budget_source="as planned before (results/plan/rounds.json)")
        return
    budget, plan["budget_source"] = budget_bytes(config, reserves=reserves)
    if budget <= 0:
        raise PlanError(
            f"extract.disk_budget: {plan['budget_source']}: nothing is left for the hidden states "
            f"({human(plan['tokens'] * per_token)}). Free space there, point `results` at a larger disk, "
            "set train.checkpoint_every: 0 (no checkpoints), or give extract.disk_budget a size"
        )
    rounds, _ = decide_rounds(
        plan["tokens"] * per_token,
        budget,
        config=config,
        samples=samples,
        base_shards=base_shards,
        per_token=per_token,
        shards=shards,
    )
    plan.update(identity=identity, rounds=rounds, budget_bytes=budget, pinned=False)
    plan["rounds_measured"] = shards is not None


def make_plan(
    config: dict,
    *,
    paths: list[str],
    gpus: int,
    gpu_name: str | None,
    base_shards: int,
    bench_prompts: int | None = None,
    shards: Shards = None,
) -> dict:
    """The plan as a dict (RESULTS/plan.json). Raises PlanError when no round can fit the budget.
    `shards`: the prepared base shards and the answers known (`read_shards`), once all shards are written."""
    plan: dict = {"notes": []}
    shape, plan["shape_source"] = target_shape(config)
    size = data_size(config, paths, shards)
    if shape is None or size is None:
        return _unplanned(plan, shape_known=shape is not None)
    taps, hidden = tap_count(config, shape), int(shape["hidden_size"])
    storage = config["extract"]["storage"]
    per_token = {s: token_bytes(taps=taps, hidden=hidden, storage=s) for s in ("bf16", "fp8")}
    tokens = size.samples * size.tokens_bound
    params = drafter_params(shape, config["drafter"], taps)
    checkpoints = int(config["train"]["checkpoint_every"]) > 0
    training = training_bytes(params, checkpoints=checkpoints, rounds=2)
    cache = hub_cache_bytes(config, shape)
    reserves = training + cache + int(tokens * 8)  # + the answer cache and prepared samples: ids and masks
    plan.update(
        data=size.as_dict(),
        taps=taps,
        hidden_size=hidden,
        storage=storage,
        shape=shape,
        bytes_per_token=per_token,
        tokens=int(tokens),
        states_bytes={s: int(tokens * b) for s, b in per_token.items()},
        drafter_params=params,
        training_bytes=training,
        hub_cache_bytes=cache,
        free_bytes=free_space(config["results"]),
    )
    decide_budget(
        config,
        plan,
        per_token=per_token[storage],
        reserves=reserves,
        samples=size.samples,
        base_shards=base_shards,
        shards=shards,
    )
    plan["epochs"], plan["in_flight"] = config["train"]["epochs"], int(config["extract"]["rounds_in_flight"])
    plan["extraction_passes"] = planned_passes(config, plan["rounds"])
    passes, timed = plan["extraction_passes"], node_rates(config)
    probe = read_probe(config)
    devices = len(probe.get("gpus") or []) or gpus  # slots of one GPU share its memory and disk
    if (failed := timed_file(config)) and "error" in failed:
        plan["notes"].append(
            f"the rates job could not time this node ({failed['error']}): GPU-hours from the table"
        )
    if timed:
        plan["stages"] = timed_hours(config, size, timed, gpus=gpus, passes=passes, rounds=plan["rounds"],
                                     base_shards=base_shards, bench_prompts=bench_prompts, shape=shape,
                                     devices=devices)  # fmt: skip
    else:
        plan["stages"] = table_hours(config, size, shape, params, gpu_name=gpu_name, gpus=gpus, passes=passes,
                                     bench_prompts=bench_prompts, devices=devices)  # fmt: skip
    named = gpu_name if timed and gpu_name else gpu_class(gpu_name)["name"]  # timed: its rates, no class's
    plan["gpus"], plan["devices"], plan["gpu_class"] = gpus, devices, named
    plan["memory"] = memory_plan(
        config,
        shape,
        card_bytes=card_bytes(gpu_name, probe),
        params=target_params(shape),
        drafter_params=params,
        gpus=gpus,
    )
    plan["notes"] += plan["memory"]["notes"]
    disk_note(plan, probe, per_token=per_token[storage], storage=storage)  # before what reuse would save
    reuse_note(config, plan)
    return plan


def read_probe(config: dict) -> dict:
    """RESULTS/probe.json: this node's GPUs, each once with its slots and memory, and the results disk's
    write rate; {} before the probe."""
    try:
        return json.loads((Path(config["results"]) / "probe.json").read_text())
    except (OSError, ValueError):
        return {}


def card_bytes(gpu_name: str | None, probe: dict) -> int:
    """A GPU's memory: the smallest card the probe found, else the rate table's figure for the class (the
    H200's for a class the table lacks, so only before the probe)."""
    if probe.get("gpus"):
        return int(min(float(g["total_gib"]) for g in probe["gpus"]) * 2**30)
    return int(float(gpu_class(gpu_name)["memory_gb"]) * 1e9)


def planned_passes(config: dict, rounds: int) -> float:
    """Extraction passes over the training samples (a whole number where it is one, as plan.json keeps it)."""
    passes = extraction_passes(
        whole_epochs(config), rounds, reuse_last=bool(config["extract"]["reuse_last_round"])
    )
    return int(passes) if passes.is_integer() else passes


def reuse_note(config: dict, plan: dict) -> None:
    """In rounds over several epochs without extract.reuse_last_round: what it would save."""
    epochs = whole_epochs(config)
    if plan["rounds"] == 1 or epochs == 1 or config["extract"]["reuse_last_round"]:
        return
    fewer = extraction_passes(epochs, plan["rounds"], reuse_last=True)
    passes = plan["extraction_passes"]
    saved = plan["stages"]["extract, all passes"]["gpu_hours"] * (1 - fewer / passes)
    plan["notes"].append(
        f"extract.reuse_last_round: true would extract {round(fewer, 2):g} passes, not {passes:g}, about "
        f"{saved:,.2f} GPU-hours less: each epoch after the first would begin with the round the one before "
        "ended with, on its states still on disk (docs/planning.md)"
    )


def _unplanned(plan: dict, *, shape_known: bool) -> dict:
    """One round, and why nothing more can be planned yet."""
    why = (
        "the data is not on this machine yet"
        if shape_known
        else "the target's shape is " + plan["shape_source"]
    )
    plan["notes"].append(
        f"no plan of disk or GPU-hours yet: {why}; one round (set extract.disk_budget and rerun "
        "`snakemake -n` once it is)"
    )
    plan["rounds"] = 1
    return plan


def disk_note(plan: dict, probe: dict, *, per_token: float, storage: str) -> None:
    """The write rate the extraction jobs need together (a GPU's rate, its slots' together, on each GPU).
    Where the probe found the results disk slower: extraction's GPU-hours at the disk's rate while the jobs
    stream states (their start-up does not wait on it), and a warning that says what that costs."""
    need = plan["devices"] * per_token * plan["stages"]["extract per epoch"]["rate"] / 1e9
    plan["disk_rate_needed_gbs"] = need
    if not probe:
        return
    rate = float(probe.get("disk_write_gbs") or 0)
    plan["disk_write_gbs"] = rate
    if not 0 < rate < need:
        return
    for name in ("extract per epoch", "extract, all passes"):  # `added` ends as all passes' wait
        stage = plan["stages"][name]
        added = (stage["gpu_hours"] - stage.get("fixed_hours", 0.0)) * (need / rate - 1)  # streaming's
        stage["gpu_hours"] += added
        stage["waits_on_disk"] = f"{rate:.2f} GB/s in the probe, {need:.2f} GB/s to keep up"
    plan["notes"].append(
        f"warning: the results disk took {rate:.2f} GB/s in the probe, and {plan['devices']} GPU(s) "
        f"extracting produce about {need:.2f} GB/s: extraction will wait on the disk (GPUs idle about "
        f"{1 - rate / need:.0%} of the time they stream states), and the plan prices that: {added:,.2f} of "
        f"extraction's {plan['stages']['extract, all passes']['gpu_hours']:,.2f} GPU-hours. Put `results` on "
        "a faster disk" + (", or use extract.storage: fp8" if storage != "fp8" else "")
    )


def render(plan: dict) -> str:
    """The plan as a Markdown table, as preflight prints it and the report shows it."""
    rows = [("what", "planned", "from")]
    if "data" not in plan:
        return "\n".join(
            ["| what | planned |", "| --- | --- |", f"| rounds | {plan['rounds']} |"]
            + [f"| note | {n} |" for n in plan["notes"]]
        )
    d = plan["data"]
    rows += [
        ("samples", f"{d['samples']:,}", d["source"]),
        ("prompt tokens a sample", f"{d['prompt_tokens']:,.0f}", d["source"]),
        ("answer tokens a sample", f"{d['answer_tokens']:,.0f}", d["source"]),
        (
            "tokens on disk, in all",
            f"{plan['tokens']:,}",
            "samples x (prompt + answer), capped by data.max_length",
        ),
        (
            "hidden states a token",
            f"{human(plan['bytes_per_token']['bf16'])} bf16, {human(plan['bytes_per_token']['fp8'])} fp8",
            f"{plan['taps']} taps x {plan['hidden_size']} ({plan['shape_source']})",
        ),
        (
            "hidden states, in all",
            f"{human(plan['states_bytes']['bf16'])} bf16, {human(plan['states_bytes']['fp8'])} fp8",
            f"stored as {plan['storage']}",
        ),
        (
            "checkpoints, export, round states",
            human(plan["training_bytes"]),
            f"drafter of {plan['drafter_params'] / 1e6:,.1f}M parameters",
        ),
        (
            "Hugging Face cache",
            human(plan["hub_cache_bytes"]),
            "the target's weights, when not cached yet on this disk",
        ),
        ("free on the results disk", human(plan["free_bytes"]), "now"),
        ("disk budget for hidden states", human(plan["budget_bytes"]), plan["budget_source"]),
        (
            "rounds",
            str(plan["rounds"]),
            f"{round(plan['extraction_passes'], 2):g} extraction pass(es) over {plan['epochs']} epochs"
            + (f"; {plan['in_flight']} on disk at once" if plan["rounds"] > 1 else "")
            + ROUNDS_FROM[bool(plan.get("rounds_measured") or plan.get("pinned"))],
        ),
    ]
    for stage, s in plan["stages"].items():
        rows.append(
            (
                f"GPU-hours: {stage}",
                f"{s['gpu_hours']:,.2f}"
                + (f" ({s['gpu_hours'] / s['gpus']:,.2f} h on {s['gpus']})" if s["gpus"] > 1 else ""),
                f"{s['rate']:,.1f} {s['unit']} a GPU; {s['source']}"
                + (f"; waits on the disk: {s['waits_on_disk']}" if "waits_on_disk" in s else ""),
            )
        )
    rows.append(
        (
            "disk write rate to keep up",
            f"{plan['disk_rate_needed_gbs']:.2f} GB/s",
            f"{plan.get('devices', plan['gpus'])} GPU(s) extracting at once ({plan['gpu_class']})",
        )
    )
    rows += memory_rows(plan["memory"]) if "memory" in plan else []
    lines = [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lines.insert(1, "| --- | --- | --- |")
    return "\n".join(lines + [f"\n- {n}" for n in plan["notes"]])
