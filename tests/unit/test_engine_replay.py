"""The replay on the engine's own answers, on a tiny real hybrid target: on the target's greedy answer it
commits what the real DFlash loop commits, and on an answer that leaves greedy it accepts drafts against
that answer, as the engine accepts them against its own."""

from itertools import accumulate

from conftest import save_untrained_drafter

from draftsmith.config import with_defaults
from draftsmith.perf.round_cost import OracleDrafter
from draftsmith.speculative.bench import load_models
from draftsmith.speculative.engine_replay import engine_text_replay, replay_on_texts
from draftsmith.speculative.loop import speculative_generate
from draftsmith.speculative.replay import ar_generate

TAPS = [1, 3]  # save_untrained_drafter's


def _loaded(target, tmp_path):
    save_untrained_drafter(target, tmp_path / "drafter")
    bench = with_defaults("bench", {})
    target_cfg = with_defaults("target", {"model": str(target)})
    models = load_models(
        str(target), str(tmp_path / "drafter"), devices=[], target_cfg=target_cfg, bench=bench
    )
    return models, bench, target_cfg


def test_on_the_greedy_answer_it_commits_what_the_real_loop_commits(hybrid_target, tmp_path):
    models, bench, target_cfg = _loaded(hybrid_target, tmp_path)
    prompts = [models.tokenizer("def main():")["input_ids"], models.tokenizer("import os\n")["input_ids"]]
    answers = [ar_generate(models.target, ids, 24).tokens for ids in prompts]
    got = engine_text_replay(str(hybrid_target), str(tmp_path / "drafter"), prompts, answers, devices=[],
                             target_cfg=target_cfg, bench=bench)  # fmt: skip
    assert got["dtype"] == "float32"  # on the CPU, as the bench runs there
    for ids, answer, committed in zip(prompts, answers, got["committed"], strict=True):
        gen, real = speculative_generate(models.target, models.drafter, ids, 24, TAPS)
        assert gen.tokens == answer and committed == real
        assert sum(committed) == len(answer) - 1  # the first token is the prefill's


def test_drafts_are_accepted_against_the_served_answer_not_the_targets(hybrid_target, tmp_path):
    models, _, _ = _loaded(hybrid_target, tmp_path)
    ids = models.tokenizer("class A:")["input_ids"]
    greedy = ar_generate(models.target, ids, 24).tokens
    part = 10  # the served answer leaves greedy here, as a bf16 engine's may at a near-tie
    served = greedy[:part] + [(greedy[part] + 1) % len(models.tokenizer)] + greedy[part + 1 :]
    oracle = OracleDrafter(models.drafter, greedy, len(ids))  # drafts the greedy answer exactly
    (committed,) = replay_on_texts(models.target, oracle, [ids], [served], taps=TAPS)
    block = oracle.block_size
    ends = list(accumulate(committed))
    assert part in ends  # the step that reaches the parting stops there, its bonus the served token
    assert all(c == block for c in committed[: ends.index(part)])  # every step before it is accepted whole
    assert sum(committed) == len(served) - 1
    (own,) = replay_on_texts(models.target, OracleDrafter(models.drafter, served, len(ids)), [ids], [served],
                             taps=TAPS)  # fmt: skip
    assert own[: len(own) - 1] == [block] * (len(own) - 1)  # drafting the served answer: accepted whole
