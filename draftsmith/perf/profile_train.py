"""Where a drafter's training step spends its GPU time: the top CUDA kernels of profiled steps.

Takes bench_train's arguments (its shape and batch), runs its warm-up and steps under torch.profiler, and
prints the kernels by GPU time and their sum against the steps' wall time (the rest being launch gaps and host
work). A GPU tool: it says what to make faster next, which the benchmark's one figure does not.
"""

from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from draftsmith.perf import bench_train

TOP_KERNELS = 20


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    bench_train.main(argv)  # compiles and warms up; prints the unprofiled figures
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        bench_train.main(argv)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    gpu = sum(e.device_time_total for e in events) / 1e6
    print(f"GPU kernels {gpu:.2f} s of the profiled run's {wall:.2f} s (set-up and warm-up included)")
    for e in events[:TOP_KERNELS]:
        share = e.device_time_total / 1e6 / gpu
        print(f"{e.device_time_total / 1e3:10.1f} ms {share:6.1%} {e.count:6d}x {e.key[:110]}")


if __name__ == "__main__":
    main()
