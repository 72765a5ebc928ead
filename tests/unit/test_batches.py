"""Training's batches: the epoch plans that pack samples under the token budget, a batch decoded where it
trains, and the training-loop benchmark's smoke run."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.core.io import write_json
from draftsmith.dataset.merge import MergedDataset
from draftsmith.dataset.shards import ShardReader, ShardWriter, quantize_fp8
from draftsmith.drafter.batches import fit_plan, load_batch, plan_epoch, sample_cost
from draftsmith.drafter.config import DrafterConfig

V, H = 64, 32  # a toy vocabulary and hidden size


def test_plan_respects_budget_and_covers_every_sample():
    import numpy as np

    lengths = np.array([10, 50, 30, 300, 20, 40])
    idx = np.arange(6)
    batches = plan_epoch(lengths, idx, 200, 4, 4, 0, 0)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:
        cost = sum(sample_cost(lengths[i], 4, 4) for i in b)
        assert cost <= 200 or len(b) == 1
    assert plan_epoch(lengths, idx, 200, 4, 4, 0, 1) != batches or len(batches) == 1  # reshuffled per epoch


def test_every_epoch_has_the_first_epochs_step_count():
    """Long samples against the budget: a new shuffle can pack into fewer batches than epoch 0's, and training
    indexed past the end of the plan (IndexError at step 19 of 24 on SmolLM2 with 2048-token answers)."""
    import numpy as np

    lengths = np.array([90, 90, 60, 60, 30, 30, 110, 20])
    idx = np.arange(len(lengths))
    counts = {len(plan_epoch(lengths, idx, 200, 2, 4, 0, e)) for e in range(20)}
    assert len(counts) > 1  # greedy packing really does vary here
    want = len(plan_epoch(lengths, idx, 200, 2, 4, 0, 0))
    for e in range(20):
        plan = fit_plan(plan_epoch(lengths, idx, 200, 2, 4, 0, e), want)
        assert len(plan) == want
        for b in plan:
            assert sum(sample_cost(lengths[i], 2, 4) for i in b) <= 200 or len(b) == 1
        if len(plan_epoch(lengths, idx, 200, 2, 4, 0, e)) <= want:  # split, never dropped
            assert sorted(i for b in plan for i in b) == list(range(len(lengths)))


@pytest.mark.parametrize("storage", ["fp8", "bf16"])
def test_a_batch_is_decoded_where_it_trains_into_the_states_the_reader_gives(tmp_path, storage):
    """Training reads the stored rows and decodes them on its device (on a small target the host's decode
    set the step time); the states must be the reader's, bit for bit, in the training dtype."""
    g = torch.Generator().manual_seed(0)
    lengths, width = [7, 12, 9], 3 * H
    w = ShardWriter(tmp_path / "shards" / "s0.safetensors", lengths, width, storage)
    for i, t in enumerate(lengths):
        x = torch.randn(t, width, generator=g) * (1 + i)
        q, scale = quantize_fp8(x) if storage == "fp8" else (x.to(torch.bfloat16), None)
        w.write_sample(i, q, torch.randint(0, V, (t,), generator=g), torch.ones(t, dtype=torch.bool), scale)
    w.close()
    manifest = tmp_path / "merged" / "manifest.json"
    shard = {"path": "../shards/s0.safetensors", "num_samples": 3, "sample_tokens": lengths}
    write_json(manifest, {"taps": [0, 1, 2], "hidden_size": H, "storage": storage, "shards": [shard]})
    ds, reader = MergedDataset(manifest), ShardReader(tmp_path / "shards" / "s0.safetensors")
    cfg = DrafterConfig(
        hidden_size=H,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        intermediate_size=64,
        vocab_size=V,
        target_layer_ids=[0, 1, 2],
        num_target_layers=3,
        mask_token_id=V - 1,
        block_size=4,
    )
    batch = load_batch(ds, [2, 0], 0, {"anchors_per_seq": 3, "seed": 0}, cfg)
    assert (batch.taps_scale is not None) == (storage == "fp8") and batch.taps.dtype != torch.float32
    for dtype in (torch.float32, torch.bfloat16):
        want = torch.cat([reader.hidden(j, dtype) for j in (2, 0)])
        got = batch.to(torch.device("cpu"), dtype).taps
        assert got.dtype == dtype and torch.equal(got, want)


def test_bench_train_loop_runs_the_three_loops_on_the_same_data(tmp_path, capsys):
    """The training-loop benchmark (CPU smoke shape): every loop times its steps, and the read-ahead loop
    trains on the batches the host-decoded one does (the same seeded losses, up to fp32 vs bf16 decoding)."""
    from draftsmith.perf import bench_train_loop

    bench_train_loop.main(["--workdir", str(tmp_path)])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(r) == {"host", "ahead", "resident"}
    assert all(v["steps_per_s"] > 0 and v["tokens_per_s"] > 0 for v in r.values())
    host, ahead = r["host"]["losses"], r["ahead"]["losses"]
    assert host[0] == pytest.approx(ahead[0], rel=1e-5)  # same batch, same weights: only the decode rounds
    assert host == pytest.approx(ahead, rel=1e-3)  # later steps drift with it, never apart
    assert r["resident"]["losses"][0] == pytest.approx(r["ahead"]["losses"][0], rel=1e-5)
