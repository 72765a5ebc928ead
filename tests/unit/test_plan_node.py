"""The plan against this node: the rates job's timings (its processes, its copies' sums) priced into
GPU-hours, and the probe's GPUs, card memory and disk write rate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.plan.cli import load_config
from draftsmith.plan.hours import bench_decodes, bench_runs

REPO = Path(__file__).resolve().parents[2]

_RATES = {"start_s": 5.0, "load_s": 55.0, "extract_tokens_s": 10000.0, "extract_first_batch_s": 20.0,
          "regenerate_new_tokens_s": 2000.0, "answer_tokens_mean": 1024.0, "bench_tokens_s": 30.0,
          "train_s_per_sample": 0.01, "train_s_per_step": 1.0, "train_setup_s": 10.0,
          "train_first_step_s": 60.0}  # fmt: skip


def _plan_27b_on_8(tmp_path: Path, gpu: str) -> tuple[Path, list[str]]:
    """The results folder and the `plan` command of the 27B preset on 1,000 prompts, 8 GPUs named `gpu`."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "word " * 50}) + "\n" for i in range(1000)))
    res = tmp_path / "res"
    res.mkdir()
    over = tmp_path / "over.yaml"
    over.write_text(
        f"results: {res}\ndata: {{path: {data}}}\nbench: {{datasets: [{{name: b, path: {data}}}]}}\n"
    )
    cmd = [sys.executable, "-m", "draftsmith", "plan", "--configfile", "configs/qwen3.6-27b.yaml", str(over)]
    return res, cmd + ["--gpus", "8", "--gpu", gpu, "--free", "8TB", "--json"]


def test_the_plan_prices_the_rates_jobs_figures_or_says_why_not(tmp_path):
    """With RESULTS/rates.json from the rates job the GPU-hours come from it, a cost a job included; a rates
    job that could not time the node leaves the table's rates and a note naming why."""
    res, cmd = _plan_27b_on_8(tmp_path, "NVIDIA H200")
    (res / "rates.json").write_text(json.dumps({"device": "NVIDIA H200", "error": "OutOfMemoryError: 2 GiB"}))
    plan = json.loads(subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout)
    assert any("could not time this node (OutOfMemoryError" in n for n in plan["notes"]), plan["notes"]
    assert "H200: measured" in plan["stages"]["regeneration"]["source"]
    rates = _RATES | {"copies": 1}
    (res / "rates.json").write_text(json.dumps({"device": "NVIDIA H200", "gpus_per_copy": 1, "rates": rates}))
    plan = json.loads(subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout)
    stages = plan["stages"]
    assert all("timed on this node (NVIDIA H200, 1 at once)" in s["source"] for s in stages.values())
    regen = stages["regeneration"]
    jobs = 8 * 4  # one round: the extraction jobs regenerate, each of 8 GPUs x 4 shards pays its start once
    # no answer yet: the hours take the rates job's answers (1,024 tokens), the disk keeps the 2,048 bound
    assert regen["gpu_hours"] == pytest.approx(1000 * 1024 / 2000 / 3600) and regen["fixed_hours"] == 0
    assert "answers 1024 tokens, the rates job's" in regen["source"] and plan["data"]["answer_tokens"] == 2048
    assert plan["tokens"] == pytest.approx(plan["data"]["samples"] * plan["data"]["tokens_bound"])
    assert stages["extract, all passes"]["fixed_hours"] == pytest.approx(2 * jobs * (5 + 55 + 20) / 3600)
    assert stages["train, all epochs"]["fixed_hours"] == pytest.approx(8 * (5 + 10 + 60) / 3600)  # 8 ranks
    # the bench: the target's answers (with the preset's real loops, a loop a run too), and each run's replay
    # of them, a round a token at the drafter's 5 layers of the target's 64 (the rates job's answers of 1,024
    # tokens fill the bench's cap)
    bench, prompts = stages["bench"], int(stages["bench"]["source"].split(" prompts")[0])
    preset = load_config([str(REPO / "configs/qwen3.6-27b.yaml")])["bench"]
    tokens = prompts * preset["max_new_tokens"]
    replayed = tokens * bench_runs(preset) * 5 / 64
    assert "replays included" in bench["source"] and prompts > 0
    assert bench["gpu_hours"] - bench["fixed_hours"] == pytest.approx(
        (tokens * bench_decodes(preset) + replayed) / 30 / 3600
    )


