"""A crash-safe pool of GPUs shared by concurrent Snakemake jobs.

Snakemake's `resources: gpu=N` only counts: it never says *which* devices a job may use. Each job therefore
takes devices itself: one lock file per device, held with `flock`. The kernel drops a flock when its process
dies, so a killed or crashed job frees its devices at once and there is no stale state to clean up. Two jobs
can never hold the same device, whatever the scheduler does.

Inside a SLURM job the pool is the devices SLURM granted the job (its CUDA_VISIBLE_DEVICES, none if it set
none), and the lock files live on the node's local disk, one folder per job: SLURM already keeps jobs apart,
so the pool only has to split a job's devices between the shards grouped into it. A pool on the shared
filesystem would make device 0 of one node wait for device 0 of another (flock is cluster-wide over NFS).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


def peak_memory_line() -> str | None:
    """What this process's PyTorch allocator held at most on each GPU it used, for the job's log (Snakemake's
    benchmark files record the host's memory, not the GPU's); None when the process never touched CUDA.
    Kernels that allocate outside PyTorch, and the CUDA context, come on top."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    parts = [
        f"cuda:{d} {torch.cuda.max_memory_allocated(d) / 1e9:.1f} GB allocated, "
        f"{torch.cuda.max_memory_reserved(d) / 1e9:.1f} GB reserved"
        for d in range(torch.cuda.device_count())
        if torch.cuda.max_memory_reserved(d) > 0
    ]
    return "peak GPU memory: " + "; ".join(parts) if parts else None


def default_pool_dir() -> Path:
    """DRAFTSMITH_GPU_POOL if set; in a SLURM job a node-local folder of that job; else
    .snakemake/gpu_pool."""
    if os.environ.get("DRAFTSMITH_GPU_POOL"):
        return Path(os.environ["DRAFTSMITH_GPU_POOL"])
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        return Path(os.environ.get("TMPDIR") or "/tmp") / f"draftsmith-gpu-pool-{job}"
    return Path(".snakemake/gpu_pool")


def slots_sharing(cuda_index: int = 0) -> int:
    """How many pool slots share the device this process sees as cuda:`cuda_index` (DRAFTSMITH_GPUS may list a
    device more than once): a job sizes its buffers on that share of the memory, since the other slots' jobs
    may not have taken theirs yet when it starts."""
    listed, seen = os.environ.get("DRAFTSMITH_GPUS"), os.environ.get("CUDA_VISIBLE_DEVICES")
    if not listed or not seen:
        return 1
    try:
        physical = int(seen.split(",")[cuda_index])
    except (ValueError, IndexError):  # UUIDs or an index past the list: no sharing to count
        return 1
    return max(1, visible_gpus().count(physical))


def visible_gpus() -> list[int]:
    """GPU indices this process may use: DRAFTSMITH_GPUS, else CUDA_VISIBLE_DEVICES, else (outside SLURM jobs)
    every GPU nvidia-smi lists.

    Read without importing torch (probing must be cheap, and a parent must not initialise CUDA before it hands
    devices to children). A SLURM job that set no CUDA_VISIBLE_DEVICES was granted no GPU: nvidia-smi there
    would list devices that belong to other jobs on the node.
    """
    env = os.environ.get("DRAFTSMITH_GPUS")  # an explicit pool, e.g. "0,1,2,3", wins over detection;
    # an id given k times is k slots of one device, for jobs of a small target that cannot fill a GPU alone
    if env is None:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None and os.environ.get("SLURM_JOB_ID"):
        env = ""
    if env is not None:
        entries = [x.strip() for x in env.split(",") if x.strip() not in ("", "-1")]
        if all(x.isdigit() for x in entries):
            return [int(x) for x in entries]
        return uuid_indices(entries, _nvidia_smi("index,uuid"))  # e.g. GPU-8f2c... on Kubernetes nodes
    table = _nvidia_smi("index")
    return [int(x) for x in table.split()] if table else []


def gpu_names() -> list[str]:
    """Names of the GPUs this process may use (for the plan's rates), without importing torch."""
    ids = set(visible_gpus())
    table = _nvidia_smi("index,name") or ""
    rows = [line.split(",", 1) for line in table.strip().splitlines() if "," in line]
    return [name.strip() for idx, name in rows if idx.strip().isdigit() and int(idx) in ids]


def _nvidia_smi(fields: str) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None


