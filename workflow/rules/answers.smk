# The target's answers as a report page: each shard's statistics, judged by its regeneration job before
# extraction (draftsmith.dataset.answers), in a table and a length histogram.


rule answers:
    input:
        stats=get_answer_stats,
    output:
        md=report(
            f"{RESULTS}/answers.md", caption="../report/answers.rst", category="Data"
        ),
        png=report(
            f"{RESULTS}/answers.png",
            caption="../report/answer_lengths.rst",
            category="Data",
        ),
    log:
        f"{RESULTS}/logs/answers.log",
    conda:
        "../../envs/draftsmith.yaml"
    shell:
        "python -m draftsmith.steps.answers --stats {input.stats} --md {output.md} --png {output.png}"
        " > {log} 2>&1"
