import json
import os
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import validate

from draftsmith.config import BENCH_REFERENCE_KEYS, data_sources, is_url
from draftsmith.preflight import preflight, problems_message
from draftsmith.dataset.fetch import fetched_name
from draftsmith.drafter.start import start_files
from draftsmith.core.gpu_memory import ENV as GPU_MEMORY_ENV, cap_setting
from draftsmith.dataset.answers import ENV as ANSWER_CHECKS_ENV
from draftsmith.core.gpu_pool import copies_sharing_a_gpu, gpu_names, visible_gpus
from draftsmith.plan.cli import bench_prompts, data_files, local_file
from draftsmith.plan.data import DATA_JOB_DROP, read_shards, shard_files
from draftsmith.plan.hours import study_sizes
from draftsmith.plan.plan import (
    PINNED,
    PlanError,
    make_plan,
    pin,
    render,
)
from draftsmith.plan.rounds import (
    answer_jobs,
    extracted_epoch,
    extracted_rounds,
    round_orders,
    rounds_problems,
    whole_epochs,
)
from draftsmith.speculative.engine_run import engine_in_dag
from draftsmith.target.files import is_hub_id, text_config

validate(config, schema="../schemas/config.schema.yaml")
# values wrong for this target (tap layers, mask token, chat template, prompt files, a preset for another
# model, the demo's data with a real target), before any job runs
PREFLIGHT_NOTES = []
if problems := preflight(config, PREFLIGHT_NOTES):
    raise WorkflowError(problems_message(problems))
for note in PREFLIGHT_NOTES:
    print(f"preflight: {note}", file=sys.stderr)


# the GPU memory a job may use (`gpu_memory`) reaches the jobs through their environment, not a rule's params:
# it changes no result, so changing it must rerun nothing
try:
    GPU_MEMORY = cap_setting(config.get("gpu_memory"))
except ValueError as e:
    raise WorkflowError(f"config: {e}") from None
if GPU_MEMORY is not None:
    os.environ[GPU_MEMORY_ENV] = GPU_MEMORY
os.environ[ANSWER_CHECKS_ENV] = json.dumps(config["data"]["regenerate"]["checks"])


RESULTS = config["results"]
# Jobs call `python`: the interpreter snakemake itself runs under comes first on their PATH, so a run needs no
# activated environment. With conda deployment the rule's environment is put before it and provides `python`.
if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
    shell.prefix(
        f'set -euo pipefail; export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"; '
    )
# GPUs of one node, fixed when the DAG is built: detected once per parse (nvidia-smi), or `node_gpus` when
# snakemake runs on a login node and the jobs on GPU nodes (SLURM). Jobs take their devices from the pool.
NODE_GPUS = (
    len(visible_gpus()) if config.get("node_gpus") is None else int(config["node_gpus"])
)
MODEL = config["target"]["model"]
DEMO = MODEL == "demo"
GGUF = MODEL.endswith(".gguf")  # converted into a model directory by a job
HUB = is_hub_id(
    MODEL
)  # fetched into the Hugging Face cache by a job, pinned to its commit


wildcard_constraints:
    shard=r"shard\d{3}",
    dataset=r"[A-Za-z0-9_\-]+",
    part=r"\d+",
    fetched=r"[0-9a-f]{8}-[^/]+",


def as_json(section, drop=(), keep=None, prepare=False):
    """A config section as one shell word: scripts read their settings from --x-json arguments. Keys a job
    does not use are dropped (or only those in `keep` kept), so changing them does not rerun it; the data keys
    only prepare reads reach it alone (`prepare`), and only when set, so that adding them reran nothing. The answer
    checks reach the jobs through their environment (below), so a threshold changed after a shard stopped
    reruns no shard that passed; the answering jobs a shard, through the command of each.
    """
    values = {
        k: v
        for k, v in config[section].items()
        if k not in drop and (keep is None or k in keep)
    }
    if section == "data":
        values["regenerate"] = {
            k: v
            for k, v in values["regenerate"].items()
            if k not in REGENERATE_ELSEWHERE
        }
        # prepare's alone, and there only when set: no other job reruns for them
        for key in PREPARE_ONLY:
            if not (prepare and values.get(key)):
                values.pop(key, None)
    return shlex.quote(json.dumps(values, sort_keys=True))


