# draftsmith: a Hugging Face causal LM in, a trained DFlash drafter and its acceptance benchmark out.
from snakemake.utils import min_version

min_version("9.0")


# The demo's config.yaml is the run by default. A --configfile replaces it rather than being merged over it:
# keys the file leaves out take the schema's defaults, never the demo's. To vary the demo, pass both files.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/demo.smk"
include: "workflow/rules/target.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/plan.smk"


if ROUNDS > 1:

    include: "workflow/rules/rounds.smk"


include: "workflow/rules/answers.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/engine.smk"
include: "workflow/rules/plan_check.smk"
include: "workflow/rules/study.smk"


rule all:
    default_target: True
    input:
        rules.dataset.input if ROUNDS == 1 else [],
        rules.plan.output,
        rules.answers.output if config["data"]["regenerate"]["enabled"] else [],
        rules.export.output.drafter,
        rules.report.output,
        rules.engine_report.output if ENGINE else [],
        rules.plan_check.output,
        rules.study.output if STUDY_SIZES else [],


onsuccess:
    if Path(rules.report.output.md).exists():
        print(f"report: {report_command()}", file=sys.stderr)
