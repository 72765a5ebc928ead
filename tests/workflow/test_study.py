"""The data-scaling study through Snakemake: training data and bench prompts named by URL (served over HTTP
from this machine), drafters trained on a subset and on everything, and the study's table and plots."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import job_counts, make_workflow, snakemake


@pytest.fixture
def served(tmp_path):
    """A real HTTP server over a folder, as a data set's host would be."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_study_trains_each_size_on_the_same_data_and_plots_tau_against_tokens(served, tmp_path, tokenizer):
    www, url = served
    root = tmp_path / "wf"
    cfg = yaml.safe_load(make_workflow(root, tokenizer).read_text())
    rows = [json.loads(line) for line in (root / "data.jsonl").read_text().splitlines()]
    # two public-set shapes: GSM8K-style JSON lines and an Alpaca-style JSON array, both prompt + reference
    (www / "gsm.jsonl").write_text(
        "".join(json.dumps({"question": r["prompt"], "answer": r["response"]}) + "\n" for r in rows[:12])
    )
    (www / "alpaca.json").write_text(
        json.dumps([{"instruction": r["prompt"], "input": "", "output": r["response"]} for r in rows[12:]])
    )
    (www / "test.jsonl").write_text(
        "".join(json.dumps({"question": q}) + "\n" for q in ["def main():", "import os\n", "class A:"])
    )
    cfg.update(
        data={**cfg["data"], "path": [f"{url}/gsm.jsonl", f"{url}/alpaca.json"],
              "regenerate": {"enabled": True, "max_new_tokens": 12, "checks": {"enabled": False}}},
        extract={"shards": 2},
        drafter={"num_layers": 1, "block_size": 4},
        train={"epochs": 1, "anchors_per_seq": 8, "token_budget": 512},
        bench={"datasets": [{"name": "gsm", "path": f"{url}/test.jsonl"}], "max_new_tokens": 10,
               "ddtree_budgets": [4], "parts": 1, "warmup": 0, "real_loop": False},
        study={"train_samples": [6]},
    )  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    args = ["--configfile", str(tmp_path / "c.yaml")]
    snakemake("all", *args)
    res = Path(cfg["results"])

    fetched = sorted((res / "inputs/web").iterdir(), key=lambda p: p.name.split("-", 1)[1])
    assert [p.name.split("-", 1)[1] for p in fetched] == ["alpaca.json", "gsm.jsonl", "test.jsonl"]
    for p in fetched:
        assert p.read_bytes() == (www / p.name.split("-", 1)[1]).read_bytes()
    assert json.loads((res / "prepared/stats.json").read_text())["samples"] == 24  # 12 lines + 12 array items

    table = pd.read_csv(res / "study/summary.csv")
    sizes = table.groupby("size")[["train_samples", "train_tokens"]].first()
    assert sizes.loc["n6", "train_samples"] == 6 and sizes.loc["main", "train_samples"] == 23  # 1 held out
    assert sizes.loc["n6", "train_tokens"] < sizes.loc["main", "train_tokens"]
    assert set(table["method"]) == {"dflash", "ddtree@4"} and set(table["dataset"]) == {"gsm"}
    assert (table["tau"] >= 1).all() and (table["heldout_tau"] >= 1).all()
    for png in ("tau_vs_tokens", "accuracy_by_position"):
        assert (res / f"study/{png}.png").stat().st_size > 1000
    text = (res / "study/summary.md").read_text()
    assert "## Trend" in text and "tau_per_doubling" in text
    main_train = json.loads((res / "train/summary.json").read_text())
    small_train = json.loads((res / "study/n6/train/summary.json").read_text())
    assert small_train["heldout_samples"] == main_train["heldout_samples"] == 1  # the same held-out set

    # the plan counts each size's training and bench, and checks them against their jobs
    rows = {r["stage"]: r for r in json.loads((res / "plan/measured.json").read_text())["rows"]}
    # the main run's and n6's; and, tau only, one reference job: the target's answers, decoded once for both
    assert rows["training"]["jobs"] == 2 and rows["bench"]["jobs"] == 3, rows
    # the check runs after every size's bench, so none is missing from it
    assert rows["bench"]["missing"] == rows["training"]["missing"] == 0, rows
    benches = list((res / "study").glob("n*/bench/parts/*.jsonl"))
    assert benches and (res / "plan/measured.json").stat().st_mtime >= max(p.stat().st_mtime for p in benches)
    assert len(list((res / "bench/reference").glob("gsm.*.jsonl"))) == 1
    assert "with the study's 1 size" in json.loads((res / "plan.json").read_text())["stages"]["bench"]["source"]

    # a new size trains, exports and benchmarks only that size (and plans it): nothing upstream, nor the main
    # run, nor the target's answers, again
    cfg["study"]["train_samples"] = [6, 12]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    planned = job_counts(snakemake("all", "-n", *args).stdout)
    assert planned == {
        "study_train": 1,
        "study_export": 1,
        "study_bench": 1,
        "study": 1,
        "plan": 1,
        "plan_check": 1,
        "all": 1,
    }, planned
    # the plan's check needs every size's bench: asked for alone, it brings them in
    assert job_counts(snakemake("plan_check", "-n", "--forceall", *args).stdout)["study_bench"] == 2


def test_trainings_of_a_study_share_the_cores_of_a_gpu_node(tmp_path, tokenizer):
    """On the GPU run, each training asked for every core, so the study's trainings ran one after another while
    five of six GPU slots stood idle; a training now takes its slots' share of the cores (all of them without
    GPUs, where training is CPU work)."""
    root = tmp_path / "wf"
    cfg = yaml.safe_load(make_workflow(root, tokenizer).read_text())
    cfg.update(study={"train_samples": [6, 12]})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))

    def train_threads(env: dict) -> dict[str, str]:
        out = snakemake("all", "-n", "--configfile", str(tmp_path / "c.yaml"), cores=8, env=env).stdout
        jobs, rule = {}, None
        for line in out.splitlines():
            if line.startswith("rule "):
                rule = line[5:].rstrip(":")
            elif line.strip().startswith("threads:") and rule in ("train", "study_train"):
                jobs[f"{rule}{len(jobs)}"] = line.split(":", 1)[1].strip()
        return jobs

    on_gpus = train_threads({"DRAFTSMITH_GPUS": "0,0,0,0"})  # four slots of one GPU: two cores each
    assert sorted(on_gpus.values()) == ["2", "2", "2"], on_gpus
    on_cpu = train_threads({"DRAFTSMITH_GPUS": ""})
    assert sorted(on_cpu.values()) == ["8", "8", "8"], on_cpu


def test_study_budget_steps_gives_each_size_the_main_runs_steps(tmp_path, tokenizer):
    """study.budget reaches the trainings of the sizes as train.steps_as_full, never the main run's."""
    root = tmp_path / "wf"
    cfg = yaml.safe_load(make_workflow(root, tokenizer).read_text())
    cfg.update(study={"train_samples": [6], "budget": "steps"})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = snakemake("all", "-n", "-p", "--configfile", str(tmp_path / "c.yaml")).stdout
    commands = [line for line in out.splitlines() if "draftsmith.steps.train " in line]
    sizes = [c for c in commands if "/study/n6/" in c]
    main = [c for c in commands if "/study/" not in c]
    assert len(sizes) == len(main) == 1, commands
    assert '"steps_as_full": true' in sizes[0] and '"max_samples": 6' in sizes[0]
    assert '"steps_as_full": false' in main[0] and '"max_samples": null' in main[0]
