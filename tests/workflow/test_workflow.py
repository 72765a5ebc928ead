"""The workflow through the Snakemake CLI: reruns recompute only what is missing or broken; bad configs fail
with the key named. Real jobs, real files, a tiny real target."""

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import NOLOCK, OVERLAYS, STAGED, digest, hub_cache, job_counts, make_workflow, snakemake

from draftsmith.preflight import FIRST_RECORDS, preflight
from draftsmith.speculative.engine_run import engine_available


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("wf")
    make_workflow(root, tokenizer, extract={"shards": 3, "validate_samples": 2})
    return root


def test_dry_run_lists_every_job(small_run):
    out = snakemake("dataset", "-n", "--configfile", str(small_run / "config.yaml")).stdout
    for rule, n in [
        ("probe", 1),
        ("prepare", 1),
        ("shard", 1),
        ("extract", 3),
        ("validate", 3),
        ("dataset", 1),
    ]:
        assert any(line.split() == [rule, str(n)] for line in out.splitlines()), (rule, out[-1500:])


def test_rerun_recomputes_only_the_broken_shard(small_run):
    cfg = ["--configfile", str(small_run / "config.yaml")]
    res = small_run / "results"
    snakemake("dataset", *cfg)
    merged = json.loads((res / "merged/manifest.json").read_text())
    assert merged["num_shards"] == 3 and merged["total_samples"] == 24
    shards = {s: res / f"extract/shard00{s}.safetensors" for s in range(3)}
    before = {s: (digest(p), p.stat().st_mtime_ns) for s, p in shards.items()}

    # nothing changed: nothing runs
    assert "Nothing to be done" in snakemake("dataset", "-n", *cfg).stdout

    # a deleted shard: only it is recomputed
    shards[1].unlink()
    snakemake("dataset", *cfg)
    after = {s: (digest(p), p.stat().st_mtime_ns) for s, p in shards.items()}
    assert after[0] == before[0] and after[2] == before[2]
    assert after[1][0] == before[1][0] and after[1][1] != before[1][1]  # same bytes, new file
    # its regenerated answers were kept from the first run, not decoded again
    assert "regeneration: reusing" in (res / "logs/extract/shard001.log").read_text()

    # a corrupted shard: validation names it and the check, moves it aside; the next run recomputes it alone
    raw = bytearray(shards[2].read_bytes())
    raw[-64:] = bytes(64)  # zero the tail (the last sample's rows)
    shards[2].write_bytes(bytes(raw))
    fail = snakemake("dataset", *cfg, check=False)
    assert fail.returncode != 0
    log = (res / "logs/validate/shard002.log").read_text()
    assert "shard shard002" in log and "check failed" in log
    assert not shards[2].exists() and any((res / "extract/quarantine").iterdir())
    snakemake("dataset", *cfg)
    final = {s: (digest(p), p.stat().st_mtime_ns) for s, p in shards.items()}
    assert final[0] == before[0] and final[1] == after[1]
    assert final[2][0] == before[2][0]


def test_a_gpu_memory_that_is_not_a_size_names_the_key(small_run):
    proc = snakemake("-n", "--config", "gpu_memory=lots", "--configfile", str(small_run / "config.yaml"),
                     check=False)  # fmt: skip
    assert proc.returncode != 0
    assert "gpu_memory: 'lots' is not a size" in proc.stderr + proc.stdout


@pytest.mark.skipif(engine_available(), reason="vLLM is installed here: the engine bench is in the DAG")
def test_without_vllm_the_engine_bench_is_left_out_in_one_line_and_requiring_it_stops(small_run, tmp_path):
    proc = snakemake("-n", "--configfile", str(small_run / "config.yaml"))
    assert "engine bench: vLLM is not installed, so the bench runs without it" in proc.stderr
    assert "engine_bench" not in proc.stdout and "report" in proc.stdout
    need = tmp_path / "engine.yaml"
    need.write_text("bench: {engine: {enabled: true}}\n")
    proc = snakemake("-n", "--configfile", str(small_run / "config.yaml"), str(need), check=False)
    assert proc.returncode != 0
    assert "bench.engine.enabled is true, but vLLM cannot be imported here" in proc.stderr + proc.stdout


