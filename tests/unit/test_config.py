"""The config as code reads it: schema defaults filled as Snakemake fills them, the preflight checks that stop
a run before any job (taps no serving engine would feed the drafter), and every config shipped here."""

import pytest
import yaml
from conftest import OVERLAYS, REPO, STAGED

from draftsmith.config import with_defaults
from draftsmith.plan.cli import load_config
from draftsmith.preflight import preflight, target_problems

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


# Overlays, each with the files it is passed after (its usage line says so)
CONFIGS = ["config.yaml"] + sorted(f"configs/{p.name}" for p in (REPO / "configs").glob("*.yaml"))
USERS_RECORDS = "data/"  # where a model preset expects the user's own records and prompts


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_passes_the_schema_and_the_preflight(name, monkeypatch):
    """A preset or study config that the schema or the parse-time checks would refuse is found here, not on a
    GPU machine after its staging. Overlays are checked over their bases, and a new one must name its base."""
    monkeypatch.chdir(REPO)
    assert name in OVERLAYS or "target" in yaml.safe_load((REPO / name).read_text()), (
        f"{name} sets no target: an overlay, to be listed in OVERLAYS with the files it goes after"
    )
    config = load_config(OVERLAYS.get(name, []) + [name])
    problems = [p for p in preflight(config) if f": {USERS_RECORDS}" not in p and f": {STAGED}" not in p]
    assert problems == []
