# The target's files, made once for every job: a hub id fetched into the Hugging Face cache and pinned to the
# commit fetched, or a GGUF file converted into a model directory.


rule fetch_target:
    output:
        lock=f"{RESULTS}/target/lock.json",
    log:
        f"{RESULTS}/logs/fetch_target.log",
    conda:
        "../../envs/draftsmith.yaml"
    params:
        model=MODEL,
        revision=config["target"]["revision"] or "main",
    shell:
        "python -m draftsmith.steps.fetch_target --model {params.model} --revision {params.revision}"
        " --out {output.lock} > {log} 2>&1"


rule convert_target:
    input:
        gguf=MODEL,
    output:
        model=directory(f"{RESULTS}/target/model"),
    log:
        f"{RESULTS}/logs/convert_target.log",
    benchmark:
        f"{RESULTS}/benchmarks/convert_target.tsv"
    conda:
        "../../envs/draftsmith.yaml"
    threads: workflow.cores
    shell:
        "python -m draftsmith.steps.convert --gguf {input.gguf} --out {output.model} > {log} 2>&1"
