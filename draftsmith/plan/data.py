"""What the plan knows of the data before any job: records counted and tokens estimated from a sample of
them at parse time (no tokenizer needed), or measured once `prepare` and the answer cache exist."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from draftsmith.config import content_hash

if TYPE_CHECKING:
    import pandas as pd

# the prepared base shards' ids and token counts, and the answers known by id: what the rounds are weighed on
Shards: TypeAlias = "tuple[list[pd.DataFrame], pd.Series | None] | None"

# target keys that jobs making data never see (a change reruns the mask check and training only)
DATA_JOB_DROP = ("mask_token_id", "expect")
# regeneration settings that change its speed, never its answers
SPEED_ONLY = ("batch_size", "sync_every", "cuda_graph", "min_refill", "jobs_per_shard", "checks")
CHARS_PER_TOKEN = 3.0  # below what BPE tokenizers give English and code (3.5-4.5): the estimate errs high
TEMPLATE_TOKENS_PER_TURN = 8  # role markers and separators a chat template adds to each message
SAMPLED_RECORDS = 512  # records read closely (evenly spaced through the file) for the token estimate


@dataclass
class DataSize:
    """Samples and tokens per sample, and where the figures come from."""

    samples: int
    prompt_tokens: float  # mean per sample: everything before the last assistant turn
    answer_tokens: float  # mean per sample: the last assistant turn (the bound when regenerating)
    tokens_bound: float  # mean tokens a sample can take on disk, capped by data.max_length
    source: str  # "estimate", "measured" or "measured prompts; answers bounded by max_new_tokens"
    answers_bounded: bool = False  # the target writes the answers, and none is written yet: their bound
    # of `samples`, those whose answers are written already (by id): regeneration skips them
    answered: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def _record_texts(rec: object, templates: list[str]) -> tuple[int, int, int]:
    """(prompt chars, last answer chars, turns) of one record, or zeros for a record prepare would refuse."""
    from draftsmith.dataset.prepare import BadRecord, to_messages

    try:
        msgs = to_messages(rec, templates)  # type: ignore[arg-type]
    except BadRecord:
        return 0, 0, 0
    answer = len(msgs[-1]["content"]) if msgs[-1]["role"] == "assistant" else 0
    prompt = sum(len(m["content"]) for m in msgs) - answer
    return prompt, answer, len(msgs)


def count_records(path: str) -> tuple[int, list[object]]:
    """Records in a local file and an evenly spaced sample of them; (0, []) for what is not here yet."""
    from draftsmith.dataset.prepare import BadRecord, iter_records

    p = Path(path)
    if not p.is_file():
        return 0, []
    if p.suffix == ".jsonl":
        with p.open("rb") as f:
            lines = [line for line in f if line.strip()]
        step = max(1, len(lines) // SAMPLED_RECORDS)
        sample: list[object] = []
        for raw in lines[::step][:SAMPLED_RECORDS]:
            try:
                import json

                sample.append(json.loads(raw))
            except ValueError:
                continue
        return len(lines), sample
    try:
        recs: list[object] = [rec for _, _, rec in iter_records(path) if not isinstance(rec, Exception)]
    except BadRecord:
        return 0, []
    step = max(1, len(recs) // SAMPLED_RECORDS)
    return len(recs), recs[::step][:SAMPLED_RECORDS]


def estimate(paths: list[str], data: dict) -> DataSize | None:
    """The data's size from its files alone; None when a source is not on this machine yet (a URL before
    its fetch job, a `datasets` name)."""
    total, sample = 0, []
    for path in paths:
        n, recs = count_records(path)
        if n == 0:
            return None
        total += n
        sample += recs
    if data.get("max_samples"):
        total = min(total, int(data["max_samples"]))
    templates = data.get("templates") or []
    texts = np.asarray([_record_texts(r, templates) for r in sample], dtype=np.float64).reshape(-1, 3)
    prompt = (texts[:, 0] / CHARS_PER_TOKEN + texts[:, 2] * TEMPLATE_TOKENS_PER_TURN) if len(texts) else None
    answer = texts[:, 1] / CHARS_PER_TOKEN if len(texts) else None
    if prompt is None or answer is None:
        return None
    return _sized(total, prompt, answer, data, source="estimate")


def _sized(
    samples: int, prompt: np.ndarray, answer: np.ndarray, data: dict, *, source: str, bounded: bool = False
) -> DataSize:
    """Means per sample, the answer replaced by its bound when the target writes the answers (`bounded`: the
    answers given are that bound already)."""
    regen = data["regenerate"]
    if regen["enabled"] and source == "estimate":
        answer, bounded = np.full_like(prompt, float(regen["max_new_tokens"])), True
    cap = float(data["max_length"])
    bound = np.minimum(prompt + answer, cap)
    return DataSize(
        samples=int(samples),
        prompt_tokens=float(prompt.mean()) if len(prompt) else 0.0,
        answer_tokens=float(answer.mean()) if len(answer) else 0.0,
        tokens_bound=float(bound.mean()) if len(bound) else 0.0,
        source=source,
        answers_bounded=bounded,
    )


def measured(
    results: str | Path, data: dict, *, answered: pd.Series | None = None, settings: str | None = None
) -> DataSize | None:
    """The prepared samples' own token counts, with the answer cache's answers where it has them; None before
    `prepare` has run. `answered`: the answers' lengths already read (`answered_lengths`), else read here.
    `settings` (`answer_settings`): the samples answered under them will not be decoded again."""
    import pandas as pd

    prepared = Path(results) / "prepared" / "samples.parquet"
    if not prepared.exists():
        return None
    df = pd.read_parquet(prepared, columns=["id", "num_tokens", "prompt_len"])
    prompt = df["prompt_len"].to_numpy(dtype=np.float64)
    answer = (df["num_tokens"] - df["prompt_len"]).to_numpy(dtype=np.float64)
    source, bounded, done = "measured", False, 0
    if data["regenerate"]["enabled"]:
        if answered is None:
            answered = answered_lengths(results)
        if answered is not None and len(answered):
            answer = np.full_like(prompt, float(answered.mean()))
            source = f"measured; answers: the mean of {len(answered)} cached"
            done = int(df["id"].isin(answered_under(results, settings)).sum()) if settings else 0
        else:
            answer = np.full_like(prompt, float(data["regenerate"]["max_new_tokens"]))
            source, bounded = "measured prompts; answers bounded by max_new_tokens", True
    size = _sized(len(df), prompt, answer, data, source=source, bounded=bounded)
    return replace(size, answered=done)


def answer_files(results: Path) -> list[Path]:
    """Every answer cache file of a run, in either layout: the regeneration jobs' (answers/cache/, one file a
    shard or a job) and the one-round extraction jobs' (extract/regen/)."""
    return sorted((results / "answers" / "cache").glob("*.parquet")) + sorted(
        (results / "extract" / "regen").glob("*.parquet")
    )


