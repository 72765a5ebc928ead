# The plan (draftsmith.plan): made at parse time, written with the measured data once it is prepared, and
# checked then: a round that would not fit the disk budget stops here, before any extraction.


rule plan:
    input:
        samples=rules.prepare.output.samples,
        shards=rules.shard.output.shards,
    output:
        json=f"{RESULTS}/plan.json",
        md=report(f"{RESULTS}/plan.md", caption="../report/plan.rst", category="Plan"),
    log:
        f"{RESULTS}/logs/plan.log",
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
