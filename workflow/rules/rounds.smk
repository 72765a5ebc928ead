# Training in rounds, when the plan finds the hidden states larger than extract.disk_budget (docs/planning.md).
# Answers are regenerated once per shard (by several jobs a shard when there are fewer shards than GPU slots,
# data.regenerate.jobs_per_shard); then, epoch by epoch and round by round in each epoch's order, a
# round's pieces of every shard are extracted, validated, merged and trained on, and deleted (temp) once its
# training is done. The next round's extraction waits for that training, so states on disk never exceed one
# round plus the held-out samples, which are extracted once and kept for the final evaluation. With
# extract.reuse_last_round an epoch's first round is the one the epoch before ended with: it trains on that
# epoch's extraction, deleted once both trainings are done.


wildcard_constraints:
    epoch=r"\d+",
    pos=r"\d+",
    round=r"\d+",
    answer_job=r"\d+",


rule regenerate:
    input:
        unpack(target_input),
        shard=f"{RESULTS}/shards/{{shard}}.parquet",
        probe=ancient(rules.probe.output.json),
        mask=ancient(rules.mask_check.output.json),
    output:
        answers=f"{RESULTS}/answers/{ANSWERED}.parquet",
        stamp=f"{RESULTS}/answers/{ANSWERED}.json",
    log:
        f"{RESULTS}/logs/regenerate/{ANSWERED}.log",
    benchmark:
        f"{RESULTS}/benchmarks/regenerate/{ANSWERED}.tsv"
    retries: 1
    conda:
        "../../envs/gpu.yaml"
    threads: cpu_threads()
    resources:
        gpu=extract_gpus,
        budget_div=lambda wildcards, attempt: 2 ** (attempt - 1),
    params:
        **ANSWER_JOB_PARAMS,
        target=target_path(),
        tcfg=target_json(drop=DATA_JOB_DROP),
        dcfg=as_json("data"),
    shell:
        REGENERATE_SHELL


if ANSWER_JOBS > 1:

    # A shard's answers from the jobs that answered it, in order, as one job would have written them.
    rule join_answers:
        input:
            shard=f"{RESULTS}/shards/{{shard}}.parquet",
            answers=expand(
                rules.regenerate.output.answers,
                answer_job=range(ANSWER_JOBS),
                allow_missing=True,
            ),
            stamps=expand(
                rules.regenerate.output.stamp,
                answer_job=range(ANSWER_JOBS),
                allow_missing=True,
            ),
        output:
            answers=f"{RESULTS}/answers/{{shard}}.parquet",
            stamp=f"{RESULTS}/answers/{{shard}}.json",
        log:
            f"{RESULTS}/logs/regenerate/{{shard}}.join.log",
        conda:
            "../../envs/draftsmith.yaml"
        shell:
            "python -m draftsmith.steps.join_answers --shard {input.shard} --answers {input.answers}"
            " --out {output.answers} > {log} 2>&1"


use rule extract as extract_round with:
    input:
        unpack(target_input),
        unpack(get_round_gate),
        shard=get_answers,
        probe=ancient(rules.probe.output.json),
        mask=ancient(rules.mask_check.output.json),
    output:
        shard=temp(f"{RESULTS}/rounds/e{{epoch}}/{{shard}}.r{{round}}.safetensors"),
        manifest=temp(f"{RESULTS}/rounds/e{{epoch}}/{{shard}}.r{{round}}.json"),
    log:
        f"{RESULTS}/logs/rounds/e{{epoch}}/extract/{{shard}}.r{{round}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/rounds/e{{epoch}}/extract/{{shard}}.r{{round}}.tsv"
    priority: ROUND_PRIORITY["extract"]
    params:
        target=target_path(),
        tcfg=target_json(drop=DATA_JOB_DROP),
        dcfg=as_json("data"),
        taps=as_json("taps"),
        ecfg=as_json("extract", drop=EXTRACT_DROP),
        rows=lambda wildcards: (
            f"--answered --rows-json {rows_json('round', wildcards.round)}"
            f" --round-plan {RESULTS}/{PINNED} --base-shards {' '.join(rules.shard.output.shards)}"
        ),


use rule validate as validate_round with:
    input:
        unpack(target_input),
        prepared=f"{RESULTS}/shards/{{shard}}.parquet",
        shard=rules.extract_round.output.shard,
        manifest=rules.extract_round.output.manifest,
        probe=ancient(rules.probe.output.json),
    output:
        report=f"{RESULTS}/rounds/e{{epoch}}/{{shard}}.r{{round}}.valid.json",
    log:
        f"{RESULTS}/logs/rounds/e{{epoch}}/validate/{{shard}}.r{{round}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/rounds/e{{epoch}}/validate/{{shard}}.r{{round}}.tsv"
    priority: ROUND_PRIORITY["validate"]
    params:
        target=target_path(),
        tcfg=target_json(drop=DATA_JOB_DROP),
        ecfg=as_json("extract", drop=EXTRACT_DROP),
        rows=lambda wildcards: f"--data-json {as_json('data')} --rows-json {rows_json('round', wildcards.round)}",


use rule merge as merge_round with:
    input:
        shards=expand(
            rules.extract_round.output.shard, shard=SHARDS, allow_missing=True
        ),
        manifests=expand(
            rules.extract_round.output.manifest, shard=SHARDS, allow_missing=True
        ),
        validations=expand(
            rules.validate_round.output.report, shard=SHARDS, allow_missing=True
        ),
    output:
        manifest=f"{RESULTS}/rounds/e{{epoch}}/r{{round}}/manifest.json",
    log:
        f"{RESULTS}/logs/rounds/e{{epoch}}/merge.r{{round}}.log",
    priority: ROUND_PRIORITY["merge"]


