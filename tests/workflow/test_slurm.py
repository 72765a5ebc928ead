"""The workflow on a real SLURM cluster through snakemake-executor-plugin-slurm and profiles/slurm.

A single-host cluster from Debian's packages (munge, slurmctld, slurmd; no GPUs, no accounting database) is
started for this module in a temporary folder, on free ports, and torn down afterwards. The demo DAG up to the
merged dataset is submitted with the real profile (site settings overridden the way a user would: partition,
CPUs and memory that fit this host, squeue for status since there is no slurmdbd) and must give the same
merged dataset, byte for byte, as a local run. `make slurm-deps` installs the packages (CI calls it); without
them, or without root, the test is skipped, unless DRAFTSMITH_REQUIRE_SLURM=1 (CI) turns that into a failure.
"""

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import NOLOCK, build_target

from draftsmith.demo.data import read_text, split_files

REPO = Path(__file__).resolve().parents[2]
DAEMONS = ["munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol"]
PARTITION = "debug"

pytestmark = pytest.mark.slow


def _unavailable(reason: str):
    if os.environ.get("DRAFTSMITH_REQUIRE_SLURM") == "1":
        pytest.fail(f"DRAFTSMITH_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, env, **kw):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, **kw)


def _slurm_conf(root: Path, host: str, node_line: str) -> str:
    """One host as controller and the only compute node; no cgroups (containers), no accounting storage."""
    return "\n".join(
        [
            "ClusterName=draftsmith",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={root}/munge/munge.sock",
            f"StateSaveLocation={root}/state",
            f"SlurmdSpoolDir={root}/spool",
            f"SlurmctldPidFile={root}/slurmctld.pid",
            f"SlurmdPidFile={root}/slurmd.pid",
            f"SlurmctldLogFile={root}/log/slurmctld.log",
            f"SlurmdLogFile={root}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "ReturnToService=2",
            # squeue remembers finished jobs this long: the plugin's status command without sacct
            "MinJobAge=600",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            f"{node_line} NodeAddr=127.0.0.1 State=UNKNOWN",  # whether or not the host name resolves
            f"PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _logs(root: Path) -> str:
    out = []
    for p in sorted(root.glob("**/*.log")):
        out.append(f"--- {p}\n" + p.read_text(errors="replace")[-2000:])
    return "\n".join(out)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running single-host cluster; yields the environment (SLURM_CONF) that its clients need."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        _unavailable(f"SLURM is not installed (missing {', '.join(missing)}; `make slurm-deps` installs it)")
    if os.geteuid() != 0:
        _unavailable("slurmd must run as root to start jobs")
    root = Path(tmp_path_factory.mktemp("slurm"))
    for d in ("munge", "state", "spool", "log"):
        (root / d).mkdir(mode=0o700)
    key = root / "munge/munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    # The jobstep plugin drops every SLURM_* variable, SLURM_CONF too, before it calls srun inside a job; real
    # clusters keep slurm.conf where srun finds it without (/etc/slurm, or configless). This one lives in a
    # temp folder, so srun is reached through a two-line wrapper that sets SLURM_CONF again and runs the real
    # srun.
    shim = root / "bin"
    shim.mkdir()
    (shim / "srun").write_text(
        f'#!/bin/sh\nexport SLURM_CONF={root}/slurm.conf\nexec {shutil.which("srun")} "$@"\n'
    )
    (shim / "srun").chmod(0o755)
    env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"), PATH=f"{shim}:{os.environ['PATH']}")
    started = []
    try:
        m = root / "munge"
        proc = _run(
            [
                "munged",
                "--force",
                f"--socket={m}/munge.sock",
                f"--key-file={key}",
                f"--log-file={m}/munged.log",
                f"--pid-file={m}/munged.pid",
                f"--seed-file={m}/munged.seed",
            ],
            env,
        )
        assert proc.returncode == 0, f"munged failed: {proc.stdout}{proc.stderr}"
        started.append(m / "munged.pid")
        node = _run(["slurmd", "-C"], env).stdout.splitlines()[0]  # this host's CPUs, sockets, RealMemory
        (root / "slurm.conf").write_text(_slurm_conf(root, host, node))
        for daemon, pid in (("slurmctld", "slurmctld.pid"), ("slurmd", "slurmd.pid")):
            proc = _run([daemon] + (["-i"] if daemon == "slurmctld" else []), env)
            assert proc.returncode == 0, f"{daemon} failed: {proc.stdout}{proc.stderr}\n{_logs(root)}"
            started.append(root / pid)
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            state = _run(["sinfo", "-h", "-N", "-o", "%T"], env).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        assert state == "idle", f"the node did not come up (sinfo: {state!r})\n{_logs(root)}"
        yield env
    finally:
        if (root / "slurm.conf").exists():
            try:
                _cancel_jobs(env)  # a failed or timed-out run leaves jobs that would outlive slurmd
                _run(["scontrol", "shutdown"], env)  # slurmctld and slurmd
            except subprocess.TimeoutExpired:
                pass  # the controller is not answering: its pid file below
        for pidfile in reversed(started):
            _stop(pidfile)


def _cancel_jobs(env, wait: float = 30) -> None:
    """Cancel this cluster's queued and running jobs and wait until they are gone."""
    _run(["scancel", "--user", getpass.getuser()], env)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not _run(["squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING"], env).stdout.strip():
            return
        time.sleep(0.5)


def _stop(pidfile: Path, wait: float = 20) -> None:
    """SIGTERM the daemon of this pid file (a no-op if `scontrol shutdown` already stopped it), SIGKILL if it
    lingers."""
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass  # gone (ProcessLookupError) or never written


def snakemake_in_background(*args, env) -> subprocess.Popen:
    """`snakemake` in the repository with this interpreter first on PATH, started in the background."""
    env = dict(env, PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    return subprocess.Popen(
        [sys.executable, "-m", "snakemake", NOLOCK, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen, args) -> subprocess.CompletedProcess:
    """A background `snakemake`, waited for (at most 15 minutes) and required to succeed."""
    try:
        out, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, f"snakemake {args} failed:\n{out[-4000:]}\n{err[-6000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def snakemake(*args, env) -> subprocess.CompletedProcess:
    return finished(snakemake_in_background(*args, env=env), args)


def test_profile_runs_the_workflow_on_slurm(slurm, tmp_path, tokenizer):
    """probe -> prepare -> shard -> extract (two shards grouped into one SLURM job) -> validate -> merge, as
    SLURM jobs; the merged dataset equals the local run's."""
    build_target(tmp_path / "target", tokenizer, "hybrid", layers=8, hidden=32)

    texts = [read_text(p) for p in split_files()[0][:12]]
    with open(tmp_path / "data.jsonl", "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"r{i}", "prompt": t[:120], "response": t[120 : 200 + 8 * i]}) + "\n")
    configs = {}
    for where in ("local", "slurm"):
        cfg = {
            "results": str(tmp_path / where),
            "target": {"model": str(tmp_path / "target")},
            "data": {"path": str(tmp_path / "data.jsonl"), "max_length": 128},
            "extract": {"shards": 3, "validate_samples": 2},
            "bench": {"datasets": [{"name": "tiny", "path": str(tmp_path / "data.jsonl")}]},
        }
        configs[where] = tmp_path / f"{where}.yaml"
        configs[where].write_text(yaml.safe_dump(cfg))

    # the real profile, with this cluster's site settings, as a user would override them
    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    assert profile["executor"] == "slurm"
    profile["default-resources"].update(slurm_partition=PARTITION, mem_mb=1000)
    for res in profile["set-resources"].values():  # what this 2-core host has, not a GPU node
        if "mem_mb" in res:
            res["mem_mb"] = 1000
        if "cpus_per_task" in res:
            res["cpus_per_task"] = 1
    profile.update(
        {
            "slurm-status-command": "squeue",  # no slurmdbd here, so no sacct
            "slurm-init-seconds-before-status-checks": 2,
            "slurm-no-account": True,
            "latency-wait": 5,
            "groups": ["extract=g"],
            "group-components": ["g=2"],
        }
    )
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile/config.yaml").write_text(yaml.safe_dump(profile))

    # the local run goes on beside the SLURM one, which spends most of its time waiting for its next status
    # check: each writes its own results folder
    start = time.monotonic()
    local_args = ("--cores", "2", "dataset", "--configfile", str(configs["local"]))
    local = snakemake_in_background(*local_args, env=slurm)
    try:
        run = snakemake(
            "--profile",
            str(tmp_path / "profile"),
            "dataset",
            "--configfile",
            str(configs["slurm"]),
            env=slurm,
        )
        elapsed = time.monotonic() - start
    except BaseException:  # the SLURM run's failure is the one to see
        local.kill()
        local.communicate()
        raise
    finished(local, local_args)  # the local run succeeded too
    log = run.stdout + run.stderr
    assert "SLURM run ID" in log

    # every job went through SLURM and completed; the three shards were extracted in two group jobs (2 + 1)
    jobs = subprocess.run(
        ["squeue", "--states=all", "-h", "-o", "%i|%T|%k"],
        env=slurm,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    comments = [j.split("|")[2] for j in jobs]
    assert all(j.split("|")[1] == "COMPLETED" for j in jobs), jobs
    for rule in ("probe", "prepare", "shard", "merge"):
        assert sum(c.startswith(f"rule_{rule}") for c in comments) == 1, (rule, comments)
    assert sum(c.startswith("rule_validate") for c in comments) == 3, comments
    assert sum(c == "rule_g_extract" for c in comments) == 2, comments  # group g: shards 2 + 1

    merged = {w: json.loads((tmp_path / w / "merged/manifest.json").read_text()) for w in ("local", "slurm")}
    assert merged["slurm"]["total_samples"] == 12 and merged["slurm"]["num_shards"] == 3
    assert merged["slurm"] == merged["local"]
    for s in range(3):
        a, b = (
            json.loads((tmp_path / w / f"extract/shard00{s}.json").read_text()) for w in ("local", "slurm")
        )
        assert a["sample_ids"] == b["sample_ids"] and a["checksum"] == b["checksum"]
    print(f"SLURM run {elapsed:.0f} s for {len(jobs)} jobs, beside the local run")
