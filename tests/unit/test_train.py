"""Training end to end on a tiny target: the loss falls, accuracy beats the frequency baseline, a killed run
resumes into the same run, and the CLIs produce a loadable z-lab drafter."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from draftsmith.config import with_defaults
from draftsmith.core.io import write_json
from draftsmith.dataset.shards import ShardWriter
from draftsmith.drafter.checkpoints import run_key, save_checkpoint
from draftsmith.drafter.config import DrafterConfig
from draftsmith.drafter.model import Drafter
from draftsmith.drafter.train import _set_up, train
from draftsmith.drafter.zlab import load_drafter
from draftsmith.target.taps import forward_taps

REPO = Path(__file__).resolve().parents[2]
V, H, TAPS = 64, 32, [0, 2]
DRAFTER = with_defaults(
    "drafter", {"num_layers": 1, "block_size": 4, "mask_token_id": V - 1, "intermediate_size": 64}
)
TRAIN = with_defaults(
    "train",
    {
        "epochs": 3,
        "lr": 1e-2,
        "anchors_per_seq": 8,
        "token_budget": 200,
        "checkpoint_every": 3,
        "heldout_fraction": 0.15,
        "warmup_ratio": 0.1,
    },
)


def toy_sequences(n: int, t: int, seed: int) -> list[torch.Tensor]:
    """A toy language: each token is followed by a fixed permutation of it (16 tokens), random starts."""
    g = torch.Generator().manual_seed(seed)
    pi = torch.randperm(16, generator=g)
    seqs = []
    for _ in range(n):
        x = [int(torch.randint(0, 16, (1,), generator=g))]
        for _ in range(t - 1):
            x.append(int(pi[x[-1]]))
        seqs.append(torch.tensor(x))
    return seqs


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> dict:
    """A tiny Qwen3 target, its tap states on toy sequences, written as shards + a merged manifest."""
    root = tmp_path_factory.mktemp("toy")
    cfg = Qwen3Config(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # a trained LM's embedding rows are far from 0.02-std noise; logits need some scale
        target.model.embed_tokens.weight.normal_(0.0, 0.15)
    target.save_pretrained(root / "target")
    seqs = toy_sequences(60, 32, 0)
    shards = []
    for s, part in enumerate([seqs[:30], seqs[30:]]):
        lengths = [len(x) for x in part]
        w = ShardWriter(root / "shards" / f"s{s}.safetensors", lengths, len(TAPS) * H)
        for i, ids in enumerate(part):
            hidden = forward_taps(target, ids[None], None, TAPS)[0].to(torch.bfloat16)
            mask = torch.ones(len(ids), dtype=torch.bool)
            mask[:3] = False
            w.write_sample(i, hidden, ids, mask)
        w.close()
        shards.append(
            {"path": f"../shards/s{s}.safetensors", "num_samples": len(part), "sample_tokens": lengths}
        )
    manifest = root / "merged" / "manifest.json"
    write_json(
        manifest,
        {
            "model": "toy",
            "taps": TAPS,
            "hidden_size": H,
            "storage": "bf16",
            "total_tokens": sum(sum(x["sample_tokens"]) for x in shards),
            "shards": shards,
        },
    )
    return {"root": root, "manifest": manifest, "target": root / "target"}


def read_metrics(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_training_learns_and_beats_frequency_baseline(toy, tmp_path):
    s = train(toy["manifest"], toy["target"], tmp_path / "run", DRAFTER, TRAIN)
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    losses = [float(r["loss"]) for r in rows]
    q = max(1, len(losses) // 4)
    assert sum(losses[-q:]) / q < 0.5 * sum(losses[:q]) / q
    assert s["heldout_acc_1"] > s["frequency_baseline_1"] + 0.3, s
    assert (tmp_path / "run" / "curves.png").stat().st_size > 1000
    assert (tmp_path / "run" / "final" / "config.json").exists()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["first_loss"] == losses[0] and summary["tokens_per_s"] > 0
    assert set(summary["heldout_acc"]) == {"1", "2", "3"}
    # a block's run of hits holds its position-1 hit and is at most the sum of its hits
    tau, acc = s["heldout_tau"], s["heldout_acc"]
    assert 1.0 + s["heldout_acc_1"] - 1e-6 <= tau <= 1.0 + sum(acc.values()) + 1e-6, s


def test_killed_run_resumes_into_the_same_run(toy, tmp_path):
    cfg = {**TRAIN, "epochs": 1}
    train(toy["manifest"], toy["target"], tmp_path / "whole", DRAFTER, cfg)
    train(
        toy["manifest"], toy["target"], tmp_path / "killed", DRAFTER, cfg, stop_after=5
    )  # last checkpoint: 3
    assert len(read_metrics(tmp_path / "killed" / "metrics.csv")) == 5
    assert not (tmp_path / "killed" / "final").exists()
    train(toy["manifest"], toy["target"], tmp_path / "killed", DRAFTER, cfg)
    whole = read_metrics(tmp_path / "whole" / "metrics.csv")
    resumed = read_metrics(tmp_path / "killed" / "metrics.csv")
    assert [r["step"] for r in resumed] == [r["step"] for r in whole]
    for a, b in zip(whole, resumed):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-6, abs=1e-7), a["step"]
    wa = load_drafter(tmp_path / "whole" / "final").state_dict()
    wb = load_drafter(tmp_path / "killed" / "final").state_dict()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)


def test_a_rerun_with_other_settings_starts_afresh_and_the_same_settings_resume(toy, tmp_path, capsys):
    """Snakemake removes the train rule's outputs before a rerun, not checkpoints/: a rerun after a change
    resumed the old run's last checkpoint, and with as many steps trained none (the report then failed on the
    summary's first_loss None). Checkpoints are kept per run key: a change starts afresh and leaves only its
    own key's checkpoints; the same settings again resume the finished run and train nothing more."""
    cfg = {**TRAIN, "epochs": 1, "max_steps": 6}  # checkpoints at 3 and 6
    run = tmp_path / "run"

    def rerun(tcfg: dict) -> dict:  # as Snakemake reruns the rule: its outputs deleted first
        for name in ("metrics.csv", "summary.json", "curves.png"):
            (run / name).unlink()
        shutil.rmtree(run / "final")
        return train(toy["manifest"], toy["target"], run, DRAFTER, tcfg)

    first = train(toy["manifest"], toy["target"], run, DRAFTER, cfg)
    ckpts = run / "checkpoints"
    (old_key,) = [p.name for p in ckpts.iterdir()]
    (ckpts / "step_00000001.pt").write_bytes(b"an unkeyed checkpoint of an earlier version")
    capsys.readouterr()
    changed = {**cfg, "lr": 3e-3}
    again = rerun(changed)
    assert "removed the checkpoints of another configuration or data" in capsys.readouterr().err
    fresh = train(toy["manifest"], toy["target"], tmp_path / "fresh", DRAFTER, changed)
    rows = read_metrics(run / "metrics.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, fresh["steps"] + 1)) and again["steps"] > 3
    assert again["first_loss"] == pytest.approx(fresh["first_loss"], rel=1e-6, abs=1e-7)
    for a, b in zip(read_metrics(tmp_path / "fresh" / "metrics.csv"), rows):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-6, abs=1e-7), a["step"]
    assert abs(first["final_loss"] - fresh["final_loss"]) > 1e-4  # the new lr reached the steps
    (new_key,) = [p.name for p in ckpts.iterdir()]
    assert new_key != old_key
    assert max(p.name for p in (ckpts / new_key).iterdir()) == f"step_{again['steps']:08d}.pt"

    done = rerun(changed)
    assert read_metrics(run / "metrics.csv") == rows  # resumed at the end: no step trained again, rows kept
    assert done["steps"] == again["steps"] and done["first_loss"] == again["first_loss"]
    assert done["heldout_acc"] == again["heldout_acc"]  # the same weights, evaluated again
    assert done["tokens_per_s"] is None and again["tokens_per_s"] > 0  # a job that trained nothing: no rate
    assert [p.name for p in ckpts.iterdir()] == [new_key]

    killed = tmp_path / "killed"
    train(toy["manifest"], toy["target"], killed, DRAFTER, changed, stop_after=5)  # last checkpoint: 3
    (killed / "metrics.csv").unlink()  # as Snakemake does before it reruns the job
    train(toy["manifest"], toy["target"], killed, DRAFTER, changed)
    resumed = read_metrics(killed / "metrics.csv")
    assert [r["step"] for r in resumed] == [r["step"] for r in rows]
    for a, b in zip(rows, resumed):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-6, abs=1e-7), a["step"]


