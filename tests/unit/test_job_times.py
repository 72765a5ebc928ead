"""The per-job table of a Snakemake run (draftsmith.perf.job_times), read off a real Snakemake run of a small
Snakefile whose jobs write logs as the workflow's GPU jobs do."""

import subprocess
import sys

from draftsmith.perf.job_times import parse, table

SNAKEFILE = """
rule all:
    input: expand("out/{x}.txt", x=["a", "b"])

rule work:
    output: "out/{x}.txt"
    log: "logs/{x}.log"
    shell: "sleep 1; echo 'INFO draftsmith.core.gpu_pool: peak GPU memory: cuda:0 1.5 GB allocated, "
           "2.0 GB reserved' > {log}; echo done > {output}"
"""


def test_each_job_has_its_rule_wildcards_time_and_the_peak_its_log_reports(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--snakefile", "Snakefile"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    jobs = parse(run.stdout + run.stderr)
    assert sorted(j["rule"] for j in jobs) == ["all", "work", "work"]
    work = [j for j in jobs if j["rule"] == "work"]
    assert sorted(j["wildcards"] for j in work) == ["x=a", "x=b"]
    assert all(j["end"] is not None and (j["end"] - j["start"]).total_seconds() >= 0 for j in jobs)
    text = table(jobs, root=tmp_path)  # log paths as Snakemake printed them, relative to where it ran
    assert text.count("cuda:0 1.5 GB allocated, 2.0 GB reserved") == 2, text
    assert "unfinished" not in text
