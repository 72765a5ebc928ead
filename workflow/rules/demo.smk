rule demo:
    output:
        target=directory(f"{RESULTS}/demo/target"),
        train=f"{RESULTS}/demo/data/train.jsonl",
        prompts=f"{RESULTS}/demo/data/prompts.jsonl",
    log:
        f"{RESULTS}/logs/demo.log",
    benchmark:
        f"{RESULTS}/benchmarks/demo.tsv"
    conda:
        "../../envs/draftsmith.yaml"
    threads: workflow.cores
    params:
        seed=config["demo"]["seed"],
        steps=config["demo"]["steps"],
    shell:
        "python -m draftsmith.steps.demo --target-out {output.target} --data-out $(dirname {output.train})"
        " --seed {params.seed} --steps {params.steps} --threads {threads} > {log} 2>&1"
