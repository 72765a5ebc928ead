# The data-scaling study (`study.train_samples`): the main run's train -> export -> bench again per size, on
# the same merged dataset, then one table and plot of tau and held-out accuracy against training tokens. In
# rounds, each size trains its own chain of rounds on its share of each round's states, beside the main run,
# and a round's states are deleted once every size has trained on them.


wildcard_constraints:
    n=r"\d+",


if ROUNDS > 1:

    use rule train_round as study_train_round with:
        input:
            unpack(target_input),
            unpack(get_study_round_input),
        output:
            state=temp(f"{RESULTS}/study/n{{n}}/rounds/e{{epoch}}/p{{pos}}/state.pt"),
            record=f"{RESULTS}/study/n{{n}}/rounds/e{{epoch}}/p{{pos}}/record.json",
            metrics=f"{RESULTS}/study/n{{n}}/rounds/e{{epoch}}/p{{pos}}/metrics.csv",
        log:
            f"{RESULTS}/logs/study/n{{n}}/rounds/e{{epoch}}/p{{pos}}/train.log",
        benchmark:
            f"{RESULTS}/benchmarks/study/n{{n}}/rounds/e{{epoch}}/p{{pos}}/train.tsv"
        params:  # the others as the main run's (keyword params not named here are kept)
            train=study_train_json,

    if REUSE_LAST:

        use rule train_turn as study_train_turn with:
            input:
                unpack(target_input),
                unpack(get_study_turn_input),
            output:
                record=f"{RESULTS}/study/n{{n}}/rounds/e{{epoch}}/turn/record.json",
                metrics=f"{RESULTS}/study/n{{n}}/rounds/e{{epoch}}/turn/metrics.csv",
                then_record=f"{RESULTS}/study/n{{n}}/rounds/e{{epoch}}/turn/then/record.json",
                then_metrics=f"{RESULTS}/study/n{{n}}/rounds/e{{epoch}}/turn/then/metrics.csv",
                state=temp(
                    f"{RESULTS}/study/n{{n}}/rounds/e{{epoch}}/turn/then/state.pt"
                ),
            log:
                f"{RESULTS}/logs/study/n{{n}}/rounds/e{{epoch}}/turn/train.log",
            benchmark:
                f"{RESULTS}/benchmarks/study/n{{n}}/rounds/e{{epoch}}/turn/train.tsv"
            params:  # the others as the main run's (keyword params not named here are kept)
                train=study_train_json,

    use rule train as study_train with:
        input:
            unpack(target_input),
            state=position_path(EPOCHS - 1, ROUNDS - 1, "state.pt", "{n}"),
            mask=rules.mask_check.output.token,
            heldout=rules.merge_heldout.output.manifest,
            heldout_shards=rules.merge_heldout.input.shards,
            records=position_records("{n}"),
        output:
            final=directory(f"{RESULTS}/study/n{{n}}/train/final"),
            metrics=f"{RESULTS}/study/n{{n}}/train/metrics.csv",
            summary=f"{RESULTS}/study/n{{n}}/train/summary.json",
            curves=f"{RESULTS}/study/n{{n}}/train/curves.png",
        log:
            f"{RESULTS}/logs/study/n{{n}}/train.log",
        benchmark:
            f"{RESULTS}/benchmarks/study/n{{n}}/train.tsv"
        params:  # the others as the main run's (keyword params not named here are kept)
            train=study_train_json,

else:

    use rule train as study_train with:
        output:
            final=directory(f"{RESULTS}/study/n{{n}}/train/final"),
            metrics=f"{RESULTS}/study/n{{n}}/train/metrics.csv",
            summary=f"{RESULTS}/study/n{{n}}/train/summary.json",
            curves=f"{RESULTS}/study/n{{n}}/train/curves.png",
        log:
            f"{RESULTS}/logs/study/n{{n}}/train.log",
        benchmark:
            f"{RESULTS}/benchmarks/study/n{{n}}/train.tsv"
        params:  # the others as the main run's (keyword params not named here are kept)
            train=study_train_json,


use rule export as study_export with:
    input:
        unpack(target_input),
        final=rules.study_train.output.final,
    output:
        drafter=directory(f"{RESULTS}/study/n{{n}}/drafter"),
    log:
        f"{RESULTS}/logs/study/n{{n}}/export.log",


use rule bench as study_bench with:
    input:
        unpack(target_input),
        unpack(prompts_input),
        unpack(get_bench_reference),
        drafter=rules.study_export.output.drafter,
        probe=ancient(rules.probe.output.json),
    output:
        records=f"{RESULTS}/study/n{{n}}/bench/parts/{{dataset}}.{{part}}.jsonl",
    log:
        f"{RESULTS}/logs/study/n{{n}}/bench/{{dataset}}.{{part}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/study/n{{n}}/bench/{{dataset}}.{{part}}.tsv"
    priority: 0


rule study:
    input:
        unpack(get_study_parts),
    output:
        csv=f"{RESULTS}/study/summary.csv",
        md=report(
            f"{RESULTS}/study/summary.md",
            caption="../report/study_summary.rst",
            category="Data scaling",
        ),
        tau=report(
            f"{RESULTS}/study/tau_vs_tokens.png",
            caption="../report/study_tau.rst",
            category="Data scaling",
        ),
        accuracy=report(
            f"{RESULTS}/study/accuracy_by_position.png",
            caption="../report/study_accuracy.rst",
            category="Data scaling",
        ),
    log:
        f"{RESULTS}/logs/study.log",
    conda:
        "../../envs/draftsmith.yaml"
    params:
        out=lambda wildcards, output: os.path.dirname(output.csv),
        sizes=study_args,
    shell:
        "python -m draftsmith.steps.study --sizes {params.sizes} --out {params.out} > {log} 2>&1"
