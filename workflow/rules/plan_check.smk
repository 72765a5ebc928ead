# The plan against the run: each stage's GPU-hours from its jobs' benchmark files, beside the plan's.
rule plan_check:
    input:
        unpack(get_plan_check_study),
        plan=rules.plan.output.json,
        probe=rules.probe.output.json,
        report=rules.report.output.csv,
    output:
        json=f"{RESULTS}/plan/measured.json",
        md=report(
            f"{RESULTS}/plan/measured.md",
            caption="../report/plan_check.rst",
            category="Plan",
        ),
    log:
        f"{RESULTS}/logs/plan_check.log",
    conda:
        "../../envs/draftsmith.yaml"
    params:
        layout=lambda wildcards: dag_layout(),  # a function: its templates keep their {wildcards}
    shell:
        "python -m draftsmith.steps.plan_check --plan {input.plan} --probe {input.probe}"
        " --layout-json {params.layout}"
        " --out {output.json} --md {output.md} > {log} 2>&1"
