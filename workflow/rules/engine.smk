# The bench in a serving engine (bench.engine, docs/serving.md): where vLLM is installed, each bench set's
# prompts, rendered as the bench renders them, are served by the target alone and with the exported drafter;
# the engine's own acceptance, tokens/s and outputs are then set beside the replay's figures.


rule engine_bench:
    input:
        unpack(target_input),
        unpack(prompts_input),
        drafter=rules.export.output.drafter,
        probe=ancient(rules.probe.output.json),
        # after the bench: the engine takes a share of whole GPUs' memory, so it shares them with no bench job
        after=rules.report.output.records,
    output:
        run=f"{RESULTS}/bench/engine/{{dataset}}.json",
    log:
        f"{RESULTS}/logs/engine/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/engine/{{dataset}}.tsv"
    conda:
        "../../envs/serve.yaml"
    threads: cpu_threads()
    resources:
        gpu=rates_gpus,  # the engine takes a share of the whole GPU's memory: every slot of it
    params:
        target=target_path(),
        prompts=lambda wildcards: prompts_path(wildcards.dataset),
        bench=as_json(
            "bench",
            keep=(
                "max_prompts",
                "max_new_tokens",
                "block_size",
                "thinking",
                "temperature",
                "engine",
            ),
        ),
        tcfg=target_json(drop=DATA_JOB_DROP),
    shell:
        "python -m draftsmith.steps.engine_bench --target {params.target} --drafter {input.drafter}"
        " --prompts {params.prompts} --dataset {wildcards.dataset} --bench-json {params.bench}"
        " --target-json {params.tcfg} --gpus {resources.gpu} --out {output.run} > {log} 2>&1"


rule engine_report:
    input:
        runs=expand(rules.engine_bench.output.run, dataset=list(BENCH_DATASETS)),
        records=rules.report.output.records,
    output:
        json=f"{RESULTS}/bench/engine.json",
        md=report(
            f"{RESULTS}/bench/engine.md",
            caption="../report/engine.rst",
            category="Benchmark",
        ),
    log:
        f"{RESULTS}/logs/engine/report.log",
    conda:
        "../../envs/draftsmith.yaml"
    shell:
        "python -m draftsmith.steps.engine_report --runs {input.runs} --records {input.records}"
        " --json {output.json} --md {output.md} > {log} 2>&1"
