"""Training in rounds under a disk budget, through the Snakemake CLI: three rounds over two epochs on a tiny real
target, with a damaged shard in the second round and a training job killed mid-round, the states on disk
measured while it runs, and what reruns when keys change."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import NOLOCK, REPO, digest, job_counts, make_workflow, snakemake

from draftsmith.plan.rounds import round_order, round_orders

BUDGET = 260_000  # bytes: three rounds of the 24 records' states (about 500 KB in bf16)
RECORDS = 24
UPSTREAM = {"prepare", "shard", "probe", "mask_check", "regenerate", "extract_heldout", "validate_heldout"}


def states_bytes(res: Path) -> int:
    """Hidden-state bytes on disk now: every shard file of the rounds (held-out ones included), as allocated."""
    total = 0
    for p in (res / "rounds").rglob("*.safetensors*"):
        try:
            total += p.stat().st_blocks * 512
        except FileNotFoundError:  # deleted between the listing and the stat
            pass
    return total


class Peak:
    """Samples the states on disk every few milliseconds while a run goes on."""

    def __init__(self, res: Path):
        self.res, self.peak, self._stop = res, 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, states_bytes(self.res))
            time.sleep(0.005)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, (
            f"the run ended before it reached {path.name}: {proc.communicate()[0][-3000:]}"
        )
        assert time.monotonic() < deadline, f"no {path.name} after {timeout}s"
        time.sleep(0.05)


# What the main run made ahead of the rounds, none of which a change to the rounds' own keys (reuse, the answering
# jobs, the disk budget) makes differently: copied with their times, a test's run starts from them, as a rerun of
# the main run's folder would, instead of preparing, answering and extracting the held-out states again.
AHEAD_OF_THE_ROUNDS = ("prepared", "shards", "probe.json", "rates.json", "answers", "rounds/heldout")


def copy_ahead_of_the_rounds(res: Path, to: Path, names: tuple[str, ...] = AHEAD_OF_THE_ROUNDS) -> None:
    for name in names:
        (to / name).parent.mkdir(parents=True, exist_ok=True)
        if (res / name).is_dir():
            shutil.copytree(res / name, to / name)
        else:
            shutil.copy2(res / name, to / name)


def short_prompts(root: Path) -> dict:
    """The data section of a run on RECORDS short prompts, whose every sample reaches max_length, estimated
    or measured."""
    data = root / "short.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": f"def f{i}(x):"}) + "\n" for i in range(RECORDS))
    )
    regen = {"enabled": True, "max_new_tokens": 64, "checks": {"enabled": False}}
    return {"path": str(data), "max_length": 64, "regenerate": regen}


@pytest.fixture(scope="module")
def rounds_run(tmp_path_factory, tokenizer) -> dict:
    """Three runs of one workflow in three rounds over two epochs: the first meets a damaged shard in epoch 0's
    second round and stops at its validation; the second is held in the middle of epoch 1's second round and its
    training job SIGKILLed; the third, plain `snakemake`, finishes. The states on disk are sampled all along."""
    root = tmp_path_factory.mktemp("rounds")
    config = make_workflow(
        root,
        tokenizer,
        extract={"shards": 2, "validate_samples": 1, "disk_budget": BUDGET},
        data=short_prompts(root),
        drafter={"num_layers": 1, "block_size": 4},
        train={"epochs": 2, "anchors_per_seq": 8, "token_budget": 512},
        plan={"rates": "node"},
        bench={
            "datasets": [{"name": "tiny", "path": str(root / "prompts.jsonl")}],
            "max_new_tokens": 8,
            "ddtree_budgets": [4],
            "fp32_check_prompts": 0,
            "parts": 1,
        },
    )
    res, cfg = root / "results", ["--configfile", str(config)]
    seen: dict = {"dry": snakemake("-n", *cfg).stdout}
    second = round_order(3, 0, 0)[1]
    flag = root / "pause"
    env = {"DRAFTSMITH_DAMAGE_AT": f"shard001.r{second}.safetensors", "DRAFTSMITH_PAUSE_FILE": str(flag)}
    peak = Peak(res)
    seen["damaged"] = snakemake(*cfg, check=False, env=env)
    seen["damage_log"] = (res / f"logs/rounds/e0/validate/shard001.r{second}.log").read_text()
    seen["quarantined"] = sorted(p.name for p in (res / "rounds/e0/quarantine").iterdir())
    seen["after_damage"] = {p.name: p.stat().st_mtime_ns for p in (res / "rounds/e0").glob("*.valid.json")}
    run_env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        DRAFTSMITH_PAUSE_AT="train_round:e1p1",
        DRAFTSMITH_PAUSE_FILE=str(flag),
    )
    killed = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2", NOLOCK, *cfg],
        cwd=REPO,
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(flag, killed)
        seen["records_before_kill"] = {
            p: p.stat().st_mtime_ns for p in (res / "rounds").glob("e*/p*/record.json")
        }
        os.kill(int(flag.read_text()), signal.SIGKILL)
        seen["killed_out"] = killed.communicate(timeout=300)[0]
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    seen["killed_rc"] = killed.returncode
    seen["resumed"] = snakemake(*cfg, check=False)
    seen["peak"] = peak.stop()
    seen["records"] = {p: p.stat().st_mtime_ns for p in (res / "rounds").glob("e*/p*/record.json")}
    return {"root": root, "res": res, "config": config, "seen": seen, "second": second}


def test_dry_run_lists_the_rounds(rounds_run):
    counts = job_counts(rounds_run["seen"]["dry"])
    assert counts["train_round"] == 6 and counts["merge_round"] == 6, counts  # 3 rounds x 2 epochs
    assert counts["extract_round"] == 12 and counts["regenerate"] == 2, (
        counts
    )  # 2 shards a round; answers once
    assert counts["extract_heldout"] == 2 and counts["train"] == 1, counts


def test_a_damaged_shard_in_the_second_round_reruns_alone(rounds_run):
    """Validation names the damaged shard and moves it aside; the next run extracts it alone again (the other
    shard of that round was validated once), and training goes on."""
    seen, res, second = rounds_run["seen"], rounds_run["res"], rounds_run["second"]
    assert seen["damaged"].returncode != 0
    log = seen["damage_log"]
    assert f"shard shard001.r{second}" in log and "check failed" in log and "deleted its states" in log
    assert [q.split(".json")[0] for q in seen["quarantined"]] == [f"shard001.r{second}"]  # the manifest only
    other = f"shard000.r{second}.valid.json"
    assert other in seen["after_damage"] and f"shard001.r{second}.valid.json" not in seen["after_damage"]
    assert (res / f"rounds/e0/{other}").stat().st_mtime_ns == seen["after_damage"][other]
    assert (res / f"rounds/e0/shard001.r{second}.valid.json").exists()


def test_a_kill_mid_round_redoes_only_that_round(rounds_run):
    """The job killed in the middle of epoch 1's second round: the next plain `snakemake` trains that round
    again from the state before it, and no finished round trains again."""
    seen = rounds_run["seen"]
    assert seen["killed_rc"] != 0
    assert seen["resumed"].returncode == 0, seen["resumed"].stdout[-3000:] + seen["resumed"].stderr[-3000:]
    counts = job_counts(seen["resumed"].stdout + seen["resumed"].stderr)
    assert counts.get("train_round") == 2, counts  # e1p1 again, then e1p2
    assert counts.get("extract_round", 0) == 2, counts  # only e1p2's round: e1p1's states were still there
    for path, mtime in seen["records_before_kill"].items():
        assert seen["records"][path] == mtime, f"{path} was trained again"
    assert (rounds_run["res"] / "train/summary.json").exists()


def test_states_on_disk_stay_under_the_budget(rounds_run):
    seen, res = rounds_run["seen"], rounds_run["res"]
    assert 0 < seen["peak"] <= BUDGET, seen["peak"]
    print(f"states on disk at most {seen['peak']} bytes under a budget of {BUDGET}")
    plan = json.loads((res / "plan.json").read_text())
    assert plan["rounds"] == 3 and plan["budget_bytes"] == BUDGET
    assert max(plan["round_bytes"]) + plan["heldout_bytes"] <= BUDGET
    assert states_bytes(res) == sum(
        p.stat().st_blocks * 512 for p in (res / "rounds/heldout").glob("*.safetensors")
    )


def test_every_epoch_visits_every_training_sample_once(rounds_run):
    """From the training's own records: each epoch's rounds together hold every training sample exactly once,
    in a different round order each epoch, and never a held-out sample."""
    res = rounds_run["res"]
    records = [json.loads(p.read_text()) for p in sorted((res / "rounds").glob("e*/p*/record.json"))]
    held = set(json.loads((res / "rounds/heldout/manifest.json").read_text())["shards"][0]["sample_ids"])
    held |= set(json.loads((res / "rounds/heldout/manifest.json").read_text())["shards"][1]["sample_ids"])
    everyone = {f"r{i}" for i in range(RECORDS)}
    orders = []
    for epoch in (0, 1):
        ids = [i for r in records if r["epoch"] == epoch for i in r["sample_ids"]]
        assert len(ids) == len(set(ids)) and set(ids) == everyone - held, (epoch, sorted(ids))
        orders.append(
            [r["round"] for r in sorted(records, key=lambda r: r["position"]) if r["epoch"] == epoch]
        )
    assert held and orders[0] != orders[1]
    steps = [
        (r["first_step"], r["steps"]) for r in sorted(records, key=lambda r: (r["epoch"], r["position"]))
    ]
    assert all(a + n == b for (a, n), (b, _) in zip(steps, steps[1:]))  # one schedule across the rounds
    summary = json.loads((res / "train/summary.json").read_text())
    assert summary["steps"] == steps[-1][0] + steps[-1][1] and summary["rounds"] == 3
    assert summary["heldout_samples"] == len(held)


def test_reusing_the_last_round_extracts_and_starts_a_round_less_an_epoch_under_the_budget(
    rounds_run, tmp_path
):
    """extract.reuse_last_round: epoch 1 begins with the round epoch 0 ended with, on epoch 0's extraction of
    it (deleted once trained on), and one job (the epoch's turn) trains both positions; every epoch still
    visits every training sample once, and the states on disk stay under the budget."""
    cfg = yaml.safe_load(rounds_run["config"].read_text())
    res = tmp_path / "results"
    cfg["results"] = str(res)
    cfg["extract"]["reuse_last_round"] = True
    (tmp_path / "reuse.yaml").write_text(yaml.safe_dump(cfg))
    args = ["--configfile", str(tmp_path / "reuse.yaml")]
    copy_ahead_of_the_rounds(rounds_run["res"], res)  # no preparing, decoding or held-out extraction again
    dry = snakemake("-n", *args)
    counts = job_counts(dry.stdout)
    assert counts["extract_round"] == 2 * 5 and counts["merge_round"] == 5, counts  # not 6 rounds' worth
    assert counts["train_round"] == 4 and counts["train_turn"] == 1, counts  # 6 positions in 5 jobs
    assert "| rounds | 3 | 1.67 extraction pass(es) over 2 epochs" in dry.stdout + dry.stderr
    peak = Peak(res)
    snakemake(f"{res}/train/summary.json", *args)
    top = peak.stop()
    assert 0 < top <= BUDGET, top
    records = {
        (r["epoch"], r["position"]): r
        for r in (json.loads(p.read_text()) for p in (res / "rounds").rglob("record.json"))
    }
    orders = [[records[(e, p)]["round"] for p in range(3)] for e in (0, 1)]
    assert orders == round_orders(3, 2, 0, reuse_last=True) and orders[1][0] == orders[0][-1], orders
    assert records[(1, 0)]["sample_ids"] != records[(0, 2)]["sample_ids"]  # reshuffled for its epoch
    assert set(records[(1, 0)]["sample_ids"]) == set(records[(0, 2)]["sample_ids"])
    assert records[(1, 0)]["first_step"] == records[(0, 2)]["first_step"] + records[(0, 2)]["steps"]
    heldout = json.loads((res / "rounds/heldout/manifest.json").read_text())["shards"]
    trained = {f"r{i}" for i in range(RECORDS)} - {i for s in heldout for i in s["sample_ids"]}
    for epoch in (0, 1):
        ids = [i for (e, _), r in sorted(records.items()) if e == epoch for i in r["sample_ids"]]
        assert len(ids) == len(set(ids)) and set(ids) == trained, (epoch, sorted(ids))
    first = orders[1][0]
    assert (res / f"logs/rounds/e0/extract/shard000.r{first}.log").exists()
    assert not (res / f"logs/rounds/e1/extract/shard000.r{first}.log").exists()
    assert not list(res.glob("rounds/e*/*.safetensors")) and not list(res.rglob("state.pt"))  # all deleted
    summary = json.loads((res / "train/summary.json").read_text())
    assert summary["steps"] == sum(r["steps"] for r in records.values()) and summary["epochs"] == 2


def _changed(rounds_run, name: str, **sections) -> list[str]:
    cfg = yaml.safe_load(rounds_run["config"].read_text())
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    path = rounds_run["root"] / name
    path.write_text(yaml.safe_dump(cfg))
    return ["--configfile", str(path)]


def test_a_train_key_change_reruns_nothing_upstream_of_extraction(rounds_run):
    out = snakemake("-n", *_changed(rounds_run, "lr.yaml", train={"lr": 1e-3})).stdout
    counts = job_counts(out)
    assert counts.get("train_round") == 6 and counts.get("extract_round") == 12, out[-3000:]  # from round 1
    assert not UPSTREAM & set(counts), counts


def test_a_changed_budget_keeps_or_replans_the_rounds(rounds_run):
    """A budget that still holds the same rounds reruns nothing but the plan; one that needs more rounds
    restarts training, and keeps the answers and the held-out states."""
    same = job_counts(
        snakemake("-n", *_changed(rounds_run, "same.yaml", extract={"disk_budget": "250KB"})).stdout
    )
    assert set(same) <= {"plan", "plan_check", "all"}, same
    more = snakemake("-n", *_changed(rounds_run, "more.yaml", extract={"disk_budget": "200KB"}))
    counts = job_counts(more.stdout)
    assert counts["train_round"] > 6 and not UPSTREAM & set(counts), counts


def test_answers_carried_to_a_fresh_machine_are_not_decoded_again(rounds_run, tmp_path):
    """Issue 37's staging across sessions (scripts/gpu_suite.sh, STUDY_ANSWERS): a later machine gets only the
    answer cache; its regeneration jobs find their answers there and decode nothing."""
    cfg = yaml.safe_load(rounds_run["config"].read_text())
    res = tmp_path / "results"
    cfg["results"] = str(res)
    (tmp_path / "fresh.yaml").write_text(yaml.safe_dump(cfg))
    shutil.copytree(rounds_run["res"] / "answers/cache", res / "answers/cache")
    snakemake("--configfile", str(tmp_path / "fresh.yaml"), "--until", "regenerate")
    for shard in ("shard000", "shard001"):
        log = (res / f"logs/regenerate/{shard}.log").read_text()
        assert "reusing" in log and "regenerated" not in log, log[-2000:]
        answers = res / f"answers/{shard}.parquet"
        assert digest(answers) == digest(rounds_run["res"] / f"answers/{shard}.parquet")


def test_answers_made_in_rounds_are_not_decoded_again_in_one_round(rounds_run, tmp_path):
    """A budget that now holds every state (one round, where extraction answers the prompts itself) finds the
    answers the regeneration jobs made in rounds: changing the disk budget decodes nothing again."""
    cfg = yaml.safe_load(rounds_run["config"].read_text())
    res = tmp_path / "results"
    cfg["results"] = str(res)
    cfg["extract"]["disk_budget"] = "1TB"
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(cfg))
    shutil.copytree(rounds_run["res"] / "answers/cache", res / "answers/cache")
    copy_ahead_of_the_rounds(rounds_run["res"], res, ("prepared", "shards", "probe.json"))
    assert "extract_round" not in job_counts(snakemake("-n", "--configfile", str(tmp_path / "one.yaml")).stdout)
    snakemake("--configfile", str(tmp_path / "one.yaml"), "--until", "extract")
    for shard in ("shard000", "shard001"):
        log = (res / f"logs/extract/{shard}.log").read_text()
        assert "reusing" in log and "regenerated" not in log, log[-2000:]
        made = pd.read_parquet(rounds_run["res"] / f"answers/{shard}.parquet")
        got = pd.read_parquet(res / f"extract/regen/{shard}.parquet")
        assert got["id"].tolist() == made["id"].tolist()
        assert all(np.array_equal(a, b) for a, b in zip(got["input_ids"], made["input_ids"]))


def test_several_jobs_answer_a_shard_and_join_its_answers_in_order(rounds_run, tmp_path):
    """data.regenerate.jobs_per_shard: with fewer shards than slots each shard's prompts are answered by
    several jobs, every jobs-th sample each, and a join gives the rounds the shard's answers as one job would."""
    cfg = yaml.safe_load(rounds_run["config"].read_text())
    res = tmp_path / "results"
    cfg["results"] = str(res)
    cfg["data"]["regenerate"]["jobs_per_shard"] = 2
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump(cfg))
    args = ["--configfile", str(tmp_path / "jobs.yaml")]
    copy_ahead_of_the_rounds(rounds_run["res"], res, ("prepared", "shards", "probe.json"))  # not the answers
    counts = job_counts(snakemake("-n", *args).stdout)
    assert counts["regenerate"] == 4 and counts["join_answers"] == 2, counts
    snakemake(*args, "--until", "join_answers")
    for shard in ("shard000", "shard001"):
        prepared = pd.read_parquet(res / f"shards/{shard}.parquet")
        answers = pd.read_parquet(res / f"answers/{shard}.parquet")
        assert answers["id"].tolist() == prepared["id"].tolist()
        for ids, pl, before in zip(answers["input_ids"], answers["prompt_len"], prepared["input_ids"]):
            assert list(ids[:pl]) == list(before[:pl])  # each sample's own prompt, answered after it
        parts = [pd.read_parquet(res / f"answers/{shard}.j{j}.parquet") for j in (0, 1)]
        assert [p["id"].tolist() for p in parts] == [prepared["id"].tolist()[j::2] for j in (0, 1)]
        stamp = json.loads((res / f"answers/{shard}.json").read_text())
        assert stamp["judged"]["answers"] == len(prepared) and len(stamp["jobs"]) == 2