def test_the_run_key_follows_what_decides_the_steps(toy, tmp_path):
    """The key changes with every train setting but checkpoint_every, with the merged manifest's text or its
    write time (a re-merge of other states may write the same text), with the target's weights (its frozen
    embedding and head) and with train.init_from's weights."""
    cfg = _set_up(
        toy["manifest"], toy["target"], drafter_section=DRAFTER, tcfg=TRAIN, preset_mask_token_id=None
    ).cfg

    def key(manifest: Path = toy["manifest"], target: Path = toy["target"], **changes) -> str:
        return run_key(manifest, {**TRAIN, **changes}, cfg, target=Path(target))

    base = key()
    assert key(checkpoint_every=7) == base
    assert len({base, key(lr=3e-3), key(epochs=2), key(gpus=2), key(max_steps=5), key(seed=1)}) == 6
    other_drafter = _set_up(
        toy["manifest"],
        toy["target"],
        drafter_section={**DRAFTER, "num_layers": 2},
        tcfg=TRAIN,
        preset_mask_token_id=None,
    ).cfg
    assert run_key(toy["manifest"], TRAIN, other_drafter, target=Path(toy["target"])) != base
    twin = shutil.copytree(toy["target"], tmp_path / "twin")  # the same shape and bytes, another file
    copied = key(target=twin)
    assert copied != base
    (weights,) = Path(twin).glob("*.safetensors")
    os.utime(weights, ns=(1, 1))  # weights replaced in place
    assert key(target=twin) != copied
    same_text = tmp_path / "merged" / "manifest.json"
    same_text.parent.mkdir()
    same_text.write_text(toy["manifest"].read_text())
    written = toy["manifest"].stat().st_mtime_ns
    os.utime(same_text, ns=(written, written))
    assert key(same_text) == base
    os.utime(same_text, ns=(written + 1000, written + 1000))
    assert key(same_text) != base
    start = tmp_path / "start"
    start.mkdir()
    (start / "model.safetensors").write_bytes(b"weights")
    os.utime(start / "model.safetensors", ns=(1, 1))
    at_start = key(init_from=str(start))
    assert at_start != base
    (start / "model.safetensors").write_bytes(b"WEIGHTS")  # the same size, written later
    assert key(init_from=str(start)) != at_start


