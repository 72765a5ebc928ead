"""The config as code reads it: schema defaults filled as Snakemake fills them, and the preflight checks that
stop a run before any job (here: taps no serving engine would feed the drafter)."""

import pytest

from draftsmith.config import with_defaults
from draftsmith.preflight import target_problems

TEXT = {"num_hidden_layers": 12, "vocab_size": 1000, "hidden_size": 64}


def config(**taps) -> dict:
    return {
        "target": with_defaults("target", {"model": "org/model"}),
        "taps": with_defaults("taps", taps),
        "drafter": with_defaults("drafter"),
    }


def test_defaults_come_from_the_schema():
    train = with_defaults("train", {"epochs": 2})
    assert train["epochs"] == 2 and train["lr"] == 6.0e-4 and train["max_steps"] is None
    assert with_defaults("data")["regenerate"]["max_new_tokens"] == 512  # nested sections too


def test_default_taps_pass():
    assert target_problems(config(), TEXT) == []


@pytest.mark.parametrize(
    "taps, message",
    [
        (
            {"include_last": True},
            "taps.include_last: true; no serving engine captures the last layer's output",
        ),
        ({"layers": [1, 5, 11]}, "taps.layers: 11 is the last decoder layer"),
        ({"layers": [5, 1, 8]}, "must be increasing without repeats"),
        ({"layers": [1, 1, 8]}, "must be increasing without repeats"),
    ],
    ids=["include-last", "last-layer", "unsorted", "repeated"],
)
def test_taps_no_engine_serves_are_refused(taps, message):
    problems = target_problems(config(**taps), TEXT)
    assert len(problems) == 1 and message in problems[0], problems
