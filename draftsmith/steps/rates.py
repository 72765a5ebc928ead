"""Time this node for the plan (`plan.rates: node`): the target's stages on as many copies at once as the jobs
will run on one GPU (slots that share a device slow each other), the drafter's training step alone (rounds
train one at a time), and what a job pays before its first token. Writes RESULTS/rates.json."""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import time
from pathlib import Path
from queue import Empty

import torch

from draftsmith.config import section_arg
from draftsmith.core.gpu_pool import acquire, copies_sharing_a_gpu
from draftsmith.core.io import read_json, read_samples, write_json
from draftsmith.core.runtime import set_threads, setup_logging
from draftsmith.plan.timing import (
    time_bench_decode,
    time_extraction,
    time_regeneration,
    time_training,
)
from draftsmith.target.files import resolve_target
from draftsmith.target.load import load_configured_target

EXTRACT_LENGTH = 512  # tokens a synthetic sample in the timed extraction (at most data.max_length)


def process_age() -> float:
    """Seconds since this process started (the interpreter and its imports: every job pays them)."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def _target_stages(args: argparse.Namespace, devices: list[int], barrier, started: float) -> dict:
    """One copy's timings: loading the target, then extraction, regeneration and the bench's decode, each
    begun together with the other copies (`barrier`) so that they share the GPU as the jobs will."""
    tcfg, dcfg = section_arg(args.target_json, "target"), section_arg(args.data_json, "data")
    if devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    t = time.perf_counter()
    model, tok, _ = load_configured_target(resolve_target(args.target), devices, tcfg)
    out = {"start_s": started, "load_s": time.perf_counter() - t}
    max_length = int(dcfg["max_length"])
    barrier.wait()
    out |= _time_extraction(model, args)
    barrier.wait()
    if dcfg["regenerate"]["enabled"]:
        slots = int(dcfg["regenerate"]["batch_size"])
        out |= time_regeneration(
            model,
            tok,
            read_samples(args.samples),
            regen=dcfg["regenerate"],
            slots=slots,
            max_length=max_length,
        )
    barrier.wait()
    return out | time_bench_decode(model)


def _child(args: argparse.Namespace, devices: list[int]) -> None:
    """A timing process's set-up: logging, threads, and the devices it runs on (none: the CPU)."""
    setup_logging()
    set_threads(args.threads)
    if devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))


def _results(procs: list, queue, what: str) -> list:
    """One result from each started process. A process that dies puts nothing, and copies waiting at a
    barrier for it would wait for ever: the others are stopped and the job fails, naming `what`."""
    out: list = []
    while len(out) < len(procs):
        try:
            out.append(queue.get(timeout=1))
        except Empty:
            dead = [p for p in procs if not p.is_alive() and p.exitcode]
            if dead:
                for p in procs:
                    p.terminate()
                msg = f"rates: {what} failed (exit {dead[0].exitcode}); see the log above"
                raise SystemExit(msg) from None
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"rates: {what} failed (exit {p.exitcode}); see the log above")
    return out


def _worker(args: argparse.Namespace, devices: list[int], barrier, queue) -> None:
    started = process_age()
    _child(args, devices)
    queue.put(_target_stages(args, devices, barrier, started))


def _warm(args: argparse.Namespace, devices: list[int]) -> None:
    """Compiles what the jobs compile (the extraction's kernels, the drafter's step), so that the timings
    after it see the warm on-disk caches that every job but a run's first one sees."""
    _child(args, devices)
    model, _, _ = load_configured_target(
        resolve_target(args.target), devices, section_arg(args.target_json, "target")
    )
    _time_extraction(model, args)
    del model
    _time_training(args)


def _time_extraction(model, args: argparse.Namespace) -> dict:
    """`time_extraction` at the probe's token budget and the job's storage, written on the results disk."""
    probe = read_json(args.probe)
    return time_extraction(
        model,
        taps=probe["target"]["taps"],
        token_budget=int(probe["token_budget"]),
        length=min(EXTRACT_LENGTH, int(section_arg(args.data_json, "data")["max_length"])),
        storage=section_arg(args.extract_json, "extract")["storage"],
        workdir=Path(args.out).parent,
    )


