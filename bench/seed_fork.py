"""When in a run the seed spread arises: forks of one run that change only the data after a chosen epoch.

    python bench/seed_fork.py --datasets paste8 --forks 0 12 --streams 1 2 3 4
    python bench/seed_fork.py --summary

A run with `--seed s` draws its initial weights and its data stream (the order of the samples and
every augmentation of every epoch) from s. A fork at epoch E trains exactly as the base seed does for
epochs 0..E-1 (the same initial weights, the same batches, the same arithmetic) and from epoch E on
reads another data stream: epoch e >= E is ordered and augmented as epoch e + 1000 k would be, for
stream k. Nothing else changes (no global random generator is drawn from during training).

- Forks at 0 keep the initial weights and change the whole data stream: if their final mAPs spread as
  widely as different seeds do, the initial weights are not where the spread comes from.
- Forks at a later epoch show how much spread the remaining epochs' data can still make on their own:
  if it is as wide as between seeds, a run is not set on its course early, and no change to the start
  of training (warmup, initial weights) can narrow it.

Each family is the base run plus its forks (the base's data after E is one more stream). Runs train in
this process as bench/fidelity.py's mode does, one at a time; rows go to bench/out/seed_fork.csv as each
run ends, and a rerun skips what is done.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.fidelity import (DATASETS, append_result, ensure_dataset, parse_run_args, read_results,  # noqa: E402
                            summarise_run, train_in_process)

STREAM_STRIDE = 1000  # stream k's epoch e is the base's epoch e + 1000 k: far from any real epoch
FIELDS = ("dataset", "mode", "seed", "fork_epoch", "stream", "map50", "map", "wall_s", "epoch0_box_loss")


def fork_sampler(sampler, fork_epoch: int, stream: int) -> None:
    """From `fork_epoch` on, `sampler` orders and tags its samples as epoch + STREAM_STRIDE * stream (the
    dataset seeds each sample's augmentation from that tag), so the data after the fork is another stream's."""
    set_epoch = sampler.set_epoch
    sampler.set_epoch = lambda e: set_epoch(e + STREAM_STRIDE * stream if e >= fork_epoch else e)


def run_one(dataset: str, mode: str, seed: int, fork_epoch: int | None, stream: int, runs: Path) -> dict:
    """Train (dataset, mode, seed) as bench/fidelity.py does, the data forked to `stream` at `fork_epoch`
    (None: the base run)."""
    from utils.engine.callbacks import Callbacks

    _, epochs, imgsz = DATASETS[dataset]
    name = f"{dataset}-{mode}-s{seed}" + ("" if fork_epoch is None else f"-fork{fork_epoch}-k{stream}")
    cb = Callbacks()
    if fork_epoch is not None:
        cb.register("on_train_start", lambda t: fork_sampler(t.train_loader.sampler, fork_epoch, stream))
    wall = train_in_process(dataset, mode, seed, runs, name, cb)
    r = summarise_run(runs / name, dataset, mode, seed, epochs, imgsz, wall)
    first = next(csv.DictReader(open(runs / name / "results.csv")))
    return {"dataset": dataset, "mode": mode, "seed": seed, "fork_epoch": "" if fork_epoch is None else fork_epoch,
            "stream": stream, "map50": r["map50"], "map": r["map"], "wall_s": r["wall_s"],
            "epoch0_box_loss": float(first["train/box_loss"])}


def families(rows: list[dict]) -> dict[tuple[str, str, int, int], list[tuple[int, float]]]:
    """(dataset, mode, seed, fork epoch) -> [(stream, final mAP)], the base run counted as stream 0 of
    every fork epoch of its seed."""
    base = {(r["dataset"], r["mode"], int(r["seed"])): float(r["map"]) for r in rows if r["fork_epoch"] == ""}
    out: dict = {}
    for r in rows:
        if r["fork_epoch"] == "":
            continue
        key = (r["dataset"], r["mode"], int(r["seed"]), int(r["fork_epoch"]))
        out.setdefault(key, []).append((int(r["stream"]), float(r["map"])))
    for (dataset, mode, seed, _), members in out.items():
        if (dataset, mode, seed) in base:
            members.insert(0, (0, base[dataset, mode, seed]))
    return out


def summary(rows: list[dict]) -> str:
    lines = ["| dataset | mode | seed | data forked at epoch | final mAP@0.5:0.95 per stream (0 = the base run) | "
             "mean | std | range |", "|---|---|---|---|---|---|---|---|"]
    for (dataset, mode, seed, fork), members in sorted(families(rows).items()):
        maps = [m for _, m in sorted(members)]
        sd = statistics.stdev(maps) if len(maps) > 1 else float("nan")
        per = " ".join(f"k{k} {m:.3f}" for k, m in sorted(members))
        lines.append(f"| {dataset} | {mode} | {seed} | {fork} | {per} | {statistics.fmean(maps):.3f} | {sd:.3f} | "
                     f"{max(maps) - min(maps):.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0, help="the base run's seed (initial weights and data before the fork)")
    p.add_argument("--forks", nargs="+", type=int, default=[0, 12], help="epochs at which the data stream changes")
    p.add_argument("--streams", nargs="+", type=int, default=[1, 2, 3, 4], help="data streams after the fork (>= 1)")
    a = parse_run_args(p, argv, "seed_fork", summary)
    if a is None:
        return
    path = Path(a.csv)
    if min(a.streams) < 1:
        raise SystemExit("--streams: stream 0 is the base run itself; give streams 1 and up")
    for dataset in a.datasets:
        if not 0 <= min(a.forks) <= max(a.forks) < DATASETS[dataset][1]:
            raise SystemExit(f"--forks: epochs of {dataset}'s run are 0..{DATASETS[dataset][1] - 1}")
    # the base first, then streams in turn over the fork epochs, so a cut-short pass leaves families even
    plan = [(d, None, 0) for d in a.datasets] + [(d, e, k) for k in a.streams for d in a.datasets for e in a.forks]
    for dataset, fork, stream in plan:
        done = {(r["dataset"], r["mode"], r["seed"], r["fork_epoch"], r["stream"]) for r in read_results(path)}
        if (dataset, a.mode, str(a.seed), "" if fork is None else str(fork), str(stream)) in done:
            continue
        ensure_dataset(dataset)
        append_result(path, run_one(dataset, a.mode, a.seed, fork, stream, Path(a.runs)), FIELDS)
        print(summary([r for r in read_results(path) if r["dataset"] == dataset]), flush=True)


if __name__ == "__main__":
    main()
