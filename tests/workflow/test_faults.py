"""Faults and bad input: nothing finished is lost, nothing broken is kept, and every failure says what to do.

Real processes, real files, the real Snakemake CLI on a tiny real target. Failures are real too: a SIGKILL from
outside, bytes changed in a shard file, a second run on the same folder; where a failure cannot be had on a CPU
on demand (out of memory, a full disk) a drill switch of draftsmith.core.faults makes the job meet it where the real
one strikes, and the recovery path that follows is the production one.

Proved elsewhere, not repeated here:
  training killed mid-run resumes     test_train.py::test_sigkill_mid_run_then_rerun_finishes_the_same_run
  a killed job's GPU lock is freed    test_gpu_pool.py::test_killed_job_frees_its_devices
  a deleted shard is recomputed alone test_workflow.py::test_rerun_recomputes_only_the_broken_shard
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import BAD, GOOD, REPO, digest, job_counts, make_workflow, snakemake

SHARDS = [f"shard{i:03d}" for i in range(4)]


def outputs(res: Path) -> dict[str, str]:
    """Digests of everything the training set consists of: shard files, their manifests' checksums, the merge."""
    out = {s: digest(res / f"extract/{s}.safetensors") for s in SHARDS}
    out["merged"] = digest(res / "merged/manifest.json")
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer) -> dict:
    """A tiny target, its data and a config of four shards (a 512-token budget: two batches per shard)."""
    root = tmp_path_factory.mktemp("faults")
    config = make_workflow(root, tokenizer, extract={"shards": 4, "validate_samples": 1, "token_budget": 512})
    cfg = yaml.safe_load(config.read_text())
    return {
        "root": root,
        "config": config,
        "cfg": cfg,
        "target": cfg["target"]["model"],
        "res": root / "results",
    }


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before it reached {path.name}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout}s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def ref(setup) -> dict:
    """The run to the training set, with a fault: the shard001 job is held mid-write, a second run is started on
    the same folder, then the job is SIGKILLed from outside. Afterwards shard001 is deleted and recomputed by a
    plain rerun, uninterrupted: that run's bytes are the reference the other tests compare with."""
    res, config = setup["res"], setup["config"]
    flag = setup["root"] / "pause"
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        DRAFTSMITH_PAUSE_AT="extract:shard001",
        DRAFTSMITH_PAUSE_FILE=str(flag),
    )
    first = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2", "dataset", "--configfile", str(config)],  # locked
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: dict = {}
    try:
        wait_for(flag, first)
        pid = int(flag.read_text())
        time.sleep(0.3)  # the writer thread puts the first batch into the file
        seen["partial_size"] = (res / "extract/shard001.safetensors.partial").stat().st_size
        seen["final_while_paused"] = (res / "extract/shard001.safetensors").exists()
        seen["second"] = snakemake("dataset", "--configfile", str(config), check=False, lock=True)
        os.kill(pid, signal.SIGKILL)  # the flag stays: the retry goes on without a pause
        seen["first_out"] = first.communicate(timeout=300)[0]
    finally:
        if first.poll() is None:  # a failed step above: end the run this fixture started
            first.kill()
            first.wait()
    seen["first_rc"] = first.returncode
    seen["dry"] = snakemake("dataset", "-n", "--configfile", str(config)).stdout
    seen["after_kill"] = outputs(res)
    seen["leftovers"] = sorted(p.name for p in (res / "extract").iterdir() if p.name.endswith(".partial"))
    for p in (res / "extract/shard001.safetensors", res / "extract/shard001.json"):
        p.unlink()
    rerun = snakemake("dataset", "--configfile", str(config))
    seen["recompute"] = rerun.stdout + rerun.stderr
    return setup | {"seen": seen, "digests": outputs(res)}


def test_sigkill_mid_write_reruns_only_that_shard_and_merges_identically(ref):
    """1. SIGKILL mid-write: the half-written file never counts as done, Snakemake restarts that job alone (the
    rule's retry; when there is none left, the next `snakemake` does the same), and the merged result is
    byte-identical to the one of a run where that job was not interrupted."""
    seen = ref["seen"]
    assert seen["partial_size"] > 0 and not seen["final_while_paused"]
    assert seen["first_rc"] == 0, seen["first_out"][-3000:]
    assert seen["first_out"].count("Trying to restart job") == 1  # only the killed job ran again
    assert "Nothing to be done" in seen["dry"], seen["dry"][-2500:]
    assert seen["leftovers"] == []
    counts = job_counts(seen["recompute"])
    assert counts.get("extract") == 1 and counts.get("validate") == 1, seen["recompute"][-2000:]
    assert seen["after_kill"] == ref["digests"]


