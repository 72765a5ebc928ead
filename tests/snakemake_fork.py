"""`snakemake -n` forked from a process that has imported Snakemake already.

The tests read the DAG a config plans through dry runs, about ninety of them in the suite. A fresh process
pays Snakemake's own imports (about 1.5 s of a core) before it reads the Snakefile. Here one process a pytest
worker (multiprocessing's fork server, `snakemake.cli` preloaded, nothing of draftsmith) forks a child for
each dry run; the child goes into the repository, takes the run's environment, points its stdout and stderr
at files and calls the entry point that `python -m snakemake` calls, `snakemake.cli.main`, with the run's
arguments. The Snakefile is then parsed, checked and planned in that child as in a process of its own:
draftsmith's modules are imported there, under the run's environment. Real runs, which start jobs, stay
plain processes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import tempfile
from pathlib import Path

_context: mp.context.ForkServerContext | None = None


def _server() -> mp.context.ForkServerContext:
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(["snakemake.cli"])
    return _context


def _cli(argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    from snakemake.cli import main

    main(argv)  # exits with Snakemake's status, which becomes the child's exit code


def dry_run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """`python -m snakemake *argv`, a dry run, in `cwd` under `env`, as subprocess.run(text=True) gives it."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        child = _server().Process(target=_cli, args=(argv, env, str(cwd), str(out), str(err)))
        child.start()
        child.join()
        text = [p.read_text(errors="replace") if p.exists() else "" for p in (out, err)]
    return subprocess.CompletedProcess(["snakemake", *argv], child.exitcode, *text)
