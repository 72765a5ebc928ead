"""The probe's placement arithmetic: GPUs per model copy, slots and the token budget, for whole GPUs and for a
GPU that several jobs share."""

import pytest

from draftsmith.target.placement import GIB, decide

PER_TOKEN = 64 * 1024  # activation bytes per token
H200 = {"index": 0, "name": "NVIDIA H200", "total_gib": 140.0, "free_gib": 139.8}


def test_a_target_that_fits_one_gpu_takes_one_and_the_budget_fills_its_memory():
    d = decide([H200, {**H200, "index": 1}], 16 * GIB, PER_TOKEN, None, 4096, 2)
    assert d["gpus_per_copy"] == 1 and d["slots"] == 2
    assert d["token_budget"] == 65536  # the cap: 139.8 GiB would hold more


def test_a_large_target_takes_the_smallest_group_that_fits():
    d = decide([{**H200, "index": i} for i in range(4)], 200 * GIB, PER_TOKEN, None, 4096, 2)
    assert d["gpus_per_copy"] == 2 and d["slots"] == 2


def test_a_shared_gpu_gives_each_job_its_share_of_memory():
    """Six slots of one H200 (the study's DRAFTSMITH_GPUS=0,0,0,0,0,0): each job budgets a sixth of the memory
    beside its own copy of the weights; before, every job planned on the whole GPU."""
    alone = decide([H200], 8 * GIB, PER_TOKEN, None, 4096, 2)
    shared = decide([{**H200, "slots": 6}], 8 * GIB, PER_TOKEN, None, 4096, 2)
    assert alone["token_budget"] == shared["token_budget"] == 65536  # both capped at this size
    big_tokens = 1 << 20  # 1 MiB a token: the share binds
    alone = decide([H200], 8 * GIB, big_tokens, None, 4096, 2)
    shared = decide([{**H200, "slots": 6}], 8 * GIB, big_tokens, None, 4096, 2)
    assert shared["slots"] == 6 and shared["gpus_per_copy"] == 1
    share = (139.8 * 0.9 / 6 - 8) * GIB
    assert shared["token_budget"] * big_tokens <= share < alone["token_budget"] * big_tokens


def test_a_target_too_big_for_its_share_names_the_listing():
    with pytest.raises(RuntimeError, match="DRAFTSMITH_GPUS lists a device 6 times"):
        decide([{**H200, "slots": 6}], 30 * GIB, PER_TOKEN, None, 4096, 2)
    assert decide([H200], 30 * GIB, PER_TOKEN, None, 4096, 2)["gpus_per_copy"] == 1  # alone it fits