def test_a_training_from_an_earlier_drafter_starts_at_its_weights(toy, tmp_path):
    """train.init_from: the drafter is built with the earlier one's weights to the bit, so the new run's first
    loss is the earlier run's trained loss, not a random start's; a drafter of another shape stops before the
    first step, naming each field that differs."""
    first = {**TRAIN, "epochs": 1}
    a = train(toy["manifest"], toy["target"], tmp_path / "a", DRAFTER, first)
    start = tmp_path / "a" / "final"
    again = {**first, "init_from": str(start)}
    run = _set_up(
        toy["manifest"], toy["target"], drafter_section=DRAFTER, tcfg=again, preset_mask_token_id=None
    )
    for k, v in load_drafter(start).state_dict().items():
        assert torch.equal(run.model.state_dict()[k], v), k
    b = train(toy["manifest"], toy["target"], tmp_path / "b", DRAFTER, again)
    a_losses = [float(r["loss"]) for r in read_metrics(tmp_path / "a" / "metrics.csv")]
    assert b["first_loss"] < 0.8 * a["first_loss"], (a["first_loss"], b["first_loss"])
    assert b["first_loss"] < max(a_losses[-3:]) * 1.5, (a_losses[-3:], b["first_loss"])
    other = {**DRAFTER, "block_size": 8}
    with pytest.raises(SystemExit, match=r"train\.init_from: .*shape \(block_size 8 here, 4 there"):
        train(toy["manifest"], toy["target"], tmp_path / "c", other, again)
    assert not (tmp_path / "c" / "metrics.csv").exists()


