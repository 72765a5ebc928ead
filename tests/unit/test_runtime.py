"""What every step sets up when it starts."""

import os
import subprocess
import sys


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
