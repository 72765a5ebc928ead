"""Shared fixtures: tiny real targets (Hugging Face models built from configs, random weights, a real
tokenizer), and the helpers that run the workflow through the Snakemake CLI on them."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from snakemake_fork import dry_run

from draftsmith.demo.data import read_text, split_files
from draftsmith.demo.target import train_tokenizer
from draftsmith.drafter.config import drafter_config
from draftsmith.drafter.model import Drafter
from draftsmith.drafter.zlab import save_zlab

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(2)


# pytest-xdist gives each worker whole files, in the order collected (`make test`: --dist loadfile
# --no-loadscope-reorder): these, the longest, go out first, longest first, so that none of them starts last
# while the other worker runs out of files. Every other file keeps its collected place after them.
SLOWEST_FIRST = [
    "workflow/test_rounds.py",
    "workflow/test_workflow.py",
    "workflow/test_faults.py",
    "workflow/test_real_model.py",
    "workflow/test_slurm.py",
    "workflow/test_study.py",
    "unit/test_regenerate.py",
    "workflow/test_plan_settle.py",
    "unit/test_train.py",
    "unit/test_convert.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    here = Path(__file__).resolve().parent

    def place(item) -> int:
        path = Path(item.path)
        return (
            rank.get(path.relative_to(here).as_posix(), len(rank)) if path.is_relative_to(here) else len(rank)
        )

    items.sort(key=place)  # stable: a file's own tests keep their order


@pytest.fixture(scope="session")
def tokenizer():

    texts = [read_text(p) for p in split_files()[0][:40]]
    return train_tokenizer(texts, vocab_size=400)


def tiny_model(kind: str, vocab: int, layers: int = 8, hidden: int = 64, seed: int = 0, **overrides):
    """A tiny target with random weights, of either family: `hybrid` (Qwen3.5: Gated DeltaNet + full
    attention, one full-attention layer in four) or `attention` (Qwen3: full attention only)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

    fields = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    if kind == "hybrid":
        fields.update(
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16
        )
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{**fields, **overrides})).eval()
        from draftsmith.target.kernels import kernels_follow_device

        kernels_follow_device(model)  # on a GPU node with fla installed, CPU tests must not reach Triton
        return model
    return Qwen3ForCausalLM(Qwen3Config(**{**fields, **overrides})).eval()