def test_slots_of_one_gpu_share_its_memory_and_its_disk_writes(tmp_path):
    """Eight jobs on one H100 (DRAFTSMITH_GPUS=0 x 8, as the study runs): the card is the probe's 80 GB, not
    the H200's 141 of the table's fallback class, and the disk takes one GPU's states, not eight (on the
    H100 study of 2026-12-05 the plan said 141 GB and warned that the GPUs would idle 90% on the disk)."""
    res, cmd = _plan_27b_on_8(tmp_path, "NVIDIA H100 80GB HBM3")
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "total_gib": 79.6, "free_gib": 79.1, "slots": 8}
    (res / "probe.json").write_text(json.dumps({"gpus": [gpu], "disk_write_gbs": 2.0}))
    rates = _RATES | {"copies": 8}
    (res / "rates.json").write_text(json.dumps({"device": gpu["name"], "gpus_per_copy": 1, "rates": rates}))
    plan = json.loads(subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout)
    assert plan["gpus"] == 8 and plan["devices"] == 1
    assert plan["memory"]["limit_bytes"] == int(79.6 * 2**30) and plan["memory"]["limit_source"] == "the card"
    per_token = plan["bytes_per_token"][plan["storage"]]
    assert plan["disk_rate_needed_gbs"] == pytest.approx(per_token * 10000.0 / 1e9)
    # the wall hours: one GPU's (training's ranks are the slots that train.gpus takes)
    assert all(s["gpus"] == 1 for k, s in plan["stages"].items() if not k.startswith("train")), plan["stages"]
    assert not any("disk" in n for n in plan["notes"]), plan["notes"]  # 2 GB/s keeps up with one GPU's 0.5
    assert plan["gpu_class"] == gpu["name"]  # its own rates, not "(rates of the H200)" as on 2026-12-05


def test_a_slow_disk_is_named_priced_and_fp8_offered_only_where_the_states_are_not_fp8_already(tmp_path):
    res, cmd = _plan_27b_on_8(tmp_path, "NVIDIA H200")
    gpu = {"index": 0, "name": "NVIDIA H200", "total_gib": 139.8, "free_gib": 139.0, "slots": 1}
    rates = _RATES | {"copies": 1}  # with a job's start-up, part of extraction never waits on the disk
    (res / "rates.json").write_text(json.dumps({"device": gpu["name"], "gpus_per_copy": 1, "rates": rates}))
    for storage, offered in (("bf16", True), ("fp8", False)):
        (tmp_path / "storage.yaml").write_text(f"extract: {{storage: {storage}}}\n")
        at = cmd.index("--gpus")  # the overlay after the config files
        argv = cmd[:at] + [str(tmp_path / "storage.yaml")] + cmd[at:]
        plans = {}
        for disk in (100.0, 0.1):  # a disk that keeps up, then one that does not
            (res / "probe.json").write_text(json.dumps({"gpus": [gpu] * 8, "disk_write_gbs": disk}))
            run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True)
            plans[disk] = json.loads(run.stdout)
        fast, plan = plans[100.0], plans[0.1]
        assert not any("disk" in n for n in fast["notes"]), fast["notes"]
        notes = [n for n in plan["notes"] if "the results disk took 0.10 GB/s" in n]
        assert len(notes) == 1 and ("extract.storage: fp8" in notes[0]) == offered, (storage, notes)
        # the time the jobs stream states takes the disk's rate; their start-up does not wait on it
        before, after = fast["stages"]["extract, all passes"], plan["stages"]["extract, all passes"]
        slower = plan["disk_rate_needed_gbs"] / 0.1
        assert slower > 1 and before["fixed_hours"] > 0
        assert after["fixed_hours"] == pytest.approx(before["fixed_hours"])
        streaming = before["gpu_hours"] - before["fixed_hours"]
        assert after["gpu_hours"] == pytest.approx(before["fixed_hours"] + streaming * slower)
        assert f"{streaming * (slower - 1):,.2f} of extraction's {after['gpu_hours']:,.2f}" in notes[0], notes
        assert "0.10 GB/s in the probe" in after["waits_on_disk"] and "waits_on_disk" not in before
        epoch, epoch_before = plan["stages"]["extract per epoch"], fast["stages"]["extract per epoch"]
        epoch_streaming = epoch_before["gpu_hours"] - epoch_before["fixed_hours"]
        assert epoch["gpu_hours"] == pytest.approx(epoch_before["fixed_hours"] + epoch_streaming * slower)


def test_a_timing_process_that_dies_stops_the_others_and_fails_the_job():
    """A copy that dies puts no result, and the copies waiting at a barrier for it would wait for ever."""
    import multiprocessing as mp
    import time

    from draftsmith.steps.rates import _results

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=sys.exit, args=(3,)), ctx.Process(target=time.sleep, args=(600,))]
    for p in procs:
        p.start()
    with pytest.raises(SystemExit, match="a timing process failed \\(exit 3\\)"):
        _results(procs, ctx.Queue(), "a timing process")
    procs[1].join(timeout=10)
    assert not procs[1].is_alive()


def test_copies_timed_at_once_add_their_throughputs_and_average_their_start_up():
    from draftsmith.steps.rates import combine

    copies = [
        {"start_s": 3.0, "load_s": 8.0, "extract_tokens_s": 100.0, "answer_tokens_mean": 150.0},
        {"start_s": 5.0, "load_s": 10.0, "extract_tokens_s": 300.0, "answer_tokens_mean": 170.0},
    ]
    rates = combine(copies, gpus=1)
    assert rates["extract_tokens_s"] == 400.0  # two slots of one GPU: their tokens/s add up
    assert (rates["start_s"], rates["load_s"], rates["answer_tokens_mean"]) == (4.0, 9.0, 160.0)
    assert combine(copies, gpus=2)["extract_tokens_s"] == 200.0 and rates["copies"] == 2
    lengths = [[10, 300, 50], [10, 300, 50]]  # the copies answered the same prompts
    combined = combine([c | {"answer_lengths": n} for c, n in zip(copies, lengths)], gpus=1)
    assert combined["answer_lengths"] == [10, 300, 50]
