"""How much of a mode's seed spread belongs to the val set rather than to training.

    python bench/val_noise.py --data bench/out/paste8/paste8.yaml --imgsz 256 \
        --weights bench/out/fidelity/paste8-fp32-lr2-s*/weights/last.pt

One run per seed gives one final mAP per seed; their spread mixes two things: how differently the seeds
trained, and how much a particular model's score depends on which few images (and which few distinct
objects) the val set holds. A small val set inflates the second. This script evaluates each checkpoint on
the val split once, keeps every image's match statistics, and then:

- bootstrap: each model's mAP@0.5:0.95 over resamplings of the val images with replacement; its standard
  deviation is the standard error of one model's figure at this val-set size;
- split-half: random halves A and B of the val images; across the models, the covariance of their
  deviations from the models' mean on A with those on B. A model's val-set-specific luck on two disjoint
  halves is independent, so this covariance estimates the between-seed variance an endless val set would
  still show (the training spread); the full set's between-seed variance minus it is the val set's share.
  (mAP is not exactly additive over images, so this is an estimate; the half sets' own noise is larger,
  which the covariance cancels and the variance does not.)
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from utils.report.metrics import ap_per_class  # noqa: E402

ImageStats = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # correct (n, 10), conf, pred class, label class
Score = Callable[[Sequence[ImageStats], np.ndarray], float]


def image_stats(weights: str, data: str, imgsz: int, workers: int = 2) -> list[ImageStats]:
    """Each val image's match statistics for one checkpoint, from the evaluation itself (test.py's)."""
    import validator as v

    opt = v.EvalOptions(data=data, weights=weights, imgsz=imgsz, workers=workers, plots=False).checked()
    acc, _, _ = v.accumulate(opt)
    return [tuple(t.numpy() for t in s) for s in acc.stats]


def map_of(stats: Sequence[ImageStats], idx: np.ndarray) -> float:
    """mAP@0.5:0.95 over the images at `idx` (repeats count again, as a bootstrap needs)."""
    tp, conf, pcls, tcls = (np.concatenate([stats[i][k] for i in idx]) for k in range(4))
    return float(ap_per_class(tp, conf, pcls, tcls).map)  # it shapes tp (n, 10) itself, n = 0 included


def bootstrap_se(stats: Sequence[ImageStats], score: Score, draws: int, rng: np.random.Generator) -> float:
    n = len(stats)
    return statistics.stdev(score(stats, rng.integers(0, n, n)) for _ in range(draws))


def split_half(models: Sequence[Sequence[ImageStats]], score: Score, splits: int,
               rng: np.random.Generator) -> tuple[float, float]:
    """(between-model variance on the full val set, its part that repeats across disjoint halves)."""
    n = len(models[0])
    full = [score(m, np.arange(n)) for m in models]
    covs = []
    for _ in range(splits):
        perm = rng.permutation(n)
        a, b = perm[: n // 2], perm[n // 2:]
        sa = np.array([score(m, a) for m in models])
        sb = np.array([score(m, b) for m in models])
        covs.append(float(np.sum((sa - sa.mean()) * (sb - sb.mean())) / (len(models) - 1)))
    return statistics.variance(full), statistics.fmean(covs)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--imgsz", type=int, required=True)
    p.add_argument("--weights", nargs="+", required=True, help="one checkpoint per seed, same mode")
    p.add_argument("--draws", type=int, default=200, help="bootstrap resamplings per model")
    p.add_argument("--splits", type=int, default=200, help="random val halves")
    p.add_argument("--seed", type=int, default=0)
    opt = p.parse_args(argv)
    if len(opt.weights) < 3:
        raise SystemExit("--weights: give at least 3 checkpoints (one per seed) for a between-seed variance")
    rng = np.random.default_rng(opt.seed)
    models = [image_stats(w, opt.data, opt.imgsz) for w in opt.weights]
    print(f"{len(models)} models, {len(models[0])} val images ({opt.data})")
    for w, m in zip(opt.weights, models):
        full, se = map_of(m, np.arange(len(m))), bootstrap_se(m, map_of, opt.draws, rng)
        print(f"{w}: mAP@0.5:0.95 {full:.4f}, bootstrap SE {se:.4f}")
    var_full, cov = split_half(models, map_of, opt.splits, rng)
    print(f"between-seed std on the full val set {var_full ** 0.5:.4f}; repeating across disjoint halves "
          f"(training) {max(cov, 0.0) ** 0.5:.4f}; training's share of the variance {cov / var_full:.2f} "
          f"({opt.splits} splits, {opt.draws} bootstrap draws, seed {opt.seed})")


if __name__ == "__main__":
    from utils.errors import run_cli

    run_cli(main)
