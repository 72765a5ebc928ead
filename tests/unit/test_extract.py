"""Extraction: batched, padded, hook-based extraction equals batch-1 recomputation; the shard file is
sound."""

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_model
from transformers import AutoModelForCausalLM

from draftsmith.config import default_taps
from draftsmith.dataset.extract import extract_samples
from draftsmith.dataset.plan import make_batches
from draftsmith.dataset.shards import (
    ShardReader,
    ShardWriter,
    combine_crcs,
    decode,
    quantize_fp8,
    stored_faults,
)
from draftsmith.dataset.validate import default_tolerance, recompute_checks, structural_checks
from draftsmith.target.kernels import kernels_follow_device, report_kernels
from draftsmith.target.layers import has_linear_attention, mixer_module
from draftsmith.target.taps import reference_taps


def random_samples(n: int, vocab: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 60, size=n)
    rows = []
    for i, t in enumerate(lengths):
        mask = np.zeros(t, dtype=np.uint8)
        mask[t // 2 :] = 1
        rows.append(
            {
                "id": f"s{i}",
                "input_ids": rng.integers(0, vocab, size=t).astype(np.int32),
                "loss_mask": mask,
                "prompt_len": t // 2,
                "num_tokens": int(t),
            }
        )
    return pd.DataFrame(rows)


def test_default_taps_follow_dflash():
    assert default_taps(36) == [1, 9, 17, 25, 33]  # Qwen3-8B drafter
    assert default_taps(64) == [1, 16, 31, 46, 61]  # Qwen3.6-27B drafter
    with pytest.raises(ValueError, match="repeat"):
        default_taps(6)


@pytest.mark.parametrize("kind", ["hybrid", "attention"])
@pytest.mark.parametrize("storage", ["bf16", "fp8"])
def test_batched_extraction_equals_batch1(kind, storage, request, tmp_path):
    path = request.getfixturevalue(f"{kind}_target")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    samples = random_samples(9, model.config.vocab_size)
    taps = [1, 3, 5, 7]  # includes the last layer (read before the final norm)
    out = tmp_path / "shard000.safetensors"
    checksum, stats = extract_samples(
        model, samples, taps, out, token_budget=120, storage=storage, progress=False
    )
    assert stats.batches > 1 and stats.tokens == samples["num_tokens"].sum()
    assert not (tmp_path / "shard000.safetensors.partial").exists()
    reader = ShardReader(out)
    tol = default_tolerance(torch.float32, storage)
    for i in range(len(samples)):
        ids, mask = reader.tokens(i)
        assert ids.tolist() == samples["input_ids"][i].tolist()
        assert mask.long().tolist() == samples["loss_mask"][i].tolist()
        ref = reference_taps(model, ids[None], taps)[0]
        got = reader.hidden(i, torch.float32)
        err = float((got - ref).norm() / ref.norm())
        assert err < tol, (i, err)
    assert combine_crcs([reader.crc(i) for i in range(len(samples))]) == checksum


def test_validation_catches_zeroed_and_wrong_layer_states(hybrid_target, tmp_path):
    """The failure that motivated draftsmith: states that look fine but are zeros or from the wrong layer."""
    model = AutoModelForCausalLM.from_pretrained(hybrid_target, dtype=torch.float32).eval()
    samples = random_samples(4, model.config.vocab_size, seed=1)
    taps = [1, 2, 3]
    width = len(taps) * model.config.hidden_size
    manifest = {"taps": taps, "hidden_size": model.config.hidden_size, "sample_ids": samples["id"].tolist()}

    def write(path, fn):
        w = ShardWriter(path, samples["num_tokens"].tolist(), width)
        for i in range(len(samples)):
            ids = torch.as_tensor(samples["input_ids"][i]).long()
            h = fn(ids)
            w.write_sample(i, h.bfloat16(), ids, torch.as_tensor(samples["loss_mask"][i]))
        return w.close()

    good = write(tmp_path / "good.safetensors", lambda ids: reference_taps(model, ids[None], taps)[0])
    manifest["checksum"] = good
    reader = ShardReader(tmp_path / "good.safetensors")
    assert structural_checks(reader, manifest, samples) == []
    fails, rows = recompute_checks(model, reader, manifest, k=2, tol=0.02, seed=0)
    assert fails == [] and len(rows) == 2

    zeros = write(tmp_path / "zeros.safetensors", lambda ids: torch.zeros(len(ids), width))
    manifest["checksum"] = zeros
    fails = structural_checks(ShardReader(tmp_path / "zeros.safetensors"), manifest, samples)
    assert any("all-zero" in f for f in fails)

    shifted = write(
        tmp_path / "shifted.safetensors", lambda ids: reference_taps(model, ids[None], [2, 3, 4])[0]
    )
    manifest["checksum"] = shifted
    reader = ShardReader(tmp_path / "shifted.safetensors")
    assert structural_checks(reader, manifest, samples) == []  # looks fine on its own...
    fails, _ = recompute_checks(model, reader, manifest, k=2, tol=0.02, seed=0)
    assert fails and "relative error" in fails[0]  # ...but the recomputation catches it


@pytest.mark.parametrize("storage", ["bf16", "fp8"])
def test_the_stored_bits_check_agrees_with_decoding_every_value(storage):
    """Validation reads a shard's faults from its stored bits, not from decoded values: on rows of every kind
    of fault, both must give the same answer."""
    torch.manual_seed(0)
    x = torch.randn(12, 40) * 3
    x[1] = 0.0  # an all-zero row
    x[2] = -0.0  # zeros with the sign bit set
    x[3, :39] = 0.0  # one value short of zero
    x[4, 7] = 1e-30  # rounds to zero in fp8 (relative to the row's scale) but not in bf16
    x[4, 8] = 1.0
    cases = {"clean": x}
    for name, row, value in [("nan", 5, float("nan")), ("inf", 6, float("inf")), ("-inf", 7, -float("inf"))]:
        bad = x.clone()
        bad[row, 3] = value
        cases[name] = bad

    def decoded(hidden, scale):
        h = decode(hidden, scale, torch.float32)
        return not bool(torch.isfinite(h).all()), int((h == 0).all(dim=-1).sum())

    for name, values in cases.items():
        if storage == "fp8":
            hidden, scale = quantize_fp8(torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0))
            if name != "clean":  # float8 e4m3fn has no infinity: a fault is its NaN byte
                hidden = hidden.clone()
                hidden.view(torch.uint8)[5, 3] = 0x7F if name != "-inf" else 0xFF
        else:
            hidden, scale = values.to(torch.bfloat16), None
        assert stored_faults(hidden, scale) == decoded(hidden, scale), (storage, name)
        assert stored_faults(hidden, scale)[1] >= 2, (storage, name)  # the zero rows are seen
    if storage == "fp8":  # scales no quantizer writes, but a damaged file may hold
        hidden, scale = quantize_fp8(x)
        scale[0] = 0.0
        assert stored_faults(hidden, scale) == decoded(hidden, scale) == (False, 3)
        tiny = torch.zeros(2, 40, dtype=torch.uint8)
        tiny[:, 0] = 0x01  # the smallest subnormal byte
        for s0, s1, codes in [
            (0.0, 1.0, {(0, 5): 0x7F}),  # a NaN byte in a row whose scale is zero
            (float("inf"), float("nan"), {}),  # zero bytes under an infinite or NaN scale
            (1e38, 1.0, {(0, 5): 0x10}),  # a small value that a huge scale leaves finite...
            (1e38, 1.0, {(0, 5): 0x7E}),  # ...and the largest, which it does not
            (1e-45, 1.0, {}),  # a subnormal scale that zeroes the smallest value in fp32
        ]:
            q = tiny.clone()
            for at, code in codes.items():
                q[at] = code
            hidden, scale = q.view(torch.float8_e4m3fn), torch.tensor([s0, s1])
            assert stored_faults(hidden, scale) == decoded(hidden, scale), (s0, s1, codes)