def compile_for_h200(kernel, signature: dict[str, str], constants: dict, warps: int):
    """Compiles a Triton kernel ahead of time for sm_90 with Triton's own ptxas: no GPU or driver needed, so a
    CPU machine learns whether the kernel builds to machine code (the interpreter runs it as Python). Returns
    Triton's compiled kernel; skips where Triton is absent or runs interpreted."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (the dev extra installs it on Linux x86-64)")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Triton runs interpreted in this process")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def sliding_model(family: str, vocab: int, window: int, slide: bool = True):
    """Tiny targets with sliding layers (slide False: the same weights, every layer sees every position).
    `mistral` gives a window and no layer kinds, so every layer slides (Transformers' reading); the others
    name them."""
    import transformers as tf

    n = 2 if family in ("mistral", "gpt-oss") else 3
    kinds = (
        ["sliding_attention", "full_attention", "sliding_attention"][:n] if slide else ["full_attention"] * n
    )
    shape = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=n,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=window,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    if family == "mistral":
        return tf.MistralForCausalLM(
            tf.MistralConfig(**{**shape, "sliding_window": window if slide else None})
        ).eval()
    if family == "gemma2":  # logit soft-capping in attention and after the head
        # (a cap small enough to change what random weights attend to)
        # (eager: Transformers 5.17 ran Gemma 2 on SDPA, which drops the cap)
        cfg = tf.Gemma2Config(
            **shape, layer_types=kinds, query_pre_attn_scalar=1, attn_logit_softcapping=0.01
        )
        cfg._attn_implementation = "eager"
        return tf.Gemma2ForCausalLM(cfg).eval()
    if family == "gpt-oss":  # attention sinks, experts
        return tf.GptOssForCausalLM(
            tf.GptOssConfig(
                **{**shape, "intermediate_size": 64},
                num_local_experts=4,
                num_experts_per_tok=2,
                layer_types=kinds,
            )
        ).eval()
    return tiny_model(
        "attention",
        vocab,
        layers=n,
        use_sliding_window=True,
        sliding_window=window,
        max_window_layers=0,
        layer_types=kinds,
    )


def build_target(
    path: Path, tokenizer, kind: str = "hybrid", layers: int = 8, hidden: int = 64, seed: int = 0
):
    """`tiny_model` saved as a Hugging Face model directory with the tokenizer beside it."""
    vocab = (len(tokenizer) // 64 + 1) * 64
    model = tiny_model(
        kind,
        vocab,
        layers,
        hidden,
        seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_untrained_drafter(target: Path, out: Path) -> None:
    """An untrained 1-layer drafter (block 4, taps 1 and 3) of the target's shape, in z-lab's format."""
    text = json.loads((target / "config.json").read_text())
    torch.manual_seed(0)
    cfg = drafter_config(text, [1, 3], num_layers=1, num_target_layers=text["num_hidden_layers"],
                         mask_token_id=text["vocab_size"] - 1, block_size=4)  # fmt: skip
    save_zlab(Drafter(cfg), out)


@pytest.fixture(scope="session")
def hybrid_target(tmp_path_factory, tokenizer):
    return build_target(tmp_path_factory.mktemp("hybrid"), tokenizer, "hybrid")


@pytest.fixture(scope="session")
def attention_target(tmp_path_factory, tokenizer):
    return build_target(tmp_path_factory.mktemp("attention"), tokenizer, "attention")


# Every run of a test writes its own results folder, but all share the repository's .snakemake/locks: with
# pytest's workers running side by side, one run removed that folder as another wrote its lock in it (CI,
# 2026-12-05). Snakemake's lock guards against two runs writing the same outputs, which no two tests do.
NOLOCK = "--nolock"


def snakemake(
    *args, check: bool = True, env: dict | None = None, cores: int = 2, lock: bool = False
) -> subprocess.CompletedProcess:
    """The Snakemake CLI in the repository (its workflow profile included), as a user runs it; Snakemake's
    lock only where a test is about it (`lock=True`)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **(env or {}))
    argv = ["--cores", str(cores), *([] if lock else [NOLOCK]), *args]
    if "-n" in args:  # the same CLI, forked from a process that has imported Snakemake (snakemake_fork.py)
        proc = dry_run(argv, env, REPO)
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "snakemake", *argv], cwd=REPO, env=env, capture_output=True, text=True
        )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def job_counts(snakemake_output: str) -> dict[str, int]:
    """The `Job stats` table Snakemake prints before it runs (or dry-runs) anything: rule -> jobs."""
    counts: dict[str, int] = {}
    for line in snakemake_output.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total" and not parts[0].endswith(":"):
            counts.setdefault(parts[0], int(parts[1]))
    return counts