def test_the_answering_jobs_setting_reaches_no_jobs_data_settings(rounds_run):
    """jobs_per_shard names each answering job's rows in its command: written out at the value it already
    has, it reruns nothing but the plan (in a job's data settings, its default alone would rerun every job)."""
    regen = {**yaml.safe_load(rounds_run["config"].read_text())["data"]["regenerate"], "jobs_per_shard": 1}
    counts = job_counts(
        snakemake("-n", *_changed(rounds_run, "jobs1.yaml", data={"regenerate": regen})).stdout
    )
    assert set(counts) <= {"plan", "plan_check", "all"}, counts


def test_a_budget_below_one_round_stops_at_plan_time(rounds_run):
    proc = snakemake("-n", *_changed(rounds_run, "tiny.yaml", extract={"disk_budget": "20KB"}), check=False)
    assert proc.returncode != 0
    msg = proc.stdout + proc.stderr
    assert "extract.disk_budget" in msg and "fp8" in msg and "smallest round" in msg, msg[-2000:]


def test_rounds_in_flight_gate_extraction_two_places_back(rounds_run):
    """extract.rounds_in_flight: 2 plans more, smaller rounds, and each round's extraction waits only for the
    training two places before it in the run's order (the first two rounds wait for none)."""
    out = snakemake("-n", *_changed(rounds_run, "flight.yaml", extract={"rounds_in_flight": 2})).stdout
    rounds = json.loads((rounds_run["res"] / "plan/rounds.json").read_text())["rounds"]
    assert rounds > 3, rounds
    order = [round_order(rounds, e, 0) for e in (0, 1)]
    sequence = [(e, r) for e in (0, 1) for r in order[e]]
    gates = {}
    for block in out.split("\nrule ")[1:]:
        if not block.startswith("extract_round:"):
            continue
        wild = dict(kv.split("=") for kv in re.search(r"wildcards: (.*)", block)[1].split(", "))
        gate = re.search(r"rounds/e(\d+)/p(\d+)/record\.json", re.search(r"input: (.*)", block)[1])
        gates[(int(wild["epoch"]), int(wild["round"]))] = gate and (int(gate[1]), int(gate[2]))
    assert len(gates) == 2 * rounds, sorted(gates)
    for i, (epoch, rid) in enumerate(sequence):
        before = None if i < 2 else divmod(i - 2, rounds)
        assert gates[(epoch, rid)] == before, (epoch, rid, gates[(epoch, rid)], before)