@pytest.mark.parametrize("storage", ["bf16", "fp8"])
def test_the_validation_benchmark_times_both_checks_on_a_real_shard(storage, capsys):
    from draftsmith.perf.bench_validate import main

    main(["--samples", "6", "--tokens", "16", "--width", "64", "--storage", storage, "--repeats", "1"])
    out = capsys.readouterr().out
    assert "6 samples" in out and f"({storage})" in out
    assert "| stored bits (structural_checks) |" in out and "decoded / stored bits: " in out


def test_make_batches_respects_budget_and_sorts():
    lengths = [5, 100, 7, 60, 60, 3]
    batches = make_batches(lengths, token_budget=130)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 130
    assert batches[0] == [1]  # longest first


def test_linear_attention_is_found_in_a_multimodal_config():
    """Qwen3.6 checkpoints are multimodal: the layer kinds sit under text_config, and fla's kernels must still
    be chosen for them."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        vocab_size=256,
        full_attention_interval=2,
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        patch_size=4,
        spatial_merge_size=1,
        temporal_patch_size=1,
    )
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision))
    assert getattr(model.config, "layer_types", None) is None  # only the text config knows
    assert has_linear_attention(model)
    assert "flash-linear-attention" in report_kernels(model)


def test_cpu_tensors_never_reach_a_gpu_only_kernel(monkeypatch):
    """With fla installed, Transformers binds its Triton kernels whatever device the model is on; a hybrid
    model on the CPU must still run (on Transformers' torch functions) and compute what it computes without
    fla."""
    import functools
    import inspect

    model = tiny_model("hybrid", 128, layers=4)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
    module = mixer_module(model)
    for name in ("torch_chunk_gated_delta_rule", "causal_conv1d_fn"):
        reference = inspect.unwrap(getattr(module, name))

        @functools.wraps(
            reference
        )  # how Transformers binds a kernel package: __wrapped__ is its torch function
        def triton_only(*args, _name=name, **kwargs):
            raise ValueError(f"{_name}: Pointer argument cannot be accessed from Triton (cpu tensor?)")

        monkeypatch.setattr(module, name, triton_only)
    with pytest.raises(ValueError, match="cpu tensor"), torch.no_grad():
        model(ids)
    kernels_follow_device(model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want)


def test_exact_fp32_sets_the_tf32_switches_for_its_block_only():
    from draftsmith.target.kernels import exact_fp32

    torch.backends.cudnn.allow_tf32 = True  # cuDNN's default
    with pytest.raises(RuntimeError, match="inside"), exact_fp32():
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        raise RuntimeError("inside")
    assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="routing CUDA tensors needs a GPU")
def test_exact_fp32_sends_cuda_tensors_to_the_torch_gated_deltanet(monkeypatch):
    """fla's chunked forward rounds to tf32 inside its kernel, so the bench's fp32 check runs Transformers'
    torch functions on the GPU; outside the check CUDA tensors still reach the bound kernel."""
    import functools
    import inspect

    from draftsmith.target.kernels import exact_fp32

    model = tiny_model("hybrid", 128, layers=4).cuda().float()
    module = mixer_module(model)
    reference = inspect.unwrap(module.torch_chunk_gated_delta_rule)
    calls = []

    @functools.wraps(reference)  # bound as Transformers binds a kernel package
    def bound(*args, **kwargs):
        calls.append(args[0].device.type)
        return reference(*args, **kwargs)

    monkeypatch.setattr(module, "torch_chunk_gated_delta_rule", bound)
    kernels_follow_device(model)
    ids = torch.randint(0, 128, (2, 70), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        model(ids)
        assert calls == ["cuda"] * 3  # the hybrid tiny model's three linear-attention layers
        with exact_fp32():
            model(ids)
    assert calls == ["cuda"] * 3
