# The data-scaling study (`study.train_samples`): the main run's train -> export -> bench again per size, on
# the same merged dataset, then one table and plot of tau and held-out accuracy against training tokens.


wildcard_constraints:
    n=r"\d+",


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
    params:
        target=target_path(),
        out=lambda wildcards, output: os.path.dirname(output.metrics),
        drafter=as_json("drafter"),
        train=study_train_json,
        tcfg=target_json(drop=("dtype", "expect")),


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
        drafter=rules.study_export.output.drafter,
        probe=ancient(rules.probe.output.json),
    output:
        records=f"{RESULTS}/study/n{{n}}/bench/parts/{{dataset}}.{{part}}.jsonl",
    log:
        f"{RESULTS}/logs/study/n{{n}}/bench/{{dataset}}.{{part}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/study/n{{n}}/bench/{{dataset}}.{{part}}.tsv"


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