def test_second_run_on_the_same_results_is_refused(ref):
    """9. Two workflow runs on one results folder: Snakemake's lock refuses the second, which touches nothing
    (the first one's outputs end byte-identical to the reference, see above)."""
    second = ref["seen"]["second"]
    assert second.returncode != 0
    assert "cannot be locked" in second.stdout + second.stderr
    assert ref["seen"]["after_kill"] == ref["digests"]


def hidden_span(path: Path) -> tuple[int, int, int]:
    """(file offset of the `hidden` tensor, its row bytes, rows) from the safetensors header."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    a, _ = header["hidden"]["data_offsets"]
    rows, width = header["hidden"]["shape"]
    return 8 + n + a, width * 2, rows


def damage(path: Path, how: str) -> None:
    raw = bytearray(path.read_bytes())
    start, row, rows = hidden_span(path)
    if how == "truncated":
        raw = raw[: len(raw) // 2]
    elif how == "bit-flip":
        raw[start + (rows // 2) * row + 7] ^= 0x01  # one low mantissa bit of one value: still finite
    elif how == "nan-and-zero-rows":
        raw[start + row : start + 2 * row] = b"\xc0\x7f" * (row // 2)  # bf16 NaN over the second row
        raw[start + 2 * row : start + 3 * row] = bytes(row)  # and zeros over the third
    path.write_bytes(bytes(raw))


DAMAGE = {
    "shard000": ("truncated", "file check failed", ["cannot read"]),
    "shard001": ("bit-flip", "structure check failed", ["checksum mismatch"]),
    "shard002": (
        "nan-and-zero-rows",
        "structure check failed",
        ["non-finite hidden states", "1 all-zero hidden rows"],
    ),
}


def test_damaged_shards_fail_validation_by_name_and_are_repaired_alone(ref):
    """2. Truncated, bit-flipped, NaN and all-zero-row shard files (bytes changed in place): validation names shard and check and moves the
    file aside; the rerun recomputes those shards only, to the same bytes."""
    res, args = ref["res"], ["--configfile", str(ref["config"])]
    intact = res / "extract/shard003.safetensors"
    intact_mtime = intact.stat().st_mtime_ns
    for shard, (how, _, _) in DAMAGE.items():
        damage(res / f"extract/{shard}.safetensors", how)
    fail = snakemake("dataset", *args, check=False)
    assert fail.returncode != 0
    for shard, (how, check, detail) in DAMAGE.items():
        log = (res / f"logs/validate/{shard}.log").read_text()
        assert f"shard {shard}: {check}" in log and all(d in log for d in detail), (how, log[-1500:])
        assert "rerun snakemake to recompute only this shard" in log
        assert not (res / f"extract/{shard}.safetensors").exists()
    assert len(list((res / "extract/quarantine").iterdir())) == 2 * len(DAMAGE)
    counts = job_counts(snakemake("dataset", "-n", *args).stdout)
    assert counts.get("extract") == len(DAMAGE) and counts.get("validate") == len(DAMAGE)
    snakemake("dataset", *args)
    assert outputs(res) == ref["digests"]
    assert intact.stat().st_mtime_ns == intact_mtime


def extract_cmd(setup: dict, shard: str, storage: str = "bf16") -> list[str]:
    """The extraction job's own command line, run outside Snakemake."""
    res, cfg = setup["res"], setup["cfg"]
    return [
        sys.executable,
        "-m",
        "draftsmith.steps.extract",
        "--target",
        setup["target"],
        "--shard",
        str(res / f"shards/{shard}.parquet"),
        "--probe",
        str(res / "probe.json"),
        "--target-json",
        json.dumps(cfg["target"]),
        "--data-json",
        json.dumps({"max_length": 128}),
        "--taps-json",
        json.dumps({"layers": "auto", "count": 5}),
        "--extract-json",
        json.dumps({"storage": storage}),
        "--out",
        str(res / f"extract/{shard}.safetensors"),
        "--manifest",
        str(res / f"extract/{shard}.json"),
    ]


def test_full_disk_stops_the_job_before_the_model_loads(ref, tmp_path):
    """4. The estimated bytes (tokens x taps x hidden x dtype) against the free space: too little stops the job
    with both numbers before the GPU pool or the model is touched."""
    out = tmp_path / "shard.safetensors"
    cmd = extract_cmd(ref, "shard003")
    cmd[cmd.index("--out") + 1], cmd[cmd.index("--manifest") + 1] = str(out), str(tmp_path / "shard.json")
    env = dict(os.environ, PYTHONPATH=str(REPO), DRAFTSMITH_FREE_BYTES="1000")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    log = proc.stderr
    assert "not enough disk space" in log and "has 1000 bytes" in log and " taps x " in log, log[-1500:]
    need = int(log.split("it needs ")[1].split(" bytes")[0])
    size = (ref["res"] / "extract/shard003.safetensors").stat().st_size
    assert size - 1024 < need <= size  # the estimate is the file's size, less its small header
    assert "took GPU" not in log and "token budget" not in log  # stopped before the pool and the model
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


