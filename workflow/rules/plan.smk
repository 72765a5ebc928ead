# The plan (draftsmith.plan): made at parse time, written with the measured data once it is prepared, and
# checked then: a round that would not fit the disk budget stops here, before any extraction.


rule plan:
    input:
        unpack(get_plan_rates),
        samples=rules.prepare.output.samples,
        shards=rules.shard.output.shards,
        # the node's GPUs (slots of one count once), their memory and the disk's write rate
        probe=rules.probe.output.json,
    output:
        json=f"{RESULTS}/plan.json",
        md=report(f"{RESULTS}/plan.md", caption="../report/plan.rst", category="Plan"),
    log:
        f"{RESULTS}/logs/plan.log",
    # ahead of the data jobs ready beside it: a round's extraction checks the rounds this job keeps
    priority: 100
    conda:
        "../../envs/draftsmith.yaml"
    params:
        config=shlex.quote(json.dumps(plan_config(), sort_keys=True)),
        paths=" ".join(shlex.quote(p) for p in data_paths()),
        gpus=NODE_GPUS,
        gpu=shlex.quote(plan_gpu_name() or ""),
        rounds=ROUNDS,
    shell:
        "python -m draftsmith.steps.plan --config-json {params.config} --paths {params.paths} --gpus {params.gpus}"
        " --gpu-name {params.gpu} --shards {input.shards}"
        " --rounds {params.rounds}"
        " --out {output.json} --md {output.md} > {log} 2>&1"


# This node timed for the plan (plan.rates: node; draftsmith/plan/timing.py): the target's stages on as many
# copies at once as will share a GPU, the drafter's training step, and each job's start-up and loading.
rule rates:
    input:
        unpack(target_input),
        probe=rules.probe.output.json,
        samples=f"{RESULTS}/shards/{SHARDS[0]}.parquet",
    output:
        json=f"{RESULTS}/rates.json",
    log:
        f"{RESULTS}/logs/rates.log",
    benchmark:
        f"{RESULTS}/benchmarks/rates.tsv"
    priority: 100
    conda:
        "../../envs/gpu.yaml"
    threads: cpu_threads()
    resources:
        gpu=rates_gpus,
    params:
        target=target_path(),
        tcfg=target_json(drop=DATA_JOB_DROP),
        dcfg=as_json("data"),
        ecfg=as_json("extract", drop=EXTRACT_DROP),
        drafter=as_json("drafter", drop=("mask_token_id",)),
        train=as_json("train", keep=("anchors_per_seq", "token_budget", "dtype")),
    shell:
        "python -m draftsmith.steps.rates --target {params.target} --probe {input.probe} --samples {input.samples}"
        " --target-json {params.tcfg} --data-json {params.dcfg} --extract-json {params.ecfg}"
        " --drafter-json {params.drafter} --train-json {params.train} --threads {threads}"
        " --out {output.json} > {log} 2>&1"
