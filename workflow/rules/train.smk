# The drafter a training starts from (train.init_from) against the target, which a job may make: before the data
# jobs, so that a drafter of another shape stops the run before its extraction.
if config["train"]["init_from"]:

    rule start_check:
        input:
            unpack(target_input),
            token=rules.mask_check.output.token,
        output:
            json=f"{RESULTS}/prepared/start_check.json",
        log:
            f"{RESULTS}/logs/start_check.log",
        priority: 100
        conda:
            "../../envs/draftsmith.yaml"
        params:
            target=target_path(),
            start=start_json(),
        shell:
            "python -m draftsmith.steps.start_check --target {params.target} --token {input.token}"
            " --start-json {params.start} --out {output.json} > {log} 2>&1"


# With rounds (extract.disk_budget), workflow/rules/rounds.smk defines `train` instead.
if ROUNDS == 1:

    rule train:
        input:
            unpack(target_input),
            unpack(get_init_from),
            dataset=rules.merge.output.manifest,
            shards=rules.merge.input.shards,
            # a plain edge (extraction's is ancient): a new mask token retrains
            mask=rules.mask_check.output.token,
        output:
            final=directory(f"{RESULTS}/train/final"),
            metrics=f"{RESULTS}/train/metrics.csv",
            summary=f"{RESULTS}/train/summary.json",
            curves=report(
                f"{RESULTS}/train/curves.png",
                caption="../report/training.rst",
                category="Training",
            ),
        log:
            f"{RESULTS}/logs/train.log",
        benchmark:
            f"{RESULTS}/benchmarks/train.tsv"
        conda:
            "../../envs/draftsmith.yaml"
        threads: train_threads()
        resources:
            gpu=train_gpus(),
        params:
            target=target_path(),
            out=lambda wildcards, output: os.path.dirname(output.metrics),
            drafter=as_json("drafter"),
            train=as_json("train"),
            tcfg=target_json(drop=("dtype", "expect")),
        shell:
            "python -m draftsmith.steps.train --dataset {input.dataset} --target {params.target} --out {params.out}"
            " --drafter-json {params.drafter} --train-json {params.train} --target-json {params.tcfg}"
            " --threads {threads} > {log} 2>&1"


rule export:
    input:
        unpack(target_input),
        final=rules.train.output.final,
    output:
        drafter=directory(f"{RESULTS}/drafter"),
    log:
        f"{RESULTS}/logs/export.log",
    conda:
        "../../envs/draftsmith.yaml"
    params:
        target=target_path(),
        train_dir=lambda wildcards, input: os.path.dirname(input.final),
        tcfg=target_json(drop=("dtype", "expect", "mask_token_id")),
    shell:
        "python -m draftsmith.steps.export --train-dir {params.train_dir} --target {params.target}"
        " --target-json {params.tcfg} --out {output.drafter} > {log} 2>&1"