def test_cli_train_then_export(toy, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    tj = json.dumps({**TRAIN, "max_steps": 2, "epochs": 1})
    subprocess.run(
        [
            sys.executable,
            "-m",
            "draftsmith.steps.train",
            "--dataset",
            str(toy["manifest"]),
            "--target",
            str(toy["target"]),
            "--out",
            str(tmp_path / "train"),
            "--drafter-json",
            json.dumps({**DRAFTER, "mask_token_id": "auto"}),
            "--train-json",
            tj,
            "--target-json",
            json.dumps({"mask_token_id": 62}),  # the preset's mask token
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    assert len(read_metrics(tmp_path / "train" / "metrics.csv")) == 2
    subprocess.run(
        [
            sys.executable,
            "-m",
            "draftsmith.steps.export",
            "--train-dir",
            str(tmp_path / "train"),
            "--target",
            str(toy["target"]),
            "--out",
            str(tmp_path / "drafter"),
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    c = json.loads((tmp_path / "drafter" / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(toy["target"])
    named = {"mask_token": tok.convert_ids_to_tokens(62)} if 62 < len(tok) else {}  # for SGLang's readers
    assert (
        c["dflash_config"] == {"mask_token_id": 62, "target_layer_ids": TAPS, "block_size": 4, **named}
        and c["torch_dtype"] == "bfloat16"
    )
    assert load_drafter(tmp_path / "drafter").fc.weight.dtype == torch.bfloat16


def test_sigkill_mid_run_then_rerun_finishes_the_same_run(toy, tmp_path):
    """A real kill (SIGKILL of the training process once a checkpoint exists), then the same command again."""
    import signal
    import time

    env = dict(os.environ, PYTHONPATH=str(REPO))
    tj = json.dumps({**TRAIN, "epochs": 2, "checkpoint_every": 2})

    def cmd(out):
        return [
            sys.executable,
            "-m",
            "draftsmith.steps.train",
            "--dataset",
            str(toy["manifest"]),
            "--target",
            str(toy["target"]),
            "--out",
            str(out),
            "--drafter-json",
            json.dumps(DRAFTER),
            "--train-json",
            tj,
        ]

    subprocess.run(cmd(tmp_path / "whole"), check=True, env=env, capture_output=True)
    proc = subprocess.Popen(
        cmd(tmp_path / "killed"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ckpts = tmp_path / "killed" / "checkpoints"
    deadline = time.monotonic() + 120
    while not any(ckpts.glob("*/step_*.pt")):  # checkpoints/<run key>/
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed" / "final").exists()
    subprocess.run(cmd(tmp_path / "killed"), check=True, env=env, capture_output=True)
    whole = read_metrics(tmp_path / "whole" / "metrics.csv")
    resumed = read_metrics(tmp_path / "killed" / "metrics.csv")
    assert [r["step"] for r in resumed] == [r["step"] for r in whole]
    for a, b in zip(whole, resumed):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-5, abs=1e-6), a["step"]


def test_ddp_two_ranks_train_and_rank0_writes(toy, tmp_path):
    """Two torchrun ranks (gloo on the CPU: the same DDP code path as NCCL on GPUs) train one drafter."""
    env = dict(os.environ, PYTHONPATH=str(REPO), DRAFTSMITH_DISTRIBUTED="1", OMP_NUM_THREADS="1")
    env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on the CPU on a GPU machine too (NCCL would need two GPUs)
    tj = json.dumps({**TRAIN, "epochs": 2})
    out = tmp_path / "ddp"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "draftsmith.steps.train",
            "--dataset",
            str(toy["manifest"]),
            "--target",
            str(toy["target"]),
            "--out",
            str(out),
            "--drafter-json",
            json.dumps(DRAFTER),
            "--train-json",
            tj,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out / "metrics.csv")
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(set(steps))  # one writer: no step twice
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert load_drafter(out / "final").fc.weight.shape[1] == len(TAPS) * H


def test_a_subset_at_equal_compute_trains_the_whole_splits_steps(toy, tmp_path):
    """In the H200 study, 2,902 samples x 6 epochs ended at step 348 with batch accuracy 0.48 (held-out 0.47);
    the 11,608-sample run had 0.54 over the same steps and 0.79 at step 1,268: a fixed epoch count measures
    steps as much as data. study.budget: steps trains every size for the whole split's step count."""
    cfg = {**TRAIN, "max_steps": None, "checkpoint_every": 1000}
    whole = train(toy["manifest"], toy["target"], tmp_path / "whole", DRAFTER, cfg)
    few = {**cfg, "max_samples": whole["train_samples"] // 3}
    short = train(toy["manifest"], toy["target"], tmp_path / "short", DRAFTER, few)
    equal = train(toy["manifest"], toy["target"], tmp_path / "equal", DRAFTER, {**few, "steps_as_full": True})
    assert short["train_samples"] == equal["train_samples"] < whole["train_samples"]
    assert short["steps"] < whole["steps"] == equal["steps"], (short["steps"], equal["steps"], whole["steps"])
    assert equal["heldout_samples"] == whole["heldout_samples"]


def test_no_checkpoints_when_asked_and_a_full_disk_stops_before_the_first_step(toy, tmp_path, monkeypatch):
    """A 27B target's drafter (1.9B parameters) writes 23 GB a checkpoint: on 2026-12-03 the width run's
    training filled a 64 GB disk. checkpoint_every 0 writes none; a disk too small stops the job at once, with
    the keys to change named."""
    summary = train(
        toy["manifest"], toy["target"], tmp_path / "none", DRAFTER, {**TRAIN, "checkpoint_every": 0}
    )
    assert summary["steps"] > 0 and (tmp_path / "none" / "final" / "model.safetensors").exists()
    assert not list((tmp_path / "none").rglob("*.pt"))

    real = shutil.disk_usage
    monkeypatch.setattr(
        "draftsmith.drafter.train.shutil.disk_usage", lambda p: real(p)._replace(free=1000)
    )  # the free space a full disk reports; the rest is real
    with pytest.raises(SystemExit, match="train.checkpoint_every: 0") as e:
        train(toy["manifest"], toy["target"], tmp_path / "full", DRAFTER, TRAIN)
    assert str(tmp_path / "full") in str(e.value)
    assert not (tmp_path / "full" / "metrics.csv").exists()


def test_sweep_trains_one_variant_per_value_and_ranks_them(toy, tmp_path, monkeypatch, capsys):
    """The recipe sweep (draftsmith.perf.sweep_train) runs the training step per variant, two at a time, and
    its table holds every variant's held-out accuracy, the winner's changed keys become a config file; a bad
    key stops it before any training."""
    from draftsmith.perf import sweep_train

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"drafter": DRAFTER, "train": {**TRAIN, "epochs": 1}}))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("DRAFTSMITH_GPUS", "")
    args = ["--dataset", str(toy["manifest"]), "--target", str(toy["target"]), "--configfile", str(cfg)]
    out = ["--out-dir", str(tmp_path / "sweep"), "--json-out", str(tmp_path / "rows.json"), "--parallel", "2"]
    best = tmp_path / "best.yaml"
    together = "drafter.num_layers=2 train.lr=2e-3"
    sweep_train.main([*args, *out, "--vary", "train.lr=1e-3", "--variant", together, "--best-out", str(best)])
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["variant"] for r in rows] == ["base", "train.lr=1e-3", together]
    share = max(1, (os.cpu_count() or 1) // 2)  # the cores split between the two trainings at a time
    for v in ("v00", "v01", "v02"):
        assert f"torch threads: {share}\n" in (tmp_path / "sweep" / v / "train.log").read_text()
    assert all(len(r["heldout_acc"]) == DRAFTER["block_size"] - 1 and r["steps"] > 0 for r in rows), rows
    two_layers = json.loads((tmp_path / "sweep/v02/final/config.json").read_text())
    assert two_layers["num_hidden_layers"] == 2
    winner = max(rows, key=lambda r: r["heldout_tau"])["variant"]
    expected = {"base": {}, "train.lr=1e-3": {"train": {"lr": 1e-3}}}
    expected[together] = {"drafter": {"num_layers": 2}, "train": {"lr": 2e-3}}
    assert yaml.safe_load(best.read_text()) == expected[winner]
    assert best.read_text().startswith(f"# chosen by draftsmith.perf.sweep_train: {winner},")
    assert rows[0]["heldout_acc"] != rows[1]["heldout_acc"]  # the learning rate reached the training
    for r in rows:  # a run of hits is at most the sum of the positions' hit rates
        assert 1.0 <= r["heldout_tau"] <= 1.0 + sum(r["heldout_acc"]) + 1e-6, r
    printed = capsys.readouterr().out
    assert printed.count("\n| ") == 3 + 1 and "acc_1" in printed  # header, rule, three rows
    with pytest.raises(SystemExit, match="has no key `layers`"):
        sweep_train.main([*args, *out, "--vary", "drafter.layers=2"])
    with pytest.raises(SystemExit, match="--variant 'train.lr': expected SECTION.KEY=VALUE"):
        sweep_train.main([*args, *out, "--variant", "drafter.num_layers=2 train.lr"])


def test_checkpoints_never_exceed_the_kept_count_on_disk(tmp_path):
    """The older checkpoints go before the new one is written: a 27B target's drafter takes 23 GB a
    checkpoint, and check_disk and the plan count two. A write that fails midway (here: the metrics it copies
    are gone) leaves the checkpoint before it."""
    cfg = DrafterConfig(hidden_size=H, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                        intermediate_size=64, vocab_size=V, target_layer_ids=TAPS, num_target_layers=4,
                        mask_token_id=V - 1, block_size=4)  # fmt: skip
    model = Drafter(cfg)
    opt = torch.optim.AdamW(model.parameters())
    metrics = tmp_path / "metrics.csv"
    metrics.write_text("step\n")
    folder = tmp_path / "checkpoints" / "key"
    for step in (1, 2, 3):
        save_checkpoint(folder, step, model, opt, metrics=metrics, keep=2)
        assert len(list(folder.glob("step_*.pt"))) == min(step, 2)
    metrics.unlink()
    with pytest.raises(FileNotFoundError):
        save_checkpoint(folder, 4, model, opt, metrics=metrics, keep=2)
    assert [p.name for p in folder.glob("step_*.pt")] == ["step_00000003.pt"]
