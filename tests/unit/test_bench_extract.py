"""The extraction benchmark runs end to end on a tiny target and reports sane ratios (not a timed
assertion)."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from torch.autograd import DeviceType

from draftsmith.dataset.extract import ExtractStats
from draftsmith.dataset.plan import make_batches
from draftsmith.perf.extraction import draw_lengths, model_flops, torch
from draftsmith.perf.profile_extract import kind_of, time_by_kind
from draftsmith.perf.shapes import build_model, load_shape

ROOT = Path(__file__).resolve().parents[2]


def test_bench_extract_cpu_smoke(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "-m",
        "draftsmith.perf.bench_extract",
        "--shape",
        "tiny-attention",
        "--tokens",
        "3000",
        "--lengths",
        "loguniform:16:256",
        "--storage",
        "fp8",
        "--naive-fraction",
        "0.3",
        "--out-dir",
        str(tmp_path / "shards"),
        "--json-out",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "(b)/(a)" in res.stdout and "padding waste" in res.stdout
    r = json.loads(out.read_text())
    for key in (
        "bare_tokens_per_s",
        "extract_tokens_per_s",
        "extract_over_bare",
        "bare_fraction_of_ceiling",
        "padding_waste",
        "gpu_idle_s",
        "written_gb_per_s",
        "produce_gb_per_s",
        "storage_gb_per_s",
        "naive_over_bare",
        "matmul_ceiling_tflops",
        "model_flops_per_token",
    ):
        assert np.isfinite(r[key]) and r[key] >= 0, key
    assert r["tokens"] >= 3000 and 0 < r["extract_over_bare"] < 10
    assert 0 <= r["padding_waste"] < 0.5 and r["gpu_idle_s"] <= r["extract_stats"]["seconds"]
    assert r["bytes_per_token"] == 5 * 128 + 4  # fp8 taps plus one fp32 scale per row
    assert not list((tmp_path / "shards").rglob("*.safetensors"))  # cleaned up without --keep


def test_batching_keeps_padding_low_on_loguniform_lengths():
    lengths = draw_lengths("loguniform:64:8192", 400_000, None, seed=0)
    batches = make_batches(lengths, 65536)
    padded = sum(len(b) * lengths[b].max() for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) == 1 or len(b) * lengths[b].max() <= 65536 for b in batches)
    assert 1 - lengths.sum() / padded <= 0.05


def test_model_flops_count_layers_run_and_attention():
    fields, _ = load_shape("tiny-attention")
    model = build_model(fields, None, torch.device("cpu"), torch.float32)
    lengths = np.array([10, 20])
    one_layer = model_flops(model, lengths, [0])
    two_layers = model_flops(model, lengths, [0, 1])
    assert np.isclose(two_layers, 2 * one_layer)  # identical layers: only the layers run are counted
    params = sum(p.numel() for p in model.model.layers[0].parameters())
    attn = 4 * 4 * 32 * (10 * 11 / 2 + 20 * 21 / 2)
    assert np.isclose(one_layer, 2 * params * 30 + attn)


def test_storage_limited_flag_needs_slow_storage_and_waiting():
    s = ExtractStats(
        tokens=1000,
        seconds=10.0,
        gpu_busy_seconds=5.0,
        write_seconds=9.0,
        flush_seconds=2.0,
        writer_wait_seconds=4.0,
        bytes_written=10**10,
    )
    assert s.produce_gb_s == 2.0 and np.isclose(s.storage_gb_s, 10 / 11) and s.storage_limited
    assert s.gpu_idle_seconds == 5.0 and "storage" in s.summary()
    fast = ExtractStats(
        tokens=1000, seconds=10.0, gpu_busy_seconds=9.9, write_seconds=1.0, bytes_written=10**10
    )
    assert not fast.storage_limited


def test_the_profile_sorts_kernels_into_kinds_and_counts_the_wall_time_none_covered():
    """Kernel names as an H200 profile of the 27B shape lists them (cuBLAS, SDPA, fla's Triton kernels,
    ATen element-wise); the kinds' shares and the uncovered rest add up to the pass's wall time."""
    names = {
        "nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT": "matmul",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64": "matmul",
        "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<256, 128, 64, 4>>": "attention",
        "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": "gated deltanet",
        "merge_16x16_to_64x64_inverse_kernel": "gated deltanet",
        "causal_conv1d_fwd_kernel": "convolution",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>": (
            "norms and element-wise"
        ),
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>": "norms and element-wise",
    }
    assert {n: kind_of(n) for n in names} == names
    assert kind_of("some_new_kernel") == "other"
    # the engine's own decode kernels (draftsmith.engine.triton_kernels)
    assert [kind_of(n) for n in ("gdn_step", "conv_step", "attend")] == [
        "gated deltanet",
        "convolution",
        "attention",
    ]
    times_us = {
        "nvjet_tst_a": 600_000,
        "chunk_fwd_kernel_o": 150_000,
        "vectorized_elementwise_kernel": 100_000,
    }
    events = [SimpleNamespace(key=n, self_device_time_total=us) for n, us in times_us.items()]
    # a profile with CPU activity lists the ops too; their kernels are already counted as themselves
    events.append(SimpleNamespace(key="aten::mm", self_device_time_total=600_000, device_type=DeviceType.CPU))
    rows = time_by_kind(events, wall_s=1.0)
    assert [r[0] for r in rows] == ["matmul", "gated deltanet", "norms and element-wise",
                                    "no kernel running (launch gaps, host)"]  # fmt: skip
    assert abs(sum(r[2] for r in rows) - 1.0) < 1e-9 and abs(rows[-1][1] - 0.15) < 1e-9