def test_a_local_target_vllm_cannot_serve_is_named_at_parse_time(small_run, tmp_path):
    cfg = yaml.safe_load((small_run / "config.yaml").read_text())
    target = tmp_path / "target"
    shutil.copytree(cfg["target"]["model"], target)
    fields = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**fields, "linear_key_head_dim": 8}))  # value heads: 16
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"target": {"model": str(target)}, "bench": {"engine": {"enabled": True}}}))
    proc = snakemake("-n", "--configfile", str(small_run / "config.yaml"), str(other), check=False)
    assert proc.returncode != 0  # before any job: the engine is required, and vLLM 0.22 cannot serve it
    assert "bench.engine.enabled is true, but vLLM 0.22's fused Gated DeltaNet" in proc.stderr + proc.stdout
    assert "linear_key_head_dim (8) differs from linear_value_head_dim (16)" in proc.stderr + proc.stdout


def test_excluding_the_bench_gives_prepare_the_bench_files_and_no_other_job_the_key(small_run, tmp_path):
    on = tmp_path / "exclude.yaml"
    on.write_text("data: {exclude_bench: true, dedupe: true}\n")
    out = snakemake("-n", "-p", "dataset", "--configfile", str(small_run / "config.yaml"), str(on)).stdout
    prepare = next(line for line in out.splitlines() if "draftsmith.steps.prepare" in line)
    assert '"dedupe": true' in prepare and '"exclude_bench": true' in prepare and "--bench " in prepare
    others = [line for line in out.splitlines() if "--data-json" in line and "steps.prepare" not in line]
    assert others and not any("exclude_bench" in line or "dedupe" in line for line in others)


def test_bad_config_names_the_key(small_run):
    proc = snakemake(
        "-n",
        "--config",
        "data={'on_bad_record': 'ignore'}",
        "--configfile",
        str(small_run / "config.yaml"),
        check=False,
    )
    assert proc.returncode != 0
    assert "on_bad_record" in proc.stderr + proc.stdout


def test_data_templates_reach_prepare_through_the_cli_and_a_change_reprepares(small_run, tmp_path):
    """data.templates hold braces, which Snakemake reads as wildcards in a rule's param strings: the first run
    with SVAMP's records stopped at the DAG ("Wildcards in params cannot be determined"). Through the CLI, the
    records' own fields make the prompts, and a changed template plans prepare again."""
    rows = [{"ID": f"chal-{i}", "Body": f"Jack had {i + 3} pens.", "Question": "How many?"} for i in range(6)]
    data = tmp_path / "svamp.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = yaml.safe_load((small_run / "config.yaml").read_text())
    cfg["data"] |= {"path": str(data), "templates": ["{Body} {Question}"]}
    cfg["results"] = str(tmp_path / "results")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    snakemake("prepare", "--configfile", str(tmp_path / "c.yaml"))
    stats = json.loads((tmp_path / "results/prepared/stats.json").read_text())
    assert stats["samples"] == 6 and stats["skipped"] == 0
    assert "prepare" not in job_counts(snakemake("prepare", "-n", "--configfile", str(tmp_path / "c.yaml")).stdout)
    cfg["data"]["templates"] = ["{Question} {Body}"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    again = snakemake("prepare", "-n", "--configfile", str(tmp_path / "c.yaml")).stdout
    assert job_counts(again).get("prepare") == 1, again[-2000:]


def test_bad_record_stops_prepare_with_file_and_line(small_run, tmp_path):
    """A bad line past the records preflight reads at parse time (FIRST_RECORDS) stops prepare, named; one
    among them stops `snakemake -n` already."""
    good = '{"prompt": "a", "response": "b"}\n'
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good * (FIRST_RECORDS + 1) + '{"prompt": 3}\n')
    cfg = yaml.safe_load((small_run / "config.yaml").read_text())
    cfg["data"]["path"] = str(bad)
    cfg["results"] = str(tmp_path / "results")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake("prepare", "--configfile", str(tmp_path / "c.yaml"), check=False)
    assert proc.returncode != 0
    log = (tmp_path / "results/logs/prepare.log").read_text()
    assert f"{bad}:{FIRST_RECORDS + 2}: `prompt` must be a string" in log
    early = tmp_path / "early.jsonl"
    early.write_text(good + '{"prompt": 3}\n')
    cfg["data"]["path"] = str(early)
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(cfg))
    dry = snakemake("-n", "--configfile", str(tmp_path / "d.yaml"), check=False)
    assert dry.returncode != 0 and f"{early}:2: `prompt` must be a string" in dry.stdout + dry.stderr