def test_with_reuse_the_rounds_in_flight_count_extractions_not_positions(rounds_run):
    """extract.reuse_last_round with rounds_in_flight: 2: each extraction waits for the training of the round
    extracted two extractions before it (a turn's record when that round was reused), so a reused round,
    extracted once, takes one place in flight, not two, and the rounds after a turn keep their lead."""
    over = _changed(
        rounds_run, "flight_reuse.yaml", extract={"rounds_in_flight": 2, "reuse_last_round": True}
    )
    out = snakemake("-n", *over).stdout
    rounds = json.loads((rounds_run["res"] / "plan/rounds.json").read_text())["rounds"]
    orders = round_orders(rounds, 2, 0, reuse_last=True)
    extracted = [(0, r) for r in orders[0]] + [(1, r) for r in orders[1][1:]]
    record = {(0, r): f"e0/p{p}/record.json" for p, r in enumerate(orders[0])}
    record[(0, orders[0][-1])] = "e0/turn/record.json"  # epoch 0's last position trains in the turn
    record.update({(1, r): f"e1/p{p}/record.json" for p, r in enumerate(orders[1]) if p})
    gates = {}
    for block in out.split("\nrule ")[1:]:
        if block.startswith("extract_round:"):
            wild = dict(kv.split("=") for kv in re.search(r"wildcards: (.*)", block)[1].split(", "))
            gate = re.search(r"rounds/(e\d+/(?:p\d+|turn)/record\.json)", re.search(r"input: (.*)", block)[1])
            gates[(int(wild["epoch"]), int(wild["round"]))] = gate and gate[1]
    assert sorted(gates) == sorted(extracted), (sorted(gates), extracted)
    for i, key in enumerate(extracted):
        assert gates[key] == (record[extracted[i - 2]] if i >= 2 else None), (key, gates[key])


