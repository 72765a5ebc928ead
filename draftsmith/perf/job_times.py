"""Each job of a Snakemake run: its rule, wildcards, wall time and the peak GPU memory its log reports.

Reads the scheduler's own log (the `[date]` line before `rule NAME:` starts a job, the one before
`Finished jobid: N` ends it) and, in each job's `log:` file, the GPU pool's `peak GPU memory` line
(core/gpu_pool.py). Prints a markdown table: what a run at real size is asked to report per job.
"""

from __future__ import annotations

import argparse
import re
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
START = re.compile(r"^(?:local)?rule (\w+):$")
FINISH = re.compile(r"^Finished jobid: (\d+)")
FIELD = re.compile(r"^\s+(jobid|log|wildcards): (.*)$")
PEAK = "peak GPU memory: "


def parse(log_text: str) -> list[dict]:
    """Jobs in the order they started: rule, jobid, wildcards, log path, start and end times (None if the
    job never finished in this log)."""
    jobs: dict[str, dict] = {}
    stamp: datetime | None = None
    current: dict | None = None
    for line in log_text.splitlines():
        if m := STAMP.match(line):
            stamp = datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
            current = None
        elif (m := START.match(line)) and stamp is not None:
            current = {"rule": m.group(1), "start": stamp, "end": None, "wildcards": "", "log": None}
        elif current is not None and (m := FIELD.match(line)):
            key, value = m.groups()
            if key == "jobid":
                jobs[value] = current
            else:
                current[key] = value.split(", ")[0] if key == "log" else value
        elif (m := FINISH.match(line)) and m.group(1) in jobs:
            jobs[m.group(1)]["end"] = stamp
    return [{"jobid": int(k), **v} for k, v in jobs.items()]


def peak_memory(log_path: Path | None) -> str:
    """The pool's peak-memory line of a job's log, without its prefix ('' when there is none)."""
    if log_path is None or not log_path.is_file():
        return ""
    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if PEAK in ln]
    return lines[-1].split(PEAK, 1)[1].strip() if lines else ""


def table(jobs: list[dict], root: Path = Path(".")) -> str:
    """The jobs as markdown; relative log paths are read under `root` (where Snakemake ran)."""
    rows = ["| job | rule | wildcards | seconds | peak GPU memory |", "| --- | --- | --- | --- | --- |"]
    for j in jobs:
        seconds = f"{(j['end'] - j['start']).total_seconds():.0f}" if j["end"] else "unfinished"
        peak = peak_memory(root / j["log"] if j["log"] else None)
        rows.append(f"| {j['jobid']} | {j['rule']} | {j['wildcards']} | {seconds} | {peak} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("log", help="Snakemake's output (stdout and stderr) of one run")
    p.add_argument("--root", default=".", help="where Snakemake ran (its log paths are relative to it)")
    a = p.parse_args(argv)
    print(table(parse(Path(a.log).read_text(errors="replace")), Path(a.root)))


if __name__ == "__main__":
    main()