def test_whole_dag_to_report(small_run, tmp_path):
    """probe -> ... -> merge -> train -> export -> bench -> report, then `snakemake --report` as the run says,
    on a target given as a hub id and read from an offline Hugging Face cache laid out as the hub lays it, with
    prompt-only data whose answers the target writes."""
    cfg = yaml.safe_load((small_run / "config.yaml").read_text())
    snapshot = hub_cache(tmp_path / "hub", "draftsmith-test/tiny-hybrid", Path(cfg["target"]["model"]))
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    data = tmp_path / "prompts_only.jsonl"
    rows = [json.loads(line) for line in Path(cfg["data"]["path"]).read_text().splitlines()]
    data.write_text("".join(json.dumps({"id": r["id"], "prompt": r["prompt"]}) + "\n" for r in rows))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": t}]}) + "\n"
            for i, t in enumerate(["def main():", "import os\n", "class A:"])
        )
    )
    cfg.update(
        results=str(tmp_path / "results"),
        gpu_memory="80GB",  # reaches every job (the probe records it); a CPU run has nothing to cap
        target={"model": "draftsmith-test/tiny-hybrid"},
        data={**cfg["data"], "path": str(data), "regenerate": {"enabled": True, "max_new_tokens": 16}},
        extract={"shards": 2},
        drafter={"num_layers": 1, "block_size": 4},
        train={"epochs": 1, "anchors_per_seq": 8, "token_budget": 1024},
        bench={
            "datasets": [{"name": "tiny", "path": str(prompts)}],
            "max_new_tokens": 12,
            "ddtree_budgets": [4, 8],
            "parts": 1,
        },
    )
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    args = ["--configfile", str(tmp_path / "c.yaml")]
    res = Path(cfg["results"])
    # the random-weight target answers with noise: its answers are judged and the job stops before extraction
    stopped = snakemake("all", *args, env=env, check=False)
    log = (res / "logs/extract/shard000.log").read_text()
    assert stopped.returncode != 0 and not (res / "extract/shard000.json").exists()
    assert re.search(r"- cut: \d+\.\d% of the answers, above data\.regenerate\.checks\.max_cut = 0\.9", log)
    assert "Likely: " in log and "shard000" in log
    # trained on knowingly: the cached answers are not decoded again, and the statistics still written
    cfg["data"]["regenerate"]["checks"] = {"enabled": False}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    run = snakemake("all", *args, env=env)
    assert "regeneration: reusing" in (res / "logs/extract/shard000.log").read_text()
    answers = json.loads((res / "extract/shard000.json").read_text())["answers"]
    assert answers["cut"] > 0.9 and sum(answers["histogram"]["counts"]) == answers["answers"]
    assert json.loads((res / "target/lock.json").read_text())["commit"] == snapshot.name
    assert json.loads((res / "probe.json").read_text())["gpu_memory_cap"] == 80 * 10**9
    manifest = json.loads((res / "extract/shard000.json").read_text())
    assert manifest["regenerated"] and manifest["model_path"] == str(snapshot)
    zlab = json.loads((res / "drafter/config.json").read_text())
    assert zlab["architectures"] == ["DFlashDraftModel"] and zlab["block_size"] == 4
    summary = (res / "bench/summary.csv").read_text()
    for method in ("ar", "dflash", "ddtree"):
        assert f",{method}," in summary
    records = [json.loads(line) for line in (res / "bench/records.jsonl").read_text().splitlines()]
    assert all(r["lossless"] for r in records if r["method"] == "dflash")  # fp32: bit-for-bit greedy
    for png in ("tau_by_method", "tau_vs_budget", "position_acceptance"):
        assert (res / f"bench/{png}.png").stat().st_size > 1000
    # the run ends by printing the report command for its own config files; it works as printed
    command = next(line for line in run.stderr.splitlines() if line.startswith("report: snakemake "))
    assert f"--configfile {tmp_path / 'c.yaml'}" in command
    snakemake(*shlex.split(command.removeprefix("report: snakemake ")), env=env)
    assert (res / "report.html").stat().st_size > 10_000
    assert_drafter_train_bench_keys_rerun_only_downstream(cfg, tmp_path, env)


