# draftsmith: a Hugging Face causal LM in, a trained DFlash drafter and its acceptance benchmark out.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/demo.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/bench.smk"


rule all:
    default_target: True
    input:
        rules.dataset.input,
        rules.export.output.drafter,
        rules.report.output,
