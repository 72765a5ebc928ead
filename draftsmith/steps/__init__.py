"""One module per rule, each run as `python -m draftsmith.steps.<rule>`.

Importing the package makes a job that dies of a signal (a segfault in a native kernel, an abort) leave its
Python stack in its log, where the job would otherwise end with no message. With DRAFTSMITH_STACKS_EVERY_S=N,
every thread's Python stack also goes to the log every N seconds, to see what a job that seems to hang (no
progress, an idle GPU) waits on, without a debugger. That dump reads other threads' frames while they run: a
bench job died in the middle of one (docs/operations.md), so leave it off unless a job hangs.

It also asks Triton to keep its autotuning results on disk beside the compiled kernels
(TRITON_CACHE_AUTOTUNING, unless set): fla tunes its Gated DeltaNet kernels for every new shape in every
process. Measured on the 27B shape, what a later job saves is mostly the compiled kernels, which Triton keeps
anyway (docs/measurements.md); the tuning results cost nothing to keep.
"""

import faulthandler
import os
import sys

STACKS_ENV = "DRAFTSMITH_STACKS_EVERY_S"

os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")  # read as fla's kernels are decorated: set it first

if not faulthandler.is_enabled():  # pytest, importing a step, has it on already
    faulthandler.enable(file=sys.stderr)
if os.environ.get(STACKS_ENV):
    faulthandler.dump_traceback_later(float(os.environ[STACKS_ENV]), repeat=True, file=sys.stderr)