# One other valid value for every key of the drafter, train and bench sections (the schema's keys, all of them:
# a key added to the schema fails the test until it is listed here). `compare` and `datasets` name files.
OTHER_VALUES = {
    "drafter": {"num_layers": 2, "block_size": 3, "mask_token_id": 440, "layer_types": ["full_attention"],
                "sliding_window": 16, "intermediate_size": 32},
    "train": {"epochs": 2, "lr": 1e-3, "warmup_ratio": 0.1, "weight_decay": 0.01, "grad_clip": 0.5,
              "anchors_per_seq": 4, "gamma": 3.0, "token_budget": 512, "seed": 1, "gpus": 2, "checkpoint_every": 7,
              "dtype": "fp32", "heldout_fraction": 0.1, "max_steps": 3, "max_samples": 10, "steps_as_full": True,
              "init_from": "start-drafter"},  # the run's own drafter, copied out of its results
    "bench": {"max_prompts": 2, "parts": 2, "max_new_tokens": 8, "block_size": 3, "ddtree_budgets": [4],
              "temperature": 0.5, "methods": ["ar", "dflash"], "real_loop": False, "thinking": True, "warmup": 0,
              "fp32_check_prompts": 1, "thinking_unlike_data": True},
}  # fmt: skip
DOWNSTREAM = {
    "mask_check",
    "start_check",
    "plan",
    "rates",
    "train",
    "export",
    "bench",
    "bench_reference",
    "report",
    "plan_check",
    "all",
}  # no data


def assert_drafter_train_bench_keys_rerun_only_downstream(cfg: dict, tmp_path: Path, env: dict) -> None:
    """After a complete run, a change to any drafter, train or bench key plans no job that makes data."""
    schema = yaml.safe_load((Path(__file__).parents[2] / "workflow/schemas/config.schema.yaml").read_text())
    for section, values in OTHER_VALUES.items():
        keys = set(schema["properties"][section]["properties"]) - {"compare", "datasets", "engine"}
        assert set(values) == keys, (section, keys ^ set(values))
        for key, value in values.items():
            changed = {**cfg, section: {**cfg[section], key: value}}
            if key == "layer_types":
                changed["drafter"]["num_layers"] = 1
            if key == "thinking":  # unlike the data's: said to be on purpose, or preflight stops it
                changed["bench"]["thinking_unlike_data"] = True
            if key == "init_from":
                start = tmp_path / value
                shutil.copytree(Path(cfg["results"]) / "drafter", start, dirs_exist_ok=True)
                changed["train"]["init_from"] = str(start)
            (tmp_path / "changed.yaml").write_text(yaml.safe_dump(changed))
            out = snakemake("all", "-n", "--configfile", str(tmp_path / "changed.yaml"), env=env).stdout
            planned = set(job_counts(out))
            assert planned and planned <= DOWNSTREAM, (f"{section}.{key}", planned - DOWNSTREAM)
            rerun = "bench" if section == "bench" else "train"  # and the change reaches the job that reads it
            assert rerun in planned, (f"{section}.{key}", planned)
    # the GPU memory cap changes no result, nor (without vLLM) the engine bench's settings: only the plan's
    # pages are written again
    engine = {**cfg, "bench": {**cfg["bench"], "engine": {"batch": 2, "env": {"VLLM_HOST_IP": "127.0.0.1"}}}}
    for changed in ({**cfg, "gpu_memory": "60GiB"}, engine):
        (tmp_path / "changed.yaml").write_text(yaml.safe_dump(changed))
        out = snakemake("all", "-n", "--configfile", str(tmp_path / "changed.yaml"), env=env).stdout
        assert set(job_counts(out)) <= {"plan", "plan_check", "all"}, job_counts(out)


@pytest.mark.parametrize(
    "preset", sorted(p.name for p in (Path(__file__).parents[2] / "configs").glob("*.yaml"))
)
def test_presets_pass_the_schema_and_preflight(preset, tmp_path, monkeypatch):
    """Users copy a preset over config.yaml or pass it with --configfile: each must validate as Snakemake will
    see it (alone, the schema filling the rest; a variant, which names no target, after the preset it varies:
    `X-name.yaml` after `X.yaml`, the demo's after config.yaml, as the Makefile passes them) and pass the checks
    that need no weights, once the data files it names are there."""
    from snakemake.utils import update_config, validate

    root = Path(__file__).parents[2]
    values = yaml.safe_load((root / "configs" / preset).read_text())
    base = root / "configs" / f"{preset.rsplit('-', 1)[0]}.yaml"
    base = base if base.exists() and "-" in preset else root / "config.yaml"
    bases = [root / b for b in OVERLAYS.get(f"configs/{preset}", [])] or [base]  # a listed overlay's own
    config: dict = {}
    for b in bases if "target" not in values else []:  # a variant
        update_config(config, yaml.safe_load(b.read_text()))
    update_config(config, values)
    validate(config, str(root / "workflow/schemas/config.schema.yaml"))
    monkeypatch.chdir(tmp_path)
    from draftsmith.config import is_url

    data = config["data"]["path"]
    for path in (data if isinstance(data, list) else [data]) + [
        d["path"] for d in config["bench"]["datasets"]
    ]:
        if path != "demo" and not is_url(path) and not path.startswith(config["results"]):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text('{"prompt": "hello"}\n')
    assert [p for p in preflight(config) if f": {STAGED}" not in p] == []  # a study's carried drafter
    assert config["data"]["regenerate"]["batch_size"] >= 1


