"""Our mAP against pycocotools' on one fixed set of COCO128 predictions: agreement and speed.

    python bench/metrics_speed.py [--dataset ../shared/datasets/coco128] [--repeat 3]

The predictions are the dataset's own boxes, jittered, sometimes given the wrong class, duplicated or
dropped, plus random false alarms, all with random scores (seeded, so every run sees the same set).
They are written as COCO JSON (rounded as test.py rounds), and both evaluators read those same numbers.
The prediction set is tests/helpers.py's (its agreement test, tests/test_metrics.py, scores the same set); our side
runs test.py's own accumulation (validator.score_predictions).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import validator  # noqa: E402
from tests.helpers import DEFAULT_DATASET, image_pairs, load_ground_truth, make_predictions  # noqa: E402


def our_metrics(preds: list[dict], ground_truth: tuple) -> tuple[float, float]:
    """(mAP@0.5, mAP@0.5:0.95) of COCO-format predictions through test.py's own accumulation (validator)."""
    res = validator.score_predictions(image_pairs(preds, ground_truth), nc=len(ground_truth[2]))
    return res.map50, res.map


def coco_metrics(preds: list[dict], dataset: Path = DEFAULT_DATASET, timings: dict | None = None) -> tuple[float, float]:
    """(mAP@0.5, mAP@0.5:0.95) from pycocotools COCOeval (bbox); `timings` gets evaluate+accumulate seconds."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        gt = COCO(str(dataset / "annotations.json"))
        dt = gt.loadRes(preds)
        ev = COCOeval(gt, dt, "bbox")
        t0 = time.perf_counter()
        ev.evaluate()
        ev.accumulate()
        t1 = time.perf_counter()
        ev.summarize()
    if timings is not None:
        timings["pycocotools"] = t1 - t0
    return float(ev.stats[1]), float(ev.stats[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, default=DEFAULT_DATASET)
    ap.add_argument("--repeat", type=int, default=3, help="timings take the best of this many runs")
    opt = ap.parse_args()
    if not (opt.dataset / "annotations.json").exists():
        sys.exit(f"error: {opt.dataset}/annotations.json not found; pass --dataset pointing at COCO128")
    preds = make_predictions(opt.dataset)
    ground_truth = load_ground_truth(opt.dataset)
    ours_t, coco_t = [], []
    for _ in range(opt.repeat):
        t0 = time.perf_counter()
        ours = our_metrics(preds, ground_truth)
        ours_t.append(time.perf_counter() - t0)
        timings: dict = {}
        theirs = coco_metrics(preds, opt.dataset, timings)
        coco_t.append(timings["pycocotools"])
    print(f"{len(preds)} predictions on {opt.dataset.name}; torch {torch.get_num_threads()} threads")
    print(f"{'':14}{'mAP50':>9}{'mAP50-95':>10}")
    print(f"{'ours':14}{ours[0]:9.5f}{ours[1]:10.5f}")
    print(f"{'pycocotools':14}{theirs[0]:9.5f}{theirs[1]:10.5f}")
    print(f"{'difference':14}{ours[0] - theirs[0]:+9.1e}{ours[1] - theirs[1]:+10.1e}")
    print(f"time (best of {opt.repeat}): ours {min(ours_t) * 1e3:.1f} ms (matching + AP), "
          f"pycocotools evaluate+accumulate {min(coco_t) * 1e3:.1f} ms, ratio {min(coco_t) / min(ours_t):.1f}x")


if __name__ == "__main__":
    main()