PREPARE_ONLY = (
    "dedupe",
    "exclude_bench",
    "templates",
)  # data keys that only prepare reads
REGENERATE_ELSEWHERE = (
    "checks",
    "jobs_per_shard",
)  # data.regenerate keys no job reads from its data-json


def target_path():
    """What every job gets as --target: the built demo or converted GGUF directory, the fetched hub target's
    lock file (its commit, resolved in each job's Hugging Face cache), or the local directory.
    """
    if DEMO:
        return f"{RESULTS}/demo/target"
    if GGUF:
        return f"{RESULTS}/target/model"
    if HUB:
        return f"{RESULTS}/target/lock.json"
    return MODEL


def target_input(wildcards):
    """The demo, a GGUF conversion and a hub target are made by jobs; a local directory is read where it is."""
    return {"target": target_path()} if DEMO or GGUF or HUB else {}


def target_json(drop=()):
    """The target section for a job. Jobs that make data never see the mask token or the expected shape
    (a change to those reruns mask_check and training, not extraction)."""
    return as_json("target", drop=drop)


# every URL the config names (training data, bench prompts), by the file fetch_data makes of it
FETCHED = {
    fetched_name(u): u
    for u in data_sources(config) + [d["path"] for d in config["bench"]["datasets"]]
    if is_url(u)
}


def data_paths():
    """The training files in order (the demo's, the user's, fetched copies of URLs)."""
    return data_files(config)


def data_input(wildcards):
    """The files a job makes or that are here (a `datasets` name is neither: prepare reads it online), and
    with data.exclude_bench the bench's prompt files."""
    return {
        "data": [p for p in data_paths() if p.startswith(RESULTS) or Path(p).exists()],
        "bench": bench_files() if config["data"]["exclude_bench"] else [],
    }


def prepare_bench_args():
    """data.exclude_bench: the bench's prompt files for prepare (a `datasets` name read online)."""
    if not config["data"]["exclude_bench"]:
        return ""
    return " --bench " + " ".join(shlex.quote(prompts_path(d)) for d in BENCH_DATASETS)


def bench_files():
    """The bench's prompt files, made by a job or here (a `datasets` name: read online)."""
    paths = [prompts_path(d) for d in BENCH_DATASETS]
    return [p for p in paths if p.startswith(RESULTS) or Path(p).exists()]


def num_shards():
    """Fixed when the DAG is built, so `snakemake -n` lists every extraction job.

    `auto`: one slot per visible GPU (or extract.cpu_slots without GPUs) times extract.shards_per_slot. Pin
    extract.shards to keep shard boundaries when the machine changes.
    """
    ext = config["extract"]
    if ext["shards"] != "auto":
        return int(ext["shards"])
    slots = NODE_GPUS or int(ext["cpu_slots"])
    return slots * int(ext["shards_per_slot"])


# the base shards' names, as draftsmith.plan.data.shard_files names their files
SHARDS = [f"shard{i:03d}" for i in range(num_shards())]


def probe_value(path, key):
    with open(path) as f:
        return json.load(f)[key]


def extract_gpus(wildcards, input):
    return probe_value(input.probe, "gpus_per_copy")


def rates_gpus(wildcards, input):
    """The rates job holds every slot of the GPU(s) it times the copies on, so that no job shares them with
    its timing; its priority starts it before the data jobs."""
    with open(input.probe) as f:
        probe = json.load(f)
    return probe["gpus_per_copy"] * copies_sharing_a_gpu(probe)


def get_plan_rates(wildcards):
    """The node's timed rates, where plan.rates is `node`: the plan is made from them."""
    return (
        {"rates": f"{RESULTS}/rates.json"} if config["plan"]["rates"] == "node" else {}
    )