def test_a_configfile_takes_the_schema_defaults_not_the_demos(small_run, tmp_path):
    """Before, --configfile was merged over the demo's config.yaml: a real target silently took the demo's
    DDTree budgets and 96 new tokens, and prepare was planned on the demo's data that nothing builds."""
    cfg = yaml.safe_load((small_run / "config.yaml").read_text())
    out = snakemake("all", "-n", "-p", "--configfile", str(small_run / "config.yaml")).stdout
    bench = next(line for line in out.splitlines() if "draftsmith.steps.bench" in line)
    assert '"ddtree_budgets": [16, 64, 256]' in bench and '"max_new_tokens": 128' in bench, bench
    demo = yaml.safe_load((Path(__file__).parents[2] / "config.yaml").read_text())
    assert demo["bench"]["ddtree_budgets"] != [16, 64, 256]  # the demo's own values differ
    for section, key, message in [
        ("data", "path", "data.path: 'demo' (the default) is the demo's data"),
        ("bench", "datasets", "bench.datasets: 'demo' has path 'demo'"),
    ]:
        left_out = {**cfg, section: {k: v for k, v in cfg[section].items() if k != key}}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(left_out))
        proc = snakemake("-n", "--configfile", str(tmp_path / "c.yaml"), check=False)
        assert proc.returncode != 0 and message in proc.stdout + proc.stderr, proc.stdout[-1500:]


def test_no_free_mask_token_stops_the_run_before_any_job(tmp_path, tokenizer):
    """Before, a vocabulary without padding rows passed `snakemake -n` and failed in training, after
    regeneration and extraction. Now the mask token is settled at parse time or the run stops naming the key."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = make_workflow(tmp_path, tokenizer)
    cfg = yaml.safe_load(config.read_text())
    target = Path(cfg["target"]["model"])
    fields = json.loads((target / "config.json").read_text())
    AutoModelForCausalLM.from_config(
        AutoConfig.for_model(**{**fields, "vocab_size": len(tokenizer)})
    ).save_pretrained(target)
    proc = snakemake("-n", "--configfile", str(config), check=False)
    assert proc.returncode != 0 and "drafter.mask_token_id: no free id" in proc.stdout + proc.stderr, (
        proc.stdout[-1500:]
    )
    assert not (tmp_path / "results").exists()
    cfg["drafter"] = {"mask_token_id": 7}
    config.write_text(yaml.safe_dump(cfg))
    assert "mask_check" in job_counts(snakemake("-n", "--configfile", str(config)).stdout)


def test_jobs_run_with_snakemakes_interpreter_from_a_bare_shell(tmp_path, tokenizer):
    """A user who runs .venv/bin/snakemake without activating the venv: every job still finds the project's
    Python (before, a bare `python` was not found, or was one without draftsmith)."""
    import os
    import subprocess
    import sys

    config = make_workflow(tmp_path, tokenizer)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"  # no venv, no pyenv shims
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", str(tmp_path / "results" / "probe.json"), "--cores", "1", NOLOCK,
         "--configfile", str(config)],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "results" / "probe.json").read_text())["target"]["num_layers"] == 8


def test_dry_run_without_gpus_names_node_gpus(small_run, tmp_path):
    """A config that trains on several GPUs, dry-run where there are none: the plan says it is a CPU plan and
    names node_gpus, instead of planning a CPU run in silence."""
    cfg = yaml.safe_load((small_run / "config.yaml").read_text())
    cfg["train"] = {**cfg.get("train", {}), "gpus": 8}
    (tmp_path / "gpus.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake("-n", "--configfile", str(tmp_path / "gpus.yaml"), env={"DRAFTSMITH_GPUS": ""})
    assert "planned for a CPU run" in proc.stderr and "node_gpus=8" in proc.stderr, proc.stderr[-2000:]
