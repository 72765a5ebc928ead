rule bench_reference:
    input:
        unpack(target_input),
        unpack(prompts_input),
        probe=ancient(rules.probe.output.json),
    output:
        records=f"{RESULTS}/bench/reference/{{dataset}}.{{part}}.jsonl",
    log:
        f"{RESULTS}/logs/bench/reference/{{dataset}}.{{part}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/bench/reference/{{dataset}}.{{part}}.tsv"
    conda:
        "../../envs/gpu.yaml"
    threads: cpu_threads()
    resources:
        gpu=extract_gpus,
    params:
        target=target_path(),
        prompts=lambda wildcards: prompts_path(wildcards.dataset),
        parts=BENCH_PARTS,
        bench=as_json("bench", keep=BENCH_REFERENCE_KEYS),
        tcfg=target_json(drop=DATA_JOB_DROP),
    shell:
        "python -m draftsmith.steps.bench_reference --target {params.target} --target-json {params.tcfg}"
        " --prompts {params.prompts} --dataset {wildcards.dataset} --part {wildcards.part}"
        " --parts {params.parts} --bench-json {params.bench} --gpus {resources.gpu} --threads {threads}"
        " --out {output.records} > {log} 2>&1"


rule bench:
    input:
        unpack(target_input),
        unpack(prompts_input),
        unpack(get_bench_reference),
        drafter=rules.export.output.drafter,
        probe=ancient(rules.probe.output.json),
    output:
        records=f"{RESULTS}/bench/parts/{{dataset}}.{{part}}.jsonl",
    log:
        f"{RESULTS}/logs/bench/{{dataset}}.{{part}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/bench/{{dataset}}.{{part}}.tsv"
    # the run's own drafter (a study's largest size) is benched before the study's smaller ones
    priority: 1
    conda:
        "../../envs/gpu.yaml"
    threads: cpu_threads()
    resources:
        gpu=extract_gpus,
    params:
        target=target_path(),
        prompts=lambda wildcards: prompts_path(wildcards.dataset),
        parts=BENCH_PARTS,
        bench=get_bench_args,
        tcfg=target_json(drop=DATA_JOB_DROP),
    shell:
        "python -m draftsmith.steps.bench --target {params.target} --drafter {input.drafter} --target-json {params.tcfg}"
        " --prompts {params.prompts} --dataset {wildcards.dataset} --part {wildcards.part}"
        " --parts {params.parts} --bench-json {params.bench} --gpus {resources.gpu} --threads {threads}"
        " --out {output.records} > {log} 2>&1"


rule report:
    input:
        parts=expand(
            rules.bench.output.records,
            dataset=list(BENCH_DATASETS),
            part=range(BENCH_PARTS),
        ),
        train=rules.train.output.summary,
    output:
        records=f"{RESULTS}/bench/records.jsonl",
        csv=f"{RESULTS}/bench/summary.csv",
        md=report(
            f"{RESULTS}/bench/summary.md",
            caption="../report/summary.rst",
            category="Benchmark",
        ),
        tau=report(
            f"{RESULTS}/bench/tau_by_method.png",
            caption="../report/tau_by_method.rst",
            category="Benchmark",
        ),
        budget=report(
            f"{RESULTS}/bench/tau_vs_budget.png",
            caption="../report/tau_vs_budget.rst",
            category="Benchmark",
        ),
        positions=report(
            f"{RESULTS}/bench/position_acceptance.png",
            caption="../report/position_acceptance.rst",
            category="Benchmark",
        ),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../../envs/draftsmith.yaml"
    params:
        out=lambda wildcards, output: os.path.dirname(output.csv),
        label=f"{config['extract']['storage']} storage",
        compare=compare_args(),
    shell:
        "python -m draftsmith.steps.report --parts {input.parts} --out {params.out} --train-summary {input.train}"
        " --label {params.label:q} --compare {params.compare} > {log} 2>&1"
