"""The replay on the engine's own text: the drafter, loaded as the bench loads it, walked over the answers the
engine served with it. A gap between the engine and the bench's replay then splits in two: the engine's
answers differing from the replay's (other kernels, bf16 breaking near-ties another way), and the engine
drafting differently from draftsmith (what the gap on the engine's own text measures)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from tqdm import tqdm

from draftsmith.speculative.bench import drafter_taps, load_models
from draftsmith.speculative.proposers import Proposer
from draftsmith.speculative.replay import replay, target_hidden


def replay_on_texts(
    target: nn.Module,
    drafter: Proposer,
    prompts: Sequence[Sequence[int]],
    texts: Sequence[Sequence[int]],
    *,
    taps: list[int],
) -> list[list[int]]:
    """Tokens committed per verify step for each prompt, with `texts[i]` standing as the target's answer:
    a draft is accepted while it matches the text, as the engine accepts it while it matches its own
    greedy token."""
    committed = []
    for ids, text in tqdm(list(zip(prompts, texts, strict=True)), desc="replay on the engine's text"):
        tokens = [*ids, *text]
        committed.append(replay(drafter, tokens, target_hidden(target, tokens, taps), len(ids)))
    return committed


def engine_text_replay(
    target_dir: str,
    drafter_dir: str,
    prompts: Sequence[Sequence[int]],
    texts: Sequence[Sequence[int]],
    *,
    devices: list[int],
    target_cfg: dict,
    bench: dict,
) -> dict:
    """The replay on the served texts, on the devices the engine job holds once the engine has let them go;
    target and drafter in the dtype the bench would use there."""
    models = load_models(target_dir, drafter_dir, devices=devices, target_cfg=target_cfg, bench=bench)
    committed = replay_on_texts(models.target, models.drafter, prompts, texts, taps=drafter_taps(drafter_dir))
    dtype = str(next(models.target.parameters()).dtype).removeprefix("torch.")
    return {"dtype": dtype, "committed": committed}
