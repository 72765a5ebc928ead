"""Extract one shard: take devices from the GPU pool, load the target once, (regenerate,) write tap states."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import NoReturn

import pandas as pd
import torch

from draftsmith.config import resolve_taps, section_arg
from draftsmith.core import faults
from draftsmith.core.gpu_pool import acquire
from draftsmith.core.io import read_json, read_samples, write_json
from draftsmith.core.runtime import set_threads, setup_logging
from draftsmith.dataset.answers import AnswersRejected, judge
from draftsmith.dataset.extract import extract_samples
from draftsmith.dataset.plan import check_disk_space
from draftsmith.dataset.regenerate import regenerate_shard, reusable_answers
from draftsmith.dataset.shard_sizes import shard_bytes
from draftsmith.dataset.shards import shard_manifest
from draftsmith.engine.memory import NoRoomForAnswers
from draftsmith.plan.data import answered_lengths
from draftsmith.plan.rounds import peak_tokens, round_tokens, sample_tokens, select_rows
from draftsmith.target.files import resolve_target
from draftsmith.target.kernels import report_kernels
from draftsmith.target.load import eos_ids_of, load_configured_target


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True)
    p.add_argument("--shard", required=True, help="prepared shard (parquet)")
    p.add_argument("--probe", required=True)
    p.add_argument("--target-json", required=True)
    p.add_argument("--data-json", required=True)
    p.add_argument("--taps-json", required=True)
    p.add_argument("--extract-json", required=True)
    p.add_argument("--budget-div", type=int, default=1, help="Snakemake's retry halves the token budget")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True, help="shard .safetensors")
    p.add_argument("--manifest", required=True, help="shard manifest .json")
    p.add_argument(
        "--answered", action="store_true", help="--shard holds the answers already: no regeneration"
    )
    p.add_argument("--rows-json", default=None, help="the rows of --shard that this job holds (rounds)")
    p.add_argument(
        "--round-plan", default=None, help="the pinned plan (plan/rounds.json): the round's budget"
    )
    p.add_argument("--base-shards", nargs="*", default=[], help="every prepared shard (for the round's size)")
    return p.parse_args(argv)


def check_round(
    base_shards: list[str],
    rows: dict,
    data: dict,
    budget: int,
    plan: dict,
    storage: str,
    *,
    in_flight: int = 1,
    answered: pd.Series | None = None,
    pin: Path | None = None,
) -> None:
    """Stops before any GPU work when this round, with the held-out samples, cannot fit the budget the plan
    handed out (the plan rule checks it too; a rerun of this job alone meets it here). Samples weigh their
    answers where `answered` has them: this run's, once regenerated. The plan may have weighed answers
    cached under other settings; then the kept rounds (`pin`) are dropped, so the rerun weighs them again."""
    frames = [pd.read_parquet(s, columns=["id", "num_tokens", "prompt_len"]) for s in base_shards]
    config = {"data": data, "train": {"heldout_fraction": rows["heldout_fraction"], "seed": rows["seed"]}}
    tokens, held = round_tokens(frames, config, rounds=int(rows["rounds"]), answered=answered)
    width = len(plan["target"]["taps"]) * int(plan["target"]["hidden_size"])
    # the tensors' bytes as the plan counts them (token_bytes), without the file's fixed part
    peak = peak_tokens(tokens, held, in_flight=in_flight)
    need = shard_bytes(peak, 0, width, storage) - shard_bytes(0, 0, width, storage)
    if need > budget:
        if pin is not None:
            pin.unlink(missing_ok=True)
        stop(
            f"extract: {in_flight} round(s) at once (extract.rounds_in_flight) and the held-out samples take "
            f"{need / 1e9:.3f} GB with the answers written now, but extract.disk_budget gives "
            f"{budget / 1e9:.3f} GB. The plan weighed other answers (a cache made under other settings); "
            "rerun snakemake: it weighs the rounds again on these (training starts over)"
        )


def settled_rounds(path: Path, rounds: int) -> dict | None:
    """The rounds as the plan kept them (RESULTS/plan/rounds.json), None before it has weighed the prepared
    shards. A DAG built from an estimate of the data may hold another count than the one kept then: its round
    jobs stop before any GPU work."""
    if not path.exists():
        return None
    pinned = read_json(path)
    if int(pinned["rounds"]) != rounds:
        stop(
            f"extract: this run's DAG has {rounds} rounds, but the plan kept {pinned['rounds']} ({path}), "
            f"weighed on the prepared shards. Rerun snakemake: it plans the {pinned['rounds']} rounds"
        )
    return pinned


def stop(msg: str) -> NoReturn:
    logging.error("%s", msg)
    sys.exit(msg)


def job_tokens(samples: pd.DataFrame, out: Path, *, tcfg: dict, dcfg: dict, regenerate: bool) -> int:
    """Tokens the job's shard will hold, as far as is known before any GPU work: answered samples their own,
    the answers its regeneration will reuse theirs (found as it finds them), the rest their bound. Weighing
    reused answers at the bound stopped a job whose states fit the disk."""
    regen = {**dcfg["regenerate"], "enabled": regenerate}
    reused = None
    if regenerate and (found := reusable_answers(samples, shard_out=out, target=tcfg, data=dcfg)) is not None:
        answer = (found["num_tokens"] - found["prompt_len"]).to_numpy()
        reused = pd.Series(answer, index=found["id"].to_numpy())
    return int(sample_tokens(samples, {**dcfg, "regenerate": regen}, reused).sum())


def _job_samples(args: argparse.Namespace, samples, *, tcfg: dict, dcfg: dict, ecfg: dict, plan: dict):
    """The samples this job holds (a round's or the held-out rows under a disk budget) and whether it
    regenerates their answers; stops before any GPU work when they cannot fit the disk."""
    if args.rows_json:
        rows = json.loads(args.rows_json)
        samples = select_rows(samples, rows, dcfg)
        pinned = args.round_plan and settled_rounds(Path(args.round_plan), int(rows["rounds"]))
        if pinned:
            in_flight = int(pinned["identity"].get("in_flight", 1))
            budget = int(pinned["budget_bytes"])
            results = Path(args.round_plan).parents[1]  # the round plan is RESULTS/plan/rounds.json
            answered = answered_lengths(results) if dcfg["regenerate"]["enabled"] else None
            check_round(
                args.base_shards,
                rows,
                dcfg,
                budget,
                plan,
                ecfg["storage"],
                in_flight=in_flight,
                answered=answered,
                pin=Path(args.round_plan),
            )
    regenerate = dcfg["regenerate"]["enabled"] and not args.answered
    try:  # before any GPU work: a full disk is a message now, not a crash hours in
        need = check_disk_space(
            Path(args.out),
            job_tokens(samples, Path(args.out), tcfg=tcfg, dcfg=dcfg, regenerate=regenerate),
            len(samples),
            len(plan["target"]["taps"]),
            int(plan["target"]["hidden_size"]),
            ecfg["storage"],
        )
    except OSError as e:
        stop(f"extract: {e}")
    logging.info("disk: the shard needs about %.3f GB", need / 1e9)
    return samples, regenerate


def _regenerate(model, tok, samples, args: argparse.Namespace, *, tcfg: dict, dcfg: dict):
    """The target's answers (kept in the answer cache); a retry after running out of memory halves slots."""
    slots = max(1, int(dcfg["regenerate"]["batch_size"]) // max(1, args.budget_div))
    try:
        return regenerate_shard(
            model, tok, samples, shard_out=Path(args.out), target=tcfg, data=dcfg, slots=slots
        )
    except torch.OutOfMemoryError as e:
        stop(
            f"regeneration: out of memory with {slots} slots ({e}). Snakemake retries the job once "
            f"with half the slots; if that fails too, set data.regenerate.batch_size below {slots}"
        )
    except (NoRoomForAnswers, NotImplementedError) as e:
        stop(f"regeneration: {e}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup_logging()
    set_threads(args.threads)
    tcfg, dcfg = section_arg(args.target_json, "target"), section_arg(args.data_json, "data")
    tapcfg, ecfg = section_arg(args.taps_json, "taps"), section_arg(args.extract_json, "extract")
    out, plan, samples = Path(args.out), read_json(args.probe), read_samples(args.shard)
    samples, regenerate = _job_samples(args, samples, tcfg=tcfg, dcfg=dcfg, ecfg=ecfg, plan=plan)
    target_dir = resolve_target(args.target)

    with acquire(plan["gpus_per_copy"]) as devices:
        model, tok, _ = load_configured_target(target_dir, devices, tcfg)
        kernels = report_kernels(model)
        taps = resolve_taps(model.config.get_text_config().num_hidden_layers, tapcfg)
        regen_stats, answers = None, None
        if regenerate:
            samples, regen_stats = _regenerate(model, tok, samples, args, tcfg=tcfg, dcfg=dcfg)
            try:  # judged before extraction spends GPU time on them; they stay in extract/regen/
                answers = judge(samples, tok, eos_ids_of(model, tok), data=dcfg, shard=out.stem)
            except AnswersRejected as e:
                stop(str(e))
        budget = max(1, int(plan["token_budget"]) // max(1, args.budget_div))
        logging.info(
            "shard %s: %d samples, %d tokens, taps %s, token budget %d, devices %s",
            args.shard,
            len(samples),
            int(samples["num_tokens"].sum()),
            taps,
            budget,
            devices or "cpu",
        )
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        try:
            checksum, stats = extract_samples(model, samples, taps, out, budget, ecfg["storage"], pad)
        except OSError as e:  # the disk could not hold the shard: found as the file is laid out
            stop(f"extract: {e}")
        except torch.OutOfMemoryError as e:
            stop(
                f"extract: out of memory at token budget {budget} ({e}); the partial shard was removed. "
                "Snakemake retries the job once with half the budget; if that fails too, set "
                f"extract.token_budget below {budget}"
            )

    manifest = shard_manifest(
        out,
        samples,
        model=model,
        model_path=str(target_dir),
        target=tcfg,
        data=dcfg,
        taps=taps,
        storage=ecfg["storage"],
        checksum=checksum,
        stats=stats.as_dict(),
        regen_stats=regen_stats,
        kernels=kernels,
        answers=answers,
    )
    write_json(args.manifest, manifest)
    faults.damage(out)


if __name__ == "__main__":
    main()