def _time_training(args: argparse.Namespace) -> dict:
    return time_training(
        resolve_target(args.target),
        taps=read_json(args.probe)["target"]["taps"],
        drafter=section_arg(args.drafter_json, "drafter"),
        train=section_arg(args.train_json, "train"),
        max_length=int(section_arg(args.data_json, "data")["max_length"]),
    )


def _train_worker(args: argparse.Namespace, devices: list[int], queue) -> None:
    """The drafter's training timed in a process of its own, as a round's training job runs: what the job pays
    before its first step (the interpreter, imports, set-up) is measured from this process's start."""
    started = process_age()
    _child(args, devices)
    queue.put({"train_start_s": started, **_time_training(args), "done_at": time.time()})


def time_training_job(args: argparse.Namespace, devices: list[int]) -> dict:
    """`_train_worker` in a fresh process on one device (rounds train one at a time), and what its end costs:
    from its result to its exit (the compile workers' and the GPU's teardown), which a job pays too."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_train_worker, args=(args, devices[:1], queue))
    proc.start()
    out = _results([proc], queue, "timing the training")[0]
    out["train_end_s"] = max(0.0, time.time() - out.pop("done_at"))
    return out


def warm_caches(args: argparse.Namespace, devices: list[int], per_copy: int) -> None:
    """`_warm` in a process of its own on the first copy's devices (on GPUs: the CPU's figures stay cold)."""
    if not devices:
        return
    proc = mp.get_context("spawn").Process(target=_warm, args=(args, devices[:per_copy]))
    proc.start()
    proc.join()
    if proc.exitcode:
        raise SystemExit(f"rates: warming the compile caches failed (exit {proc.exitcode}); see the log")


def _copies(args: argparse.Namespace, devices: list[int], per_copy: int) -> list[dict]:
    """The target's timings on each copy these devices hold, all at once, in processes of their own."""
    copies = max(1, len(devices) // per_copy) if per_copy else 1
    if copies == 1:
        return [_target_stages(args, devices, mp.Barrier(1), process_age())]
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(copies), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(args, devices[i * per_copy : (i + 1) * per_copy], barrier, queue))
        for i in range(copies)
    ]
    for p in procs:
        p.start()
    return _results(procs, queue, "a timing process")


def combine(copies: list[dict], *, gpus: int) -> dict:
    """Rates per GPU: the copies' throughputs added (they ran at once) over the GPUs they held; what a job
    pays before its first token, and the answers' length, as the copies' mean; the answers' lengths one by one
    as the first copy's (every copy answers the same prompts)."""
    rates = {}
    for key in copies[0]:
        if isinstance(copies[0][key], list):
            rates[key] = copies[0][key]
            continue
        values = [float(c[key]) for c in copies]
        rates[key] = sum(values) / (max(1, gpus) if "tokens_s" in key else len(values))
    rates["copies"] = len(copies)
    return rates


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True)
    p.add_argument("--probe", required=True)
    p.add_argument("--samples", required=True, help="a prepared shard: regeneration is timed on its prompts")
    p.add_argument("--target-json", required=True)
    p.add_argument("--data-json", required=True)
    p.add_argument("--extract-json", required=True)
    p.add_argument("--drafter-json", required=True)
    p.add_argument("--train-json", required=True)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    setup_logging()
    set_threads(args.threads)
    probe = read_json(args.probe)
    per_copy = int(probe["gpus_per_copy"])
    copies: list[dict] = []
    with acquire(per_copy * copies_sharing_a_gpu(probe)) as devices:
        device = torch.cuda.get_device_name(0) if devices and torch.cuda.is_available() else "cpu"
        try:
            warm_caches(args, devices, per_copy)
            copies = _copies(args, devices, per_copy)
            rates = combine(copies, gpus=len(set(devices)) or 1)
            rates |= time_training_job(args, devices)
        except (RuntimeError, OSError, ValueError, SystemExit) as e:  # out of memory is a RuntimeError
            # a timing is for the plan only: the run goes on, planned from the rates table, and says why
            logging.exception("rates: timing this node failed; the plan uses the rates table")
            write_json(args.out, {"device": device, "error": f"{type(e).__name__}: {e}"[:500]})
            return
    out = {"device": device, "gpus_per_copy": per_copy, "rates": rates, "per_copy": copies}
    logging.info("rates: %s", out)
    write_json(args.out, out)


if __name__ == "__main__":
    main()