def answered_lengths(results: str | Path) -> pd.Series | None:
    """Answer tokens by sample id of every answer written so far, each sample once, this run's joined answers
    first: the regenerate rule's files (its joined and per-job outputs, and its cache, alone on a machine that
    an earlier session's answers were carried to) and extraction's cache hold the same answers several times
    over. None when there are none."""
    import pandas as pd

    results = Path(results)
    files = sorted((results / "answers").glob("*.parquet")) + answer_files(results)
    if not files:
        return None
    parts = [pd.read_parquet(f, columns=["id", "num_tokens", "prompt_len"]) for f in files]
    df = pd.concat(parts).drop_duplicates("id")
    answers = (df["num_tokens"] - df["prompt_len"]).to_numpy(dtype=np.int64)
    return pd.Series(answers, index=df["id"].to_numpy())


def decoding_settings(regen: dict) -> dict:
    """data.regenerate less the keys that change its speed only: what the answers depend on."""
    return {k: v for k, v in regen.items() if k not in SPEED_ONLY}


def answer_settings(target: dict, regen: dict, max_length: int) -> str:
    """What answers depend on besides their prompts: the target as data jobs see it, the decoding settings and
    the length cap. The answer cache's stamps keep it, so that the plan tells answers a run will reuse from
    answers it will decode again."""
    seen = {k: v for k, v in target.items() if k not in DATA_JOB_DROP}
    return content_hash(seen, decoding_settings(regen), int(max_length))


def answered_under(results: str | Path, settings: str) -> set:
    """Ids of the samples whose answers the cache holds under `settings` (its stamps say which). Answers of
    other settings, or stamped before stamps named them, are decoded again: they are not counted."""
    import pandas as pd

    ids: set = set()
    for f in answer_files(Path(results)):
        try:
            if json.loads(f.with_suffix(".json").read_text()).get("settings") == settings:
                ids.update(pd.read_parquet(f, columns=["id"])["id"])
        except (OSError, ValueError):
            continue  # a file being written, or a torn stamp: not reused
    return ids


def shard_files(results: str | Path, count: int) -> list[str]:
    """The base shards as the shard rule names them (RESULTS/shards/shardNNN.parquet)."""
    return [f"{results}/shards/shard{i:03d}.parquet" for i in range(count)]


def read_shards(config: dict, files: list[str] | None, *, base_shards: int) -> Shards:
    """The prepared base shards and the answers known, or None before every shard is written. Read once for
    the plan: its data size and its rounds both take them."""
    if not files or len(files) != base_shards or not all(Path(f).is_file() for f in files):
        return None
    import pandas as pd

    frames = [pd.read_parquet(f, columns=["id", "num_tokens", "prompt_len"]) for f in files]
    answered = answered_lengths(config["results"]) if config["data"]["regenerate"]["enabled"] else None
    return frames, answered
