"""What every step sets up when it starts."""

import os
import subprocess
import sys

import pytest


def test_a_step_asked_for_stacks_writes_every_threads_stack_to_its_log():
    code = (
        "import draftsmith.steps; import time; time.sleep(1.2)"  # what `python -m draftsmith.steps.X` imports
    )
    env = {**os.environ, "DRAFTSMITH_STACKS_EVERY_S": "0.5"}
    err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stderr
    assert (
        err.count("most recent call first") >= 2 and 'File "<string>", line 1' in err
    )  # twice, where it waits
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stderr
    assert "most recent call first" not in quiet


def test_a_step_keeps_tritons_autotuning_results_on_disk_unless_told_otherwise():
    """fla's kernels read the switch as they are decorated; Triton's own knob must see it after the import."""
    pytest.importorskip("triton")
    code = "import draftsmith.steps, triton; print(bool(triton.knobs.autotuning.cache))"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_AUTOTUNING"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "True", run.stderr[-2000:]
    off = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "TRITON_CACHE_AUTOTUNING": "0"},
        capture_output=True,
        text=True,
    )
    assert off.stdout.strip() == "False", off.stderr[-2000:]


def test_a_jobs_compile_workers_are_its_threads_whether_inductor_was_loaded_before_or_after():
    """Inductor sizes its pool of compile processes to the whole machine unless told; a job's share is its
    threads. Each case in a fresh process, as a job starts."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    before = (
        "import torch._inductor.config as c; from draftsmith.core.runtime import set_threads; set_threads(5);"
        " print(c.compile_threads)"
    )
    after = (
        "from draftsmith.core.runtime import set_threads; set_threads(5);"
        " import torch._inductor.config as c; print(c.compile_threads)"
    )
    for code in (before, after):
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert run.stdout.strip() == "5", run.stderr[-2000:]
    told_env = {**env, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    told = subprocess.run([sys.executable, "-c", after], env=told_env, capture_output=True, text=True)
    assert told.stdout.strip() == "1", told.stderr[-2000:]