def make_workflow(root: Path, tokenizer, records: int = 24, **sections) -> Path:
    """A tiny hybrid target, `records` prompt/response records of demo text, three bench prompts, and a
    config.yaml using them (standing alone: what it leaves out takes the schema's defaults)."""

    build_target(root / "target", tokenizer, "hybrid", layers=8, hidden=32)
    texts = [read_text(p) for p in split_files()[0][:records]]
    with open(root / "data.jsonl", "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"r{i}", "prompt": t[:120], "response": t[120 : 200 + 8 * i]}) + "\n")
    prompts = [{"id": f"p{i}", "prompt": t} for i, t in enumerate(["def main():", "import os\n", "class A:"])]
    (root / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    cfg = {
        "results": str(root / "results"),
        "target": {"model": str(root / "target")},
        # random weights answer with noise: judged and stopped by default (tests/unit/test_answers.py), so
        # the workflow tests that are about other things train on it knowingly
        "data": {
            "path": str(root / "data.jsonl"),
            "max_length": 128,
            "regenerate": {"enabled": True, "checks": {"enabled": False}},
        },  # fmt: skip
        "bench": {"datasets": [{"name": "tiny", "path": str(root / "prompts.jsonl")}]},
        "plan": {"rates": "table"},  # timing the node is tests/workflow/test_rounds.py's
        **sections,
    }
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    return root / "config.yaml"


def hub_cache(cache: Path, repo_id: str, model_dir: Path, commit: str = "0" * 39 + "1") -> Path:
    """`model_dir` laid out in `cache` exactly as huggingface_hub lays a download out: content-addressed
    blobs, a snapshot per commit of relative links to them, and `refs/main` naming the commit. With
    HF_HUB_CACHE=cache and HF_HUB_OFFLINE=1 the hub id resolves to that snapshot, with no network."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        rel = f.relative_to(model_dir)
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        blob.write_bytes(f.read_bytes())
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


@pytest.fixture(scope="session")
def interpreted() -> dict:
    """target.fusion's kernels through Triton's interpreter, in a process of its own
    (tests/unit/interpreted_kernels.py): its figures by name, for test_norms.py and test_gated_mlp.py."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (the dev extra installs it on Linux x86-64)")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent / "unit" / "interpreted_kernels.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


# bad training records, each with what its error says: prepare's own check (tests/unit/test_data.py) and the
# prepare job's (tests/workflow/test_faults.py)
BAD = {
    "invalid-json": ('{"prompt": "a", "response": ', "invalid JSON"),
    "missing-fields": (
        '{"id": "x", "text": "hello"}',
        "record has neither `messages` nor a single-turn field",
    ),
    "wrong-role": (
        '{"messages": [{"role": "robot", "content": "hi"}]}',
        "messages[0] has unknown role 'robot'",
    ),
    "empty-conversation": ('{"messages": []}', "`messages` must be a non-empty list"),
    "no-assistant": ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant turn to train on"),
    "duplicate-id": ('{"id": "r0", "prompt": "again", "response": "twice"}', "duplicate id 'r0'"),
}
GOOD = '{"id": "r0", "prompt": "def f(x):", "response": "    return x"}'


# the config overlays, each with the files it goes after (as the Makefile or scripts/gpu_suite.sh pass them),
# read by the preset checks of tests/unit/test_config.py and tests/workflow/test_workflow.py
STUDY = "configs/study-smollm2.yaml"
OVERLAYS = {
    "configs/demo-fp8.yaml": ["config.yaml"],
    "configs/demo-sliding.yaml": ["config.yaml"],
    "configs/study-smollm2-rounds.yaml": [STUDY],
    "configs/study-smollm2-rounds-2ep.yaml": [STUDY, "configs/study-smollm2-rounds.yaml"],
    "configs/study-smollm2-40k-5ep.yaml": ["configs/study-smollm2-40k.yaml"],
    "configs/study-smollm2-40k-6ep.yaml": ["configs/study-smollm2-40k.yaml"],
    "configs/study-smollm2-40k-half-10ep.yaml": ["configs/study-smollm2-40k.yaml"],
    "configs/study-smollm2-40k-10ep.yaml": ["configs/study-smollm2-40k.yaml"],
    "configs/study-smollm2-40k-16ep.yaml": ["configs/study-smollm2-40k.yaml"],
    "configs/study-smollm2-40k-math.yaml": ["configs/study-smollm2-40k.yaml"],
    "configs/study-smollm2-40k-continue.yaml": [
        "configs/study-smollm2-40k.yaml",
        "configs/study-smollm2-40k-math.yaml",
    ],
    "configs/study-smollm2-40k-more-math.yaml": ["configs/study-smollm2-40k.yaml"],
    "configs/study-smollm2-40k-continue-more.yaml": [
        "configs/study-smollm2-40k.yaml",
        "configs/study-smollm2-40k-more-math.yaml",
    ],
    "configs/study-smollm2-40k-continue-more-10ep.yaml": [
        "configs/study-smollm2-40k.yaml",
        "configs/study-smollm2-40k-more-math.yaml",
    ],
}
STAGED = "/tmp/stage/"  # where gpu_suite.sh stage_a puts what a study carries to the GPU machine (a drafter)
