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


def test_a_memory_format_pickled_by_a_job_loads_in_a_step_that_never_imported_torch(tmp_path):
    """Inductor's compile cache pickles memory formats into its entries. By pickle's own rule such a name can
    land under `__main__`, which in a `python -m draftsmith.steps.X` job need not hold `torch`: the entry then
    fails to load there (the H200's round trainings each compiled again). Pickled after draftsmith's runtime
    is imported, the format names a module any process imports."""
    import pickle

    import torch

    import draftsmith.core.runtime  # noqa: F401  (registers the reducer)

    data = pickle.dumps([torch.contiguous_format, torch.channels_last])
    assert b"draftsmith.core.runtime" in data and b"__main__" not in data
    bare = tmp_path / "bare_step.py"  # a job's `__main__` with no `torch` in it
    bare.write_text("import pickle, sys\nprint(pickle.loads(sys.stdin.buffer.read()))\n")
    run = subprocess.run(
        [sys.executable, str(bare)], input=data, capture_output=True, cwd=tmp_path, env=dict(os.environ)
    )
    assert run.stdout.decode().strip() == "[torch.contiguous_format, torch.channels_last]", run.stderr[-2000:]
    # what the H200's cache entries held: the same name under `__main__`, which such a job cannot load
    name = b"torch.contiguous_format"
    old = b"\x80\x04\x8c\x08__main__\x94\x8c" + bytes([len(name)]) + name + b"\x94\x93\x94."
    failed = subprocess.run([sys.executable, str(bare)], input=old, capture_output=True, cwd=tmp_path)
    assert failed.returncode != 0 and b"torch.contiguous_format" in failed.stderr, failed.stderr[-2000:]


def test_a_job_that_exits_at_once_keeps_its_exit_code_and_its_last_log_lines():
    """exit_now skips Python's teardown: what the job logged and printed last must still reach its log, and a
    failure must still fail."""
    code = (
        "import logging, sys; from draftsmith.core.runtime import exit_now, setup_logging; setup_logging();"
        "logging.getLogger('job').info('state written'); print('summary', end=''); sys.stderr.write('tail');"
        "exit_now(3)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 3
    assert "job: state written" in run.stderr and run.stderr.endswith("tail") and run.stdout == "summary"
