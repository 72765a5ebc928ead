"""FlexAttention's tiles for the drafter: Inductor's defaults where they fit, smaller ones where a GPU's
shared memory a block cannot hold them (sm_12x: 101,376 bytes), proven by building the 27B drafter's
forward and backward kernels for sm_120 on the GPU at hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.drafter.model import SMALL_FLEX_TILES, flex_tiles

SM120_SHARED = 101_376  # bytes a block on sm_120 (RTX PRO 6000 Blackwell)
REPO = Path(__file__).resolve().parents[2]


def test_small_tiles_only_where_the_defaults_do_not_fit(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("DRAFTSMITH_SHARED_MEMORY", str(SM120_SHARED))
    assert flex_tiles(256, cpu) == SMALL_FLEX_TILES and flex_tiles(128, cpu) is None
    monkeypatch.setenv("DRAFTSMITH_SHARED_MEMORY", "232448")  # an H100 or H200
    assert flex_tiles(256, cpu) is None
    monkeypatch.setenv("DRAFTSMITH_SHARED_MEMORY", str(SM120_SHARED))
    monkeypatch.setenv("DRAFTSMITH_FLEX_TILES", "default")
    assert flex_tiles(256, cpu) is None
    assert all(128 % SMALL_FLEX_TILES[b] == 0 for b in ("BLOCK_M", "BLOCK_N", "BLOCK_M1", "BLOCK_N1"))


def _built_for_sm120(tmp: Path, **env: str) -> dict:
    run = subprocess.run(
        [sys.executable, str(REPO / "tests/unit/flex_tiles.py"), "120"],
        env={
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
            "TRITON_CACHE_DIR": str(tmp / "triton"),
            "TORCHINDUCTOR_COMPILE_THREADS": "1",  # compile in this process, where triton.compile is watched
            "PYTHONPATH": str(REPO),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="builds the kernels with Inductor on a CUDA GPU")
def test_the_drafters_flex_kernels_fit_sm120(tmp_path):
    """With sm_120's shared memory, every kernel of the forward and backward fits it when built for sm_120;
    with Inductor's default tiles (today's code before this choice), the flex kernels do not."""
    small = _built_for_sm120(tmp_path / "small", DRAFTSMITH_SHARED_MEMORY=str(SM120_SHARED))
    flex = [k for k in small["kernels"] if "flex" in k["name"]]
    assert {"fwd", "bwd"} <= {"bwd" if "backward" in k["name"] else "fwd" for k in flex}, small["kernels"]
    assert all("error" not in k and k["shared"] <= SM120_SHARED for k in small["kernels"]), small
    default = _built_for_sm120(tmp_path / "default", DRAFTSMITH_FLEX_TILES="default")
    assert max(k.get("shared", 0) for k in default["kernels"] if "flex" in k["name"]) > SM120_SHARED, default
    print(json.dumps({"small": small, "default": default}))
