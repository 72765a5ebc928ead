"""Train one round of the drafter (training in rounds): from the state the round before handed on, on this
round's merged hidden states; writes the state it hands on and the record of the samples it trained. With
--then-record, an epoch's last round goes on to the next epoch's first, the same round (reused states)."""

from __future__ import annotations

import argparse
import json
import sys

from draftsmith.config import section_arg
from draftsmith.core.distributed import launch
from draftsmith.core.runtime import exit_now, set_threads, setup_logging
from draftsmith.drafter.rounds import round_lengths, train_round
from draftsmith.steps.train import settled_drafter
from draftsmith.target.files import resolve_target


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dataset", required=True, help="the round's merged manifest.json")
    p.add_argument("--target", required=True)
    p.add_argument("--epoch", type=int, required=True)
    p.add_argument("--position", type=int, required=True, help="the round's place in the epoch's order")
    p.add_argument("--order", required=True, help="JSON: each epoch's round ids in training order")
    p.add_argument("--previous", default=None, help="the state the round before handed on")
    p.add_argument("--answers", nargs="+", required=True, help="every shard's answers (the token counts)")
    p.add_argument("--rows-json", required=True)
    p.add_argument("--data-json", required=True)
    p.add_argument("--drafter-json", default="{}")
    p.add_argument("--train-json", default="{}")
    p.add_argument("--target-json", default="{}")
    p.add_argument("--mask-token", default=None, help="mask_check's settled token id (a file)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--state", required=True)
    p.add_argument("--record", required=True)
    p.add_argument("--metrics", required=True)
    p.add_argument(
        "--then-record",
        default=None,
        help="also train the next epoch's first position (the same round's states), writing its record here; "
        "--state is then the state after it",
    )
    p.add_argument("--then-metrics", default=None)
    a = p.parse_args(argv)
    if (a.then_record is None) != (a.then_metrics is None):
        p.error("--then-record and --then-metrics go together")
    setup_logging()
    set_threads(a.threads)
    target = resolve_target(a.target)
    drafter = settled_drafter(target, a.drafter_json, a.target_json, mask_file=a.mask_token)
    tcfg = section_arg(a.train_json, "train")
    lengths = round_lengths(a.answers, section_arg(a.data_json, "data"), json.loads(a.rows_json))
    exit_now(
        launch(
            __spec__.name if __spec__ else "draftsmith.steps.train_round",
            sys.argv[1:] if argv is None else argv,
            int(tcfg["gpus"]),
            lambda: train_round(
                a.dataset,
                target,
                drafter_section=drafter,
                tcfg=tcfg,
                epoch=a.epoch,
                position=a.position,
                order=json.loads(a.order),
                lengths=lengths,
                previous=a.previous,
                state_out=a.state,
                metrics_path=a.metrics,
                record_out=a.record,
                then=None if a.then_record is None else (a.then_record, a.then_metrics),
            ),
        )
    )


if __name__ == "__main__":
    main()
