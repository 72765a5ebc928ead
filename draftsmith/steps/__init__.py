"""One module per rule, each run as `python -m draftsmith.steps.<rule>`.

Importing the package arms what a job can ask for through its environment: with DRAFTSMITH_STACKS_EVERY_S=N,
every thread's Python stack goes to the job's log every N seconds, to see what a job that seems to hang (no
progress, an idle GPU) waits on, without a debugger.
"""

import faulthandler
import os
import sys

STACKS_ENV = "DRAFTSMITH_STACKS_EVERY_S"

if os.environ.get(STACKS_ENV):
    faulthandler.dump_traceback_later(float(os.environ[STACKS_ENV]), repeat=True, file=sys.stderr)
