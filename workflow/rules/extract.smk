rule probe:
    input:
        unpack(target_input),
    output:
        json=f"{RESULTS}/probe.json",
    log:
        f"{RESULTS}/logs/probe.log",
    conda:
        "../../envs/draftsmith.yaml"
    resources:
        gpu=probe_gpus(),
    params:
        target=target_path(),
        extract=as_json("extract", drop=EXTRACT_DROP),
        taps=as_json("taps"),
        max_length=config["data"]["max_length"],
        preflight=preflight_json(),
    shell:
        "python -m draftsmith.steps.probe --target {params.target} --extract-json {params.extract}"
        " --taps-json {params.taps} --max-length {params.max_length} --preflight-json {params.preflight}"
        " --out {output.json} > {log} 2>&1"


# A file named by URL (data.path, a bench prompt set), downloaded once; later jobs read the copy.
rule fetch_data:
    output:
        file=f"{RESULTS}/inputs/web/{{fetched}}",
    log:
        f"{RESULTS}/logs/fetch_data/{{fetched}}.log",
    conda:
        "../../envs/draftsmith.yaml"
    params:
        url=lambda wildcards: FETCHED[wildcards.fetched],
    shell:
        "python -m draftsmith.steps.fetch_data --url {params.url:q} --out {output.file} > {log} 2>&1"


rule prepare:
    input:
        unpack(target_input),
        unpack(data_input),
    output:
        samples=f"{RESULTS}/prepared/samples.parquet",
        stats=f"{RESULTS}/prepared/stats.json",
    log:
        f"{RESULTS}/logs/prepare.log",
    conda:
        "../../envs/draftsmith.yaml"
    params:
        target=target_path(),
        tcfg=target_json(drop=DATA_JOB_DROP + ("dtype",)),
        # with data.exclude_bench, `--bench` and the bench's prompt files follow the data (one param, so
        # that a run without it keeps its command and is not prepared again)
        data=" ".join(shlex.quote(p) for p in data_paths()) + prepare_bench_args(),
        # a function: data.templates hold braces, which Snakemake would read as wildcards in a string
        cfg=lambda wildcards: as_json("data", drop=("path",), prepare=True),
    shell:
        "python -m draftsmith.steps.prepare --target {params.target} --target-json {params.tcfg}"
        " --data {params.data} --data-json {params.cfg} --out {output.samples} --stats {output.stats} > {log} 2>&1"


# The drafter's mask token against the tokenized data. Extraction waits for it once (ancient: a rerun of this
# check, after a mask key changed, extracts nothing again); training reads the chosen token and runs again.
rule mask_check:
    input:
        unpack(target_input),
        samples=rules.prepare.output.samples,
    output:
        json=f"{RESULTS}/prepared/mask_check.json",
        # training's own edge to this check: Snakemake 9.27 marks a file ancient for every consumer once one
        # consumer (extraction) reads it as ancient, so a rerun check would not reach training through it
        token=f"{RESULTS}/prepared/mask_token.txt",
    log:
        f"{RESULTS}/logs/mask_check.log",
    conda:
        "../../envs/draftsmith.yaml"
    params:
        target=target_path(),
        tcfg=target_json(drop=("dtype", "expect")),
        mask=config["drafter"]["mask_token_id"],
    shell:
        "python -m draftsmith.steps.mask_check --target {params.target} --target-json {params.tcfg}"
        " --drafter-mask {params.mask} --samples {input.samples} --out {output.json} --token-out {output.token}"
        " > {log} 2>&1"


rule shard:
    input:
        samples=rules.prepare.output.samples,
    output:
        shards=expand(f"{RESULTS}/shards/{{shard}}.parquet", shard=SHARDS),
    log:
        f"{RESULTS}/logs/shard.log",
    conda:
        "../../envs/draftsmith.yaml"
    shell:
        "python -m draftsmith.steps.shard --samples {input.samples} --out {output.shards} > {log} 2>&1"


rule extract:
    input:
        unpack(target_input),
        shard=f"{RESULTS}/shards/{{shard}}.parquet",
        probe=ancient(rules.probe.output.json),
        mask=ancient(rules.mask_check.output.json),
    output:
        shard=f"{RESULTS}/extract/{{shard}}.safetensors",
        manifest=f"{RESULTS}/extract/{{shard}}.json",
    log:
        f"{RESULTS}/logs/extract/{{shard}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/extract/{{shard}}.tsv"
    # out of memory: one more attempt with half the token budget (budget_div = 2 ** (attempt - 1))
    retries: 1
    conda:
        "../../envs/gpu.yaml"
    threads: cpu_threads()
    resources:
        gpu=extract_gpus,
        budget_div=lambda wildcards, attempt: 2 ** (attempt - 1),
    params:
        target=target_path(),
        tcfg=target_json(drop=DATA_JOB_DROP),
        dcfg=as_json("data"),
        taps=as_json("taps"),
        ecfg=as_json("extract", drop=EXTRACT_DROP),
        rows="",
    shell:
        "python -m draftsmith.steps.extract --target {params.target} --shard {input.shard} --probe {input.probe} {params.rows}"
        " --target-json {params.tcfg} --data-json {params.dcfg} --taps-json {params.taps}"
        " --extract-json {params.ecfg} --budget-div {resources.budget_div} --threads {threads}"
        " --out {output.shard} --manifest {output.manifest} > {log} 2>&1"


rule validate:
    input:
        unpack(target_input),
        prepared=f"{RESULTS}/shards/{{shard}}.parquet",
        shard=rules.extract.output.shard,
        manifest=rules.extract.output.manifest,
        probe=ancient(rules.probe.output.json),
    output:
        report=f"{RESULTS}/validate/{{shard}}.json",
    log:
        f"{RESULTS}/logs/validate/{{shard}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/validate/{{shard}}.tsv"
    conda:
        "../../envs/gpu.yaml"
    threads: cpu_threads()
    resources:
        gpu=extract_gpus,
    params:
        target=target_path(),
        tcfg=target_json(drop=DATA_JOB_DROP),
        ecfg=as_json("extract", drop=EXTRACT_DROP),
        rows="",
    shell:
        "python -m draftsmith.steps.validate --target {params.target} --prepared {input.prepared} --shard {input.shard} {params.rows}"
        " --manifest {input.manifest} --probe {input.probe} --target-json {params.tcfg}"
        " --extract-json {params.ecfg} --threads {threads} --out {output.report} > {log} 2>&1"


rule merge:
    input:
        shards=expand(rules.extract.output.shard, shard=SHARDS),
        manifests=expand(rules.extract.output.manifest, shard=SHARDS),
        validations=expand(rules.validate.output.report, shard=SHARDS),
    output:
        manifest=f"{RESULTS}/merged/manifest.json",
    log:
        f"{RESULTS}/logs/merge.log",
    conda:
        "../../envs/draftsmith.yaml"
    shell:
        "python -m draftsmith.steps.merge --manifests {input.manifests} --validations {input.validations}"
        " --out {output.manifest} > {log} 2>&1"


# The training dataset as a target: the merged manifest and the shard files it indexes. Shards are final
# outputs, not intermediates, so a deleted or quarantined shard is recomputed on the next run.
rule dataset:
    input:
        manifest=rules.merge.output.manifest,
        shards=rules.merge.input.shards,
        validations=rules.merge.input.validations,