def cpu_threads():
    """CPU jobs split the cores between the extraction slots."""
    return (
        max(1, workflow.cores // int(config["extract"]["cpu_slots"]))
        if not NODE_GPUS
        else 2
    )


def get_init_from(wildcards):
    """The drafter a training starts from (`train.init_from`), so that new weights there train again, and its
    check against the target (start_check)."""
    files = start_files(config["train"]["init_from"])
    return (
        {"init_from": files, "start_check": rules.start_check.output.json}
        if files
        else {}
    )


def train_gpus():
    """DDP over train.gpus devices, or the CPU when there are none."""
    return min(int(config["train"]["gpus"]), NODE_GPUS)


def train_threads():
    """On GPUs, the cores split between the GPU slots, times the slots a training holds: trainings of a study
    run side by side (all the cores each would run them one at a time). Without GPUs a training takes every
    core."""
    if not NODE_GPUS:
        return workflow.cores
    return max(1, workflow.cores // NODE_GPUS) * max(1, train_gpus())


def probe_gpus():
    """With `node_gpus` set (jobs go to other nodes), the probe job asks for a whole node: it sizes GPU groups
    for targets that do not fit one GPU. Run where it is, it reads this machine's GPUs and holds none.
    """
    return NODE_GPUS if config["node_gpus"] is not None else 0


def preflight_json():
    """What the probe checks against a hub target's config.json (local targets are checked at parse time)."""
    keys = {
        "target": config["target"],
        "taps": config["taps"],
    }  # the drafter's keys: mask_check
    return shlex.quote(json.dumps(keys, sort_keys=True))


def start_json():
    """What start_check compares `train.init_from`'s drafter with (its rule exists only when that is set)."""
    keys = {k: config[k] for k in ("results", "drafter", "taps")}
    keys["train"] = {"init_from": config["train"]["init_from"]}
    return shlex.quote(json.dumps(keys, sort_keys=True))


def report_command():
    """The `snakemake --report` call for this run: the same config files, or it reads the demo's."""
    files = " ".join(
        f"--configfile {shlex.quote(str(f))}" for f in workflow.overwrite_configfiles
    )
    return f"snakemake {files} --report {RESULTS}/report.html".replace("  ", " ")


def prompts_path(dataset):
    """Benchmark prompts: the demo's held-out prompts, or the configured file (a URL's copy) / datasets name."""
    return local_file(config, BENCH_DATASETS[dataset], "prompts.jsonl")


def prompts_input(wildcards):
    path = prompts_path(wildcards.dataset)
    return {"prompts": path} if Path(path).exists() or path.startswith(RESULTS) else {}


def bench_parts():
    parts = config["bench"]["parts"]
    if parts != "auto":
        return int(parts)
    return NODE_GPUS or int(config["extract"]["cpu_slots"])


BENCH_PARTS = bench_parts()
BENCH_DATASETS = {d["name"]: d["path"] for d in config["bench"]["datasets"]}
# the engine bench (bench.engine): in the DAG where vLLM can be imported, or its job's conda environment brings it
CONDA_JOBS = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method


def engine_wanted():
    """The engine bench in the DAG or not; a local target's config is read for what vLLM cannot serve."""
    local = text_config(MODEL) if Path(MODEL, "config.json").is_file() else None
    enabled = config["bench"]["engine"]["enabled"]
    return engine_in_dag(enabled, conda=CONDA_JOBS, text_cfg=local)


try:
    ENGINE = engine_wanted()
except RuntimeError as e:
    raise WorkflowError(str(e)) from None


def get_bench_reference(wildcards):
    """Without real loops a bench job replays its drafter against the target's answers, which one reference
    job a part decodes for every drafter (draftsmith/speculative/reference.py); a real loop's job times its own
    autoregressive decode, on the same GPU share, so it decodes them itself."""
    if config["bench"]["real_loop"]:
        return {}
    path = str(rules.bench_reference.output.records)
    return {"reference": path.format(dataset=wildcards.dataset, part=wildcards.part)}


def get_bench_args(wildcards):
    """The bench step's settings, and the target's answers where the job takes them (get_bench_reference).
    They ride with the settings' argument: a new word in the rule's command would rerun every finished bench
    job (Snakemake's code trigger), and only a tau-only bench reads them."""
    settings = as_json("bench", drop=("compare", "datasets", "engine"))
    answers = get_bench_reference(wildcards)
    if not answers:
        return settings
    return f"{settings} --reference {shlex.quote(answers['reference'])}"


def compare_args():
    """Other runs' summaries, shown beside this one (`bench.compare`)."""
    return " ".join(
        shlex.quote(f"{c['name']}={c['summary']}") for c in config["bench"]["compare"]
    )


# The data-scaling study: one drafter per size (`study.train_samples`), beside the main run's (all samples).
STUDY_SIZES = study_sizes(config)  # as the plan counts them


def study_train_json(wildcards):
    """The train section with this size's sample count (and, at equal compute, the main run's step count);
    nothing else differs from the main run."""
    values = {**config["train"], "max_samples": int(wildcards.n)}
    values["steps_as_full"] = config["study"]["budget"] == "steps"
    return shlex.quote(json.dumps(values, sort_keys=True))


def get_plan_check_study(wildcards):
    """The study's table when it has sizes: the plan's check reads every size's bench benchmark files, so it
    runs after the last of them (it once ran while a size's bench was still going, and counted it missing).
    """
    return {"study": rules.study.output.csv} if STUDY_SIZES else {}


def get_study_parts(wildcards):
    """Every size's bench records and training summary, and the main run's as the largest size."""
    parts = {"main": rules.report.input.parts, "main_train": rules.train.output.summary}
    for n in STUDY_SIZES:
        parts[f"n{n}"] = expand(
            rules.study_bench.output.records,
            n=n,
            dataset=list(BENCH_DATASETS),
            part=range(BENCH_PARTS),
        )
        parts[f"n{n}_train"] = rules.study_train.output.summary.format(n=n)
    return parts


def study_args(wildcards, input):
    """NAME=TRAIN_SUMMARY:PART,PART,... a size, as the study step reads them."""
    names = [f"n{n}" for n in STUDY_SIZES] + ["main"]
    return " ".join(
        shlex.quote(
            f"{name}={getattr(input, f'{name}_train')}:{','.join(getattr(input, name))}"
        )
        for name in names
    )


def plan_gpu_name():
    """The GPU class the plan's rates come from: the probe's reading, else nvidia-smi's, else unknown."""
    probe = Path(f"{config['results']}/probe.json")
    if probe.exists() and (gpus := probe_value(probe, "gpus")):
        return gpus[0]["name"]
    names = gpu_names()
    return names[0] if names else ("unknown GPU" if NODE_GPUS else None)


# The plan: disk and GPU-hours, and the rounds that keep hidden states under extract.disk_budget. Fixed here,
# so `snakemake -n` lists every round; once weighed on the prepared shards, kept in RESULTS/plan/rounds.json
# while the budget setting stays (before them, an estimate that the plan job corrects; docs/planning.md).
try:
    PLAN = make_plan(
        config,
        paths=data_paths(),
        gpus=NODE_GPUS,
        gpu_name=plan_gpu_name(),
        base_shards=len(SHARDS),
        bench_prompts=bench_prompts(config),
        shards=read_shards(
            config, shard_files(RESULTS, len(SHARDS)), base_shards=len(SHARDS)
        ),
    )
except PlanError as e:
    raise WorkflowError(f"plan: {e}")
if problems := rounds_problems(
    config,
    PLAN["rounds"],
    answers_bounded=PLAN.get("data", {}).get("answers_bounded", False),
):
    raise WorkflowError(problems_message(problems))
pin(config, PLAN)
print(f"plan:\n{render(PLAN)}", file=sys.stderr)
ROUNDS = PLAN["rounds"]
EPOCHS = whole_epochs(config)
# jobs answering each shard ahead of the rounds, and the name their answers go by
ANSWER_JOBS = answer_jobs(
    config,
    rounds=ROUNDS,
    base_shards=len(SHARDS),
    slots=NODE_GPUS or int(config["extract"]["cpu_slots"]),
)
ANSWERED = "{shard}" if ANSWER_JOBS == 1 else "{shard}.j{answer_job}"
# an epoch after the first may begin with the round the one before ended with, on its states still on disk
REUSE_LAST = bool(config["extract"]["reuse_last_round"]) and ROUNDS > 1
# round ids in the order each epoch trains them (a fresh order each epoch)
ROUND_ORDER = round_orders(
    ROUNDS, EPOCHS, int(config["train"]["seed"]), reuse_last=REUSE_LAST
)
# every (epoch, round) extracted, in training order (with reuse, not an epoch's first after the first)
EXTRACTED = extracted_rounds(ROUND_ORDER, reuse_last=REUSE_LAST)
# the budget, the rounds in flight and their reuse change the rounds, never the bytes of a shard
EXTRACT_DROP = ("disk_budget", "rounds_in_flight", "reuse_last_round")
# Snakemake's priorities for the rounds' jobs: a job nearer a training goes first, so the slots finish the next
# round before they start one further ahead (docs/measurements.md, 2026-12-05). Its scheduler adds up the
# priorities of the jobs it starts together: a training's outweighs a node's worth of the others, as it may
# need every slot.
ROUND_PRIORITY = {"extract": 1, "validate": 2, "merge": 3}
ROUND_PRIORITY["train"] = ROUND_PRIORITY["merge"] * max(1, NODE_GPUS) + 1


# Training in rounds (workflow/rules/rounds.smk)


def rows_json(kind, round_id=None):
    """Which rows of a shard a job holds (draftsmith.plan.rounds.select_rows)."""
    rows = {
        "kind": kind,
        "heldout_fraction": config["train"]["heldout_fraction"],
        "seed": config["train"]["seed"],
    }
    if kind == "round":  # the held-out samples do not depend on the rounds
        rows.update(rounds=ROUNDS, round=None if round_id is None else int(round_id))
    return shlex.quote(json.dumps(rows, sort_keys=True))


# a round's training job's params, as train_round and train_turn (workflow/rules/rounds.smk) pass them
ROUND_TRAIN_PARAMS = {
    "target": target_path(),
    "drafter": as_json("drafter"),
    "train": as_json("train"),
    "tcfg": target_json(drop=("dtype", "expect")),
    "data": as_json("data", drop=("path",)),
    "rows": rows_json("round"),
    "order": shlex.quote(json.dumps(ROUND_ORDER)),
    "previous": lambda wildcards, input: (
        f"--previous {input.state}" if "state" in input.keys() else ""
    ),
}


def round_train_shell(position, then=""):
    """A round's training job's command: the position it trains (train_turn: its epoch's last, then the next
    epoch's first, `then` naming where the second's record and metrics go)."""
    return (
        "python -m draftsmith.steps.train_round --dataset {input.dataset} --target {params.target}"
        f" --epoch {{wildcards.epoch}} --position {position} --order {{params.order}} {{params.previous}}"
        " --answers {input.answers} --rows-json {params.rows} --data-json {params.data}"
        " --drafter-json {params.drafter} --train-json {params.train} --target-json {params.tcfg}"
        " --mask-token {input.mask} --threads {threads} --state {output.state} --record {output.record}"
        f" --metrics {{output.metrics}}{then} > {{log}} 2>&1"
    )


def answers_path(shard):
    """A shard's samples with the target's answers, or as prepared when answers are not regenerated."""
    if config["data"]["regenerate"]["enabled"]:
        return f"{RESULTS}/answers/{shard}.parquet"
    return f"{RESULTS}/shards/{shard}.parquet"


def get_answers(wildcards):
    return answers_path(wildcards.shard)


def get_answer_job(wildcards):
    """Which of a shard's answering jobs this is, where there are several (the step's arguments)."""
    return f"--job {wildcards.answer_job} --jobs {ANSWER_JOBS}"


# With one answering job a shard, `regenerate` keeps the params and the command it always had: Snakemake reruns
# a job whose recorded command or params changed, and with it every round of a run in rounds made before.
ANSWER_JOB_PARAMS = {"job": get_answer_job} if ANSWER_JOBS > 1 else {}
REGENERATE_SHELL = (
    "python -m draftsmith.steps.regenerate --target {params.target} --shard {input.shard} --probe {input.probe}"
    " --target-json {params.tcfg} --data-json {params.dcfg} --budget-div {resources.budget_div}"
    + (" {params.job}" if ANSWER_JOBS > 1 else "")
    + " --threads {threads} --out {output.answers} > {log} 2>&1"
)


def position_before(epoch, pos, steps):
    """The (epoch, position) trained `steps` places before this one, or None before the first."""
    index = epoch * ROUNDS + pos - steps
    return None if index < 0 else divmod(index, ROUNDS)


def get_round_gate(wildcards):
    """A round's extraction waits until the round extracted extract.rounds_in_flight extractions before it has
    trained (and its states were deleted), so no more than that many rounds are on disk at once. Counted in
    extractions, not positions: a reused round (extract.reuse_last_round) is extracted once, and its turn's
    record, the gate on it, is written when both its positions are done."""
    here = EXTRACTED.index((int(wildcards.epoch), int(wildcards.round)))
    back = here - int(config["extract"]["rounds_in_flight"])
    if back < 0:
        return {}
    epoch, rid = EXTRACTED[back]
    gate = (epoch, ROUND_ORDER[epoch].index(rid))
    return {  # the main run's training of that round, and each study size's
        "gate": [position_path(*gate, "record.json", n) for n in [None, *STUDY_SIZES]]
    }


def round_dir(n=None):
    """Where the main run's rounds (n None) or a study size's keep their states and records."""
    return f"{RESULTS}/rounds" if n is None else f"{RESULTS}/study/n{n}/rounds"


def in_turn(epoch, pos):
    """With extract.reuse_last_round an epoch's last position (but the run's last) and the next epoch's first
    train the same round's states in one job, the epoch's turn (train_turn): "first" or "then" for those two
    positions, None for a position trained in a job of its own."""

    def reused(e, p):  # trains on the epoch before's extraction
        return extracted_epoch(e, p, rounds=ROUNDS, reuse_last=REUSE_LAST) != e

    if reused(epoch, pos):
        return "then"
    return (
        "first"
        if epoch < EPOCHS - 1 and pos == ROUNDS - 1 and reused(epoch + 1, 0)
        else None
    )


def position_path(epoch, pos, name, n=None):
    """A position's record.json, metrics.csv or state.pt (the main run's, or study size n's): in its own
    directory, or in its turn's (train_turn writes no state between the turn's two positions).
    """
    turn = in_turn(epoch, pos)
    if turn == "first":
        return f"{round_dir(n)}/e{epoch}/turn/{name}"
    if turn == "then":
        return f"{round_dir(n)}/e{epoch - 1}/turn/then/{name}"
    return f"{round_dir(n)}/e{epoch}/p{pos}/{name}"


def position_records(n=None):
    """Every position's record, in training order (train's input: the main run's, or study size n's)."""
    return [
        position_path(e, p, "record.json", n)
        for e in range(EPOCHS)
        for p in range(ROUNDS)
    ]


def get_study_round_input(wildcards):
    """A study size's round: the main run's inputs for it, and the state the size's position before handed
    on."""
    return get_round_input(wildcards, n=wildcards.n)


def get_turn_input(wildcards, n=None):
    """An epoch's turn: the inputs of its last position, which the turn trains first."""
    return round_input(int(wildcards.epoch), ROUNDS - 1, n)


def get_study_turn_input(wildcards):
    return get_turn_input(wildcards, n=wildcards.n)


def get_round_input(wildcards, n=None):
    return round_input(int(wildcards.epoch), int(wildcards.pos), n)


def round_input(epoch, pos, n=None):
    """The round this position trains, its states, and the state the position before handed on (the main
    run's, or study size n's)."""
    rid = ROUND_ORDER[epoch][pos]
    src = extracted_epoch(epoch, pos, rounds=ROUNDS, reuse_last=REUSE_LAST)
    out = {
        "mask": rules.mask_check.output.token,  # a new mask token retrains (see train.smk)
        "dataset": rules.merge_round.output.manifest.format(epoch=src, round=rid),
        "shards": expand(
            rules.extract_round.output.shard, epoch=src, round=rid, shard=SHARDS
        ),
        "answers": [answers_path(s) for s in SHARDS],
    }
    prev = position_before(epoch, pos, 1)
    if prev is not None:
        out["state"] = position_path(*prev, "state.pt", n)
    else:  # the first position starts from the seeded weights, or from train.init_from's
        out.update(get_init_from(None))
    return out


if not NODE_GPUS and int(config["train"]["gpus"]) > 1:
    print(
        f"preflight: no GPU on this machine, so this DAG is planned for a CPU run ({len(SHARDS)} shards on "
        f"{config['extract']['cpu_slots']} CPU slots, training on the CPU), though train.gpus is "
        f"{config['train']['gpus']}. To plan the node that will run it, set node_gpus (for example "
        f"--config node_gpus={config['train']['gpus']}), or run snakemake there",
        file=sys.stderr,
    )


def plan_config():
    """The config as the plan job reads it: not the demo's settings, which do not change the plan (a study's
    sizes do: each trains and benches a drafter), nor data.templates, which the job sees applied in the
    prepared shards (and whose braces Snakemake would read as wildcards in a param)."""
    data = {k: v for k, v in config["data"].items() if k != "templates"}
    return {k: v for k, v in config.items() if k != "demo"} | {"data": data}


def dag_layout():
    """Each GPU stage's benchmark files as its rules name them, with the slots a job holds (0: a copy's GPUs,
    which the probe decides), and the values of their wildcards in this DAG: the plan's check expands them.
    """
    trainer = max(1, train_gpus())
    if ROUNDS == 1:
        key = (
            "regeneration and extraction"
            if config["data"]["regenerate"]["enabled"]
            else "extraction"
        )
        stages = {
            key: [
                [str(rules.extract.benchmark), 0],
                [str(rules.validate.benchmark), 0],
            ],
            "training": [[str(rules.train.benchmark), trainer]],
        }
    else:
        held = (rules.extract_heldout, rules.validate_heldout)
        stages = {
            "regeneration": [[str(rules.regenerate.benchmark), 0]],
            "extraction": [*round_checks(), *[[str(r.benchmark), 0] for r in held]],
            # the final evaluation holds one GPU
            "training": [
                *round_trainings("train_round", "train_turn", trainer),
                [str(rules.train.benchmark), 1],
            ],
        }
    stages["bench"] = [[str(rules.bench.benchmark), 0]]
    # without real loops, the target's answers: decoded once for every drafter
    if not config["bench"]["real_loop"]:
        stages["bench"].append([str(rules.bench_reference.benchmark), 0])
    if STUDY_SIZES:  # each size's trainings and benches, as the main run's
        if ROUNDS > 1:
            stages["training"] += round_trainings(
                "study_train_round", "study_train_turn", trainer
            )
        stages["training"].append(
            [str(rules.study_train.benchmark), trainer if ROUNDS == 1 else 1]
        )
        stages["bench"].append([str(rules.study_bench.benchmark), 0])
    values = {
        "shard": SHARDS,
        "epoch": list(range(EPOCHS)),
        "round": list(range(ROUNDS)),
        "pos": list(range(ROUNDS)),
        "dataset": list(BENCH_DATASETS),
        "part": list(range(BENCH_PARTS)),
        "answer_job": list(range(ANSWER_JOBS)),
        "n": STUDY_SIZES,
    }
    return shlex.quote(json.dumps({"stages": stages, "values": values}))


def round_checks():
    """The rounds' extraction and validation benchmarks, each (epoch, round) extracted (with
    extract.reuse_last_round, not an epoch's first round after the first epoch): the plan's check lists only
    the jobs this DAG has."""
    rules_ = (rules.extract_round, rules.validate_round)
    if not REUSE_LAST:
        return [[str(r.benchmark), 0] for r in rules_]
    return [
        [str(r.benchmark).format(epoch=e, round=rid, shard="{shard}"), 0]
        for e, rid in EXTRACTED
        for r in rules_
    ]


def round_trainings(own, turn, slots):
    """A chain of rounds' training benchmarks (rules `own` and `turn`), each job this DAG has: with
    extract.reuse_last_round, the positions trained in jobs of their own and the epochs' turns.
    """
    if not REUSE_LAST:
        return [[str(getattr(rules, own).benchmark), slots]]
    own_jobs = [
        [str(getattr(rules, own).benchmark).format(epoch=e, pos=p, n="{n}"), slots]
        for e in range(EPOCHS)
        for p in range(ROUNDS)
        if in_turn(e, p) is None
    ]
    turns = str(getattr(rules, turn).benchmark)
    return own_jobs + [
        [turns.format(epoch=e, n="{n}"), slots]
        for e in range(EPOCHS)
        if in_turn(e, ROUNDS - 1) == "first"
    ]


def get_answer_stats(wildcards):
    """Where each shard's answer statistics are: its extraction manifest, or its answer stamp in rounds."""
    if ROUNDS > 1:
        stamps = rules.join_answers if ANSWER_JOBS > 1 else rules.regenerate
        return expand(stamps.output.stamp, shard=SHARDS)
    return expand(rules.extract.output.manifest, shard=SHARDS)