def test_out_of_memory_retries_with_half_the_token_budget(ref):
    """3. Out of memory (the allocator's error, raised inside the batch loop for batches over 300 tokens): the
    rule's Snakemake retry halves the token budget (512 -> 256) and the job succeeds."""
    res, args = ref["res"], ["--configfile", str(ref["config"])]
    (res / "extract/shard003.safetensors").unlink()
    oom = snakemake("dataset", *args, env={"DRAFTSMITH_OOM_TOKENS": "300"})
    assert (oom.stdout + oom.stderr).count("Trying to restart job") == 1
    log = (res / "logs/extract/shard003.log").read_text()  # the log of the successful attempt
    assert "token budget 256" in log and "extracted" in log
    assert json.loads((res / "validate/shard003.json").read_text())["ok"]
    assert json.loads((res / "merged/manifest.json").read_text())["num_shards"] == len(SHARDS)


def test_shards_of_another_config_are_refused_at_merge(ref):
    """8. A shard made with another config (fp8 storage) dropped into the results folder passes its own
    validation, but merge refuses to mix it in and names it."""
    res, args = ref["res"], ["--configfile", str(ref["config"])]
    subprocess.run(
        extract_cmd(ref, "shard003", storage="fp8"),
        check=True,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    proc = snakemake("dataset", *args, check=False)
    assert proc.returncode != 0
    assert json.loads((res / "validate/shard003.json").read_text())["ok"]
    log = (res / "logs/merge.log").read_text()
    assert "shard003.json: made with a different config_hash, storage" in log, log[-1500:]
    assert "delete the stale shards" in log
    assert not (res / "merged/manifest.json").exists()


# ------------------------------------------------------------------------------------------- bad config (7)


def bad_config(setup, tmp_path, **sections) -> list[str]:
    cfg = yaml.safe_load(setup["config"].read_text())
    for key, value in sections.items():
        cfg[key] = value if not isinstance(value, dict) else {**cfg.get(key, {}), **value}
    cfg["results"] = str(tmp_path / "results")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    return ["--configfile", str(tmp_path / "c.yaml")]


@pytest.mark.parametrize(
    "sections, message",
    [
        ({"extract": {"shard": 3}}, "'shard' was unexpected"),
        ({"data": {"max_length": "long"}}, "'long' is not of type 'integer'"),
        ({"taps": {"layers": [1, 40]}}, "taps.layers: [40] out of range"),
        ({"target": {"model": "/nonexistent/model"}}, "target.model: '/nonexistent/model' does not exist"),
        (
            {"target": {"mask_token_id": 151669, "expect": {"num_hidden_layers": 36, "hidden_size": 4096}}},
            "target.expect.num_hidden_layers: the preset is for a model with num_hidden_layers = 36",
        ),
    ],
    ids=["unknown-key", "wrong-type", "tap-out-of-range", "missing-model", "preset-for-another-model"],
)
def test_bad_config_stops_before_any_job_naming_the_key(setup, tmp_path, sections, message):
    """7. Schema errors (unknown key, wrong type) and preflight errors (values wrong for this target) stop the run
    at parse time, before any job, with the key named."""
    proc = snakemake("dataset", "-n", *bad_config(setup, tmp_path, **sections), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and message in out, out[-2000:]
    if "expect" in str(
        sections
    ):  # every problem at once: the preset's mask token is another vocabulary's too
        assert "target.mask_token_id: 151669 is outside the vocabulary" in out
    assert not (tmp_path / "results").exists()


def test_mask_token_that_the_data_uses_stops_before_extraction(setup, tmp_path, tokenizer):
    """7. A mask token id that real text produces is refused once the data is tokenized, naming the key."""
    used = tokenizer.convert_tokens_to_ids("e")
    args = bad_config(setup, tmp_path, target={"mask_token_id": used})
    proc = snakemake("mask_check", *args, check=False)
    assert proc.returncode != 0
    log = (tmp_path / "results/logs/mask_check.log").read_text()
    assert f"mask token {used} ('e', target.mask_token_id (the preset's)) is a token the data uses" in log
    assert "Traceback" not in log


# --------------------------------------------------------------------------------------------- bad data (6)
# Each kind of bad record and long or empty data, by prepare itself: tests/unit/test_data.py.


def test_prepare_cli_skips_and_counts_or_stops_without_traceback(setup, tmp_path):
    """6. The prepare job itself: with on_bad_record: skip every bad kind (non-UTF-8 bytes included) is counted in
    the log; with error, non-UTF-8 bytes give file, line and byte, never a traceback from inside a library."""
    target = setup["target"]
    path = tmp_path / "dirty.jsonl"
    path.write_bytes(
        (GOOD + "\n" + "\n".join(line for line, _ in BAD.values()) + "\n").encode()
        + b'{"prompt": "caf\xe9", "response": "x"}\n'
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def run(on_bad_record: str) -> subprocess.CompletedProcess:
        cfg = {"max_length": 128, "thinking": False, "on_bad_record": on_bad_record}
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "draftsmith.steps.prepare",
                "--target",
                target,
                "--data",
                str(path),
                "--data-json",
                json.dumps(cfg),
                "--out",
                str(tmp_path / "s.parquet"),
                "--stats",
                str(tmp_path / "stats.json"),
            ],
            env=env,
            capture_output=True,
            text=True,
        )

    skip = run("skip")
    assert skip.returncode == 0, skip.stderr[-2000:]
    assert f"skipped {len(BAD) + 1} of {len(BAD) + 2} records" in skip.stderr
    for problem in ("invalid JSON: 1", "not UTF-8: 1", "duplicate id", "no assistant turn to train on: 1"):
        assert problem in skip.stderr, skip.stderr[-2000:]
    assert json.loads((tmp_path / "stats.json").read_text())["skipped"] == len(BAD) + 1

    path.write_bytes(GOOD.encode() + b"\n" + b'{"prompt": "caf\xe9", "response": "x"}\n')
    stop = run("error")
    assert stop.returncode != 0 and "Traceback" not in stop.stderr
    assert f"{path}:2: not UTF-8 (byte 0xe9 at column 16)" in stop.stderr


# ----------------------------------------------------------------------------------------- bench resume (5)


def test_killed_benchmark_resumes_without_redoing_finished_prompts(setup, tmp_path):
    """5. A benchmark SIGKILLed after its first prompt: the rerun keeps that prompt's records as they were and
    benchmarks only the rest."""
    import torch

    from draftsmith.drafter.config import DrafterConfig
    from draftsmith.drafter.model import Drafter
    from draftsmith.drafter.zlab import save_zlab

    target = setup["target"]
    tcfg = json.loads((Path(target) / "config.json").read_text())
    torch.manual_seed(0)
    cfg = DrafterConfig(
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=64,
        vocab_size=tcfg["vocab_size"],
        target_layer_ids=[1, 3],
        num_target_layers=8,
        mask_token_id=tcfg["vocab_size"] - 1,
        block_size=4,
    )
    save_zlab(Drafter(cfg), tmp_path / "drafter")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": t}) + "\n"
            for i, t in enumerate(["def main():", "import os\n", "class A:"])
        )
    )
    out = tmp_path / "part.jsonl"
    flag = tmp_path / "pause"
    bench = {"max_new_tokens": 8, "methods": ["ar", "dflash"], "warmup": 0}
    cmd = [
        sys.executable,
        "-m",
        "draftsmith.steps.bench",
        "--target",
        target,
        "--drafter",
        str(tmp_path / "drafter"),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--bench-json",
        json.dumps(bench),
        "--gpus",
        "0",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        cmd,
        env=env | {"DRAFTSMITH_PAUSE_AT": "bench:1", "DRAFTSMITH_PAUSE_FILE": str(flag)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(flag, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        flag.unlink(missing_ok=True)
    assert not out.exists()
    partial = [json.loads(x) for x in out.with_name(out.name + ".partial").read_text().splitlines()]
    assert len(partial) == 2 and partial[1]["index"] == 0  # the key line, then the first prompt
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "resuming: 1 of 3 prompts already done" in rerun.stderr
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert records[:2] == partial[1]["records"]  # kept, timings included: not redone
    assert not out.with_name(out.name + ".partial").exists()


def test_a_bad_bench_prompt_file_stops_the_run_before_any_job(setup, tmp_path):
    """7. A raw file of another shape, or a bad line, used to fail at bench time after training (a bare
    KeyError), or be dropped silently. Now `snakemake -n` names FILE:LINE."""
    prompts = tmp_path / "gsm8k.jsonl"
    prompts.write_text('{"question": "2 + 2?", "answer": "4"}\n{"text": "neither"}\n')
    args = bad_config(setup, tmp_path, bench={"datasets": [{"name": "gsm8k", "path": str(prompts)}]})
    proc = snakemake("all", "-n", *args, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"bench.datasets[gsm8k].path: {prompts}:2: no prompt field" in out, out[
        -2000:
    ]
    assert not (tmp_path / "results").exists()
    prompts.write_text('{"question": "2 + 2?", "answer": "4"}\n{"turns": ["hello", "again"]}\n')
    assert "bench" in job_counts(snakemake("all", "-n", *args).stdout)