use rule extract as extract_heldout with:
    input:
        unpack(target_input),
        shard=get_answers,
        probe=ancient(rules.probe.output.json),
        mask=ancient(rules.mask_check.output.json),
    output:
        shard=f"{RESULTS}/rounds/heldout/{{shard}}.safetensors",
        manifest=f"{RESULTS}/rounds/heldout/{{shard}}.json",
    log:
        f"{RESULTS}/logs/rounds/heldout/extract/{{shard}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/rounds/heldout/extract/{{shard}}.tsv"
    priority: ROUND_PRIORITY["extract"]
    params:
        target=target_path(),
        tcfg=target_json(drop=DATA_JOB_DROP),
        dcfg=as_json("data"),
        taps=as_json("taps"),
        ecfg=as_json("extract", drop=EXTRACT_DROP),
        rows=f"--answered --rows-json {rows_json('heldout')}",


use rule validate as validate_heldout with:
    input:
        unpack(target_input),
        prepared=f"{RESULTS}/shards/{{shard}}.parquet",
        shard=rules.extract_heldout.output.shard,
        manifest=rules.extract_heldout.output.manifest,
        probe=ancient(rules.probe.output.json),
    output:
        report=f"{RESULTS}/rounds/heldout/{{shard}}.valid.json",
    log:
        f"{RESULTS}/logs/rounds/heldout/validate/{{shard}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/rounds/heldout/validate/{{shard}}.tsv"
    priority: ROUND_PRIORITY["validate"]
    params:
        target=target_path(),
        tcfg=target_json(drop=DATA_JOB_DROP),
        ecfg=as_json("extract", drop=EXTRACT_DROP),
        rows=f"--data-json {as_json('data')} --rows-json {rows_json('heldout')}",


use rule merge as merge_heldout with:
    input:
        shards=expand(rules.extract_heldout.output.shard, shard=SHARDS),
        manifests=expand(rules.extract_heldout.output.manifest, shard=SHARDS),
        validations=expand(rules.validate_heldout.output.report, shard=SHARDS),
    output:
        manifest=f"{RESULTS}/rounds/heldout/manifest.json",
    log:
        f"{RESULTS}/logs/rounds/heldout/merge.log",
    priority: ROUND_PRIORITY["merge"]


rule train_round:
    input:
        unpack(target_input),
        unpack(get_round_input),
    output:
        state=temp(f"{RESULTS}/rounds/e{{epoch}}/p{{pos}}/state.pt"),
        record=f"{RESULTS}/rounds/e{{epoch}}/p{{pos}}/record.json",
        metrics=f"{RESULTS}/rounds/e{{epoch}}/p{{pos}}/metrics.csv",
    log:
        f"{RESULTS}/logs/rounds/e{{epoch}}/p{{pos}}/train.log",
    benchmark:
        f"{RESULTS}/benchmarks/rounds/e{{epoch}}/p{{pos}}/train.tsv"
    priority: ROUND_PRIORITY["train"]
    conda:
        "../../envs/draftsmith.yaml"
    threads: train_threads()
    resources:
        gpu=train_gpus(),
    params:
        **ROUND_TRAIN_PARAMS,
    shell:
        round_train_shell("{wildcards.pos}")


if REUSE_LAST:

    # An epoch's turn (extract.reuse_last_round): its last position and the next epoch's first train the same
    # round's states, in one job that pays its start-up once and hands on the state after both.
    rule train_turn:
        input:
            unpack(target_input),
            unpack(get_turn_input),
        output:
            record=f"{RESULTS}/rounds/e{{epoch}}/turn/record.json",
            metrics=f"{RESULTS}/rounds/e{{epoch}}/turn/metrics.csv",
            then_record=f"{RESULTS}/rounds/e{{epoch}}/turn/then/record.json",
            then_metrics=f"{RESULTS}/rounds/e{{epoch}}/turn/then/metrics.csv",
            state=temp(f"{RESULTS}/rounds/e{{epoch}}/turn/then/state.pt"),
        log:
            f"{RESULTS}/logs/rounds/e{{epoch}}/turn/train.log",
        benchmark:
            f"{RESULTS}/benchmarks/rounds/e{{epoch}}/turn/train.tsv"
        priority: ROUND_PRIORITY["train"]
        conda:
            "../../envs/draftsmith.yaml"
        threads: train_threads()
        resources:
            gpu=train_gpus(),
        params:
            **ROUND_TRAIN_PARAMS,
            last=ROUNDS - 1,
        shell:
            round_train_shell(
                "{params.last}",
                " --then-record {output.then_record} --then-metrics {output.then_metrics}",
            )


# With rounds, `train` makes the same outputs from the last round's state, evaluated on the held-out samples.
rule train:
    input:
        unpack(target_input),
        state=position_path(EPOCHS - 1, ROUNDS - 1, "state.pt"),
        mask=rules.mask_check.output.token,
        heldout=rules.merge_heldout.output.manifest,
        heldout_shards=rules.merge_heldout.input.shards,
        records=position_records(),
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
        gpu=min(1, train_gpus()),
    params:
        target=target_path(),
        out=lambda wildcards, output: os.path.dirname(output.metrics),
        drafter=as_json("drafter"),
        train=as_json("train"),
        tcfg=target_json(drop=("dtype", "expect")),
    shell:
        "python -m draftsmith.steps.train_final --state {input.state} --heldout {input.heldout}"
        " --records {input.records} --target {params.target} --out {params.out}"
        " --drafter-json {params.drafter} --train-json {params.train} --target-json {params.tcfg}"
        " --mask-token {input.mask} --threads {threads} > {log} 2>&1"