def uuid_indices(entries: list[str], table: str | None) -> list[int]:
    """CUDA_VISIBLE_DEVICES entries given as GPU UUIDs (or unique prefixes, as CUDA accepts) turned into the
    nvidia-smi indices the pool locks and hands on; `table` is `nvidia-smi --query-gpu=index,uuid` output."""
    rows = [[c.strip() for c in line.split(",")] for line in (table or "").splitlines() if "," in line]
    found = []
    for entry in entries:
        if entry.isdigit():
            found.append(int(entry))
            continue
        hits = [int(i) for i, uuid in rows if uuid.startswith(entry) or uuid.startswith("GPU-" + entry)]
        if len(hits) != 1:
            why = (
                "nvidia-smi is not available to resolve it"
                if table is None
                else ("no GPU has that UUID" if not hits else "it matches several GPUs")
            )
            raise RuntimeError(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} cannot be used for the GPU pool: {why}. Set "
                "DRAFTSMITH_GPUS to the nvidia-smi indices of the GPUs to use (e.g. DRAFTSMITH_GPUS=0,1); "
                "MIG instances are not pooled"
            )
        found.append(hits[0])
    return found


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _release(fds: list[int]) -> None:
    for fd in fds:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def try_acquire(n: int, devices: list[int], pool_dir: Path) -> tuple[list[int], list[int]] | None:
    """One attempt to lock n devices; prefers consecutive ids (they usually share a switch). None if busy."""
    pool_dir.mkdir(parents=True, exist_ok=True)
    held: list[tuple[int, int]] = []
    for k, dev in enumerate(devices):
        seen = devices[:k].count(dev)  # a device listed again is another slot of it, with its own lock
        fd = _try_lock(pool_dir / (f"gpu{dev}.lock" if not seen else f"gpu{dev}.{seen}.lock"))
        if fd is not None:
            held.append((dev, fd))
    if len(held) < n:
        _release([fd for _, fd in held])
        return None
    # keep the first run of n consecutive devices if there is one, else the first n
    ids = [d for d, _ in held]
    start = next((i for i in range(len(ids) - n + 1) if ids[i + n - 1] - ids[i] == n - 1), 0)
    keep = held[start : start + n]
    _release([fd for d, fd in held if (d, fd) not in keep])
    return [d for d, _ in keep], [fd for _, fd in keep]


@contextmanager
def acquire(
    n: int,
    devices: list[int] | None = None,
    pool_dir: str | Path | None = None,
    timeout: float | None = None,
    poll: float = 0.5,
    set_env: bool = True,
) -> Iterator[list[int]]:
    """Hold n devices for the duration of the block; sets CUDA_VISIBLE_DEVICES to them.

    With no GPU (or n == 0) it yields [] and hides CUDA, so the job runs on the CPU. Either way the variable
    is as it was after the block: a process that runs several blocks (a test session) sees its GPUs again.
    """
    devices = visible_gpus() if devices is None else devices
    pool = Path(pool_dir) if pool_dir is not None else default_pool_dir()
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    if n <= 0 or not devices:
        if set_env:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        try:
            yield []
        finally:
            if set_env:
                _restore_visible(old)
        return
    if n > len(devices):
        raise RuntimeError(f"a job needs {n} GPUs but only {len(devices)} are visible ({devices})")
    start = time.monotonic()
    warned = False
    while True:
        got = try_acquire(n, devices, pool)
        if got is not None:
            break
        if timeout is not None and time.monotonic() - start > timeout:
            raise TimeoutError(f"no {n} free GPUs among {devices} after {timeout:.0f}s (pool {pool})")
        if not warned and time.monotonic() - start > 10:
            log.warning("waiting for %d free GPU(s) among %s (pool %s)", n, devices, pool)
            warned = True
        time.sleep(poll)
    ids, fds = got
    if set_env:
        # slots of one device name it once
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, dict.fromkeys(ids)))
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA then numbers GPUs as nvidia-smi does
    log.info("took GPU(s) %s from the pool", ids)
    try:
        yield ids
    finally:
        line = peak_memory_line()
        if line:
            log.info("%s", line)
        _release(fds)
        if set_env:
            _restore_visible(old)


def _restore_visible(old: str | None) -> None:
    """CUDA_VISIBLE_DEVICES back to what it was before a block of `acquire` (unset if it was)."""
    if old is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = old


def copies_sharing_a_gpu(probe: dict) -> int:
    """Copies of a target that run at once on one GPU: the slots DRAFTSMITH_GPUS lists it for (jobs of a small
    target share it that way); one where a copy spans a group of GPUs or there is no GPU. The rates job times
    that many copies together, as the jobs will run."""
    if int(probe.get("gpus_per_copy", 0)) != 1:
        return 1
    return max([int(g.get("slots", 1)) for g in probe.get("gpus", [])] or [1])
