"""The GPU memory cap (`gpu_memory`, DRAFTSMITH_GPU_MEMORY): read as jobs read it, shared slots and the cap
combined, refused where it is not a size; on a GPU, PyTorch's allocator held to it."""

import os
import subprocess
import sys

import pytest
import torch

from draftsmith.core.gpu_memory import ENV, cap_setting, device_limit, max_memory_map, memory_cap


def test_the_cap_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert memory_cap() is None and max_memory_map(2) is None
    monkeypatch.setenv(ENV, "90GB")
    assert memory_cap() == 90 * 10**9
    assert max_memory_map(2) == {0: 90 * 10**9, 1: 90 * 10**9}
    monkeypatch.setenv(ENV, "88GiB")
    assert memory_cap() == 88 * 2**30
    monkeypatch.setenv(ENV, "a lot")
    with pytest.raises(ValueError, match=ENV):
        memory_cap()


def test_the_config_key_becomes_bytes_or_is_refused_by_name():
    assert cap_setting(None) is None
    assert cap_setting("96GB") == str(96 * 10**9) and cap_setting(2**30) == str(2**30)
    with pytest.raises(ValueError, match="gpu_memory: 'lots' is not a size"):
        cap_setting("lots")
    with pytest.raises(ValueError, match="gpu_memory: .* positive"):
        cap_setting(0)


def test_a_job_gets_its_slots_share_and_never_more_than_the_cap(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("DRAFTSMITH_GPUS", "3,3")  # two jobs share device 3
    total = 96 * 10**9
    assert device_limit(0, total) == total // 2
    monkeypatch.setenv(ENV, "40GB")
    assert device_limit(0, total) == 40 * 10**9
    monkeypatch.setenv(ENV, "60GB")
    assert device_limit(0, total) == total // 2
    monkeypatch.delenv("DRAFTSMITH_GPUS")
    assert device_limit(0, total) == 60 * 10**9


HOLD = """
import os, torch
from draftsmith.core.gpu_memory import hold_to_cap, job_memory
device = torch.device("cuda", 0)
hold_to_cap(device)
free, limit = job_memory(device)
assert limit == 2 * 10**9 and free <= limit, (free, limit)
x = torch.empty(10**9, dtype=torch.uint8, device=device)  # 1 GB: under the cap
try:
    y = torch.empty(2 * 10**9, dtype=torch.uint8, device=device)  # 3 GB in all: over it
except torch.OutOfMemoryError:
    print("refused")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_allocator_refuses_to_pass_the_cap():
    # in a process of its own: the allocator's limit lasts as long as the process
    env = {**os.environ, ENV: "2GB"}
    out = subprocess.run([sys.executable, "-c", HOLD], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "refused", out.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_probe_sees_the_cap(monkeypatch):
    from draftsmith.target.placement import gpu_info

    monkeypatch.setenv(ENV, "20GiB")
    gpus = gpu_info()
    assert gpus and all(g["free_gib"] <= 20 and g["cap_gib"] == 20 for g in gpus)