def test_the_plan_is_timed_on_this_node_and_checked_against_the_run(rounds_run):
    """The rates job timed this machine; the plan's GPU-hours come from it, and the plan's check reads every
    GPU job's benchmark file, stage by stage."""
    res = rounds_run["res"]
    timed = json.loads((res / "rates.json").read_text())["rates"]
    for key in (
        "extract_tokens_s",
        "regenerate_new_tokens_s",
        "bench_tokens_s",
        "load_s",
        "start_s",
        "train_start_s",
    ):
        assert timed[key] > 0, (key, timed)
    assert 0 < timed["train_end_s"] < 60, timed  # a training job's exit, timed after its result
    assert timed["train_s_per_sample"] + timed["train_s_per_step"] > 0, timed
    plan = json.loads((res / "plan.json").read_text())
    assert all("timed on this node" in s["source"] for s in plan["stages"].values()), plan["stages"]
    assert plan["stages"]["extract, all passes"]["fixed_hours"] > 0  # 14 extraction and 14 validation jobs
    rows = {r["stage"]: r for r in json.loads((res / "plan/measured.json").read_text())["rows"]}
    assert set(rows) == {"regeneration", "extraction", "training", "bench"}, rows
    assert rows["extraction"]["jobs"] == 2 * (3 * 2 * 2 + 2) and rows["training"]["jobs"] == 7, rows
    assert all(
        r["gpu_hours"] > 0 and r["planned"] > 0 and r["measured_over_planned"] > 0 for r in rows.values()
    )


def test_a_study_size_trains_its_own_rounds_on_the_states_the_main_run_extracts(tmp_path, tokenizer):
    """A study in rounds: the size trains a chain of rounds of its own, beside the main run's, on its seeded
    share of each round's states; each epoch visits that share exactly once, and a round's states wait for
    both trainings before they are deleted."""
    size = 7
    config = make_workflow(
        tmp_path,
        tokenizer,
        extract={"shards": 1, "validate_samples": 1, "disk_budget": 400_000},
        data=short_prompts(tmp_path),
        drafter={"num_layers": 1, "block_size": 4},
        train={"epochs": 1, "anchors_per_seq": 8, "token_budget": 512},
        study={"train_samples": [size]},
    )
    res, cfg = tmp_path / "results", ["--configfile", str(config)]
    dry = job_counts(snakemake("-n", *cfg).stdout)
    assert dry["train_round"] == dry["study_train_round"] == 2 and dry["extract_round"] == 2, dry
    snakemake(f"{res}/study/n{size}/train/summary.json", *cfg)
    records = [
        json.loads(p.read_text()) for p in sorted((res / f"study/n{size}/rounds").glob("e0/p*/record.json"))
    ]
    mine = [i for r in records for i in r["sample_ids"]]
    manifests = [json.loads(p.read_text()) for p in (res / "rounds/e0").glob("r*/manifest.json")]
    everyone = {i for m in manifests for s in m["shards"] for i in s["sample_ids"]}  # the training samples
    assert len(mine) == size == len(set(mine)) and set(mine) < everyone, (mine, sorted(everyone))
    assert [r["round"] for r in records] == round_order(2, 0, 0)  # the main run's order of the rounds
    assert not list(res.glob("rounds/e0/*.safetensors")) and not list(res.glob("study/**/state.pt"))
    summary = json.loads((res / f"study/n{size}/train/summary.json").read_text())
    assert summary["steps"] == records[-1]["first_step"] + records[-1]["steps"]
