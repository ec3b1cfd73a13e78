"""Our mAP against pycocotools' on one fixed set of COCO128 predictions: agreement and speed.

    python bench/metrics_speed.py [--dataset ../shared/datasets/coco128] [--repeat 3]

The predictions are the dataset's own boxes, jittered, sometimes given the wrong class, duplicated or
dropped, plus random false alarms, all with random scores (seeded, so every run sees the same set).
They are written as COCO JSON (rounded as test.py rounds), and both evaluators read those same numbers.
tests/test_metrics.py imports `make_predictions` and `our_metrics` from here for its agreement test.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from utils.boxes import xywhn2xyxy  # noqa: E402
from utils.data_config import SHARED_COCO128  # noqa: E402
from utils.metrics import ap_per_class, match_predictions  # noqa: E402

DEFAULT_DATASET = SHARED_COCO128
MAX_PER_IMAGE = 100  # pycocotools keeps the top 100 per image and class; we never exceed it per image


def load_ground_truth(dataset: Path) -> tuple[dict, dict[int, np.ndarray], list[int]]:
    """(COCO json dict, image_id -> YOLO labels (n, 5) cls, x1, y1, x2, y2 in pixels, COCO91 id per class)."""
    coco = json.loads((dataset / "annotations.json").read_text())
    coco91 = json.loads((dataset / "yolo80_to_coco91.json").read_text())
    labels = {}
    for im in coco["images"]:
        f = dataset / "labels" / "train2017" / (Path(im["file_name"]).stem + ".txt")
        rows = np.loadtxt(f, ndmin=2) if f.exists() and f.stat().st_size else np.zeros((0, 5))
        boxes = xywhn2xyxy(rows[:, 1:5], im["width"], im["height"])
        labels[im["id"]] = np.concatenate([rows[:, :1], boxes], 1)
    return coco, labels, coco91


def _jitter(boxes: np.ndarray, rng: np.random.Generator, scale: float) -> np.ndarray:
    """Move each corner by a random fraction of the box size."""
    wh = np.concatenate([boxes[:, 2:4] - boxes[:, :2]] * 2, 1)
    return boxes + rng.normal(0, scale, boxes.shape) * wh


def _image_predictions(gt: np.ndarray, w: int, h: int, rng: np.random.Generator, nc: int) -> np.ndarray:
    """(n, 6) x1, y1, x2, y2, score, cls for one image."""
    keep = gt[rng.random(len(gt)) < 0.85]  # some objects are missed
    dup = keep[rng.random(len(keep)) < 0.3]  # some are found twice
    hits = np.concatenate([keep, dup])
    boxes = _jitter(hits[:, 1:], rng, rng.choice([0.03, 0.08, 0.2], size=(len(hits), 1)))
    cls = np.where(rng.random(len(hits)) < 0.1, rng.integers(0, nc, len(hits)), hits[:, 0])  # class swaps
    scores = np.clip(rng.beta(4, 2, len(hits)), 0.001, 1)
    n_fp = int(rng.integers(0, 25))
    xy = rng.random((n_fp, 2)) * [w, h]
    fp = np.concatenate([xy, xy + rng.random((n_fp, 2)) * [w / 2, h / 2]], 1)
    fp_cls = np.where(rng.random(n_fp) < 0.5, rng.choice(gt[:, 0], n_fp) if len(gt) else 0, rng.integers(0, nc, n_fp))
    boxes = np.concatenate([boxes, fp]).clip(0, [w, h, w, h])
    all_scores = np.concatenate([scores, rng.beta(2, 4, n_fp)])
    out = np.concatenate([boxes, all_scores[:, None], np.concatenate([cls, fp_cls])[:, None]], 1)
    out = out[(out[:, 2] > out[:, 0] + 1) & (out[:, 3] > out[:, 1] + 1)]
    return out[np.argsort(-out[:, 4], kind="stable")][:MAX_PER_IMAGE]


def make_predictions(dataset: Path = DEFAULT_DATASET, seed: int = 0) -> list[dict]:
    """The fixed prediction set in COCO result format (boxes [x, y, w, h] rounded to 3 decimals)."""
    coco, labels, coco91 = load_ground_truth(dataset)
    rng = np.random.default_rng(seed)
    preds = []
    for im in coco["images"]:
        for x1, y1, x2, y2, s, c in _image_predictions(labels[im["id"]], im["width"], im["height"], rng, len(coco91)):
            preds.append({"image_id": im["id"], "category_id": coco91[int(c)],
                          "bbox": [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)], "score": round(s, 5)})
    return preds


def our_metrics(preds: list[dict], ground_truth: tuple) -> tuple[float, float]:
    """(mAP@0.5, mAP@0.5:0.95) of COCO-format predictions with our matching and AP, as test.py computes them.

    ground_truth: what `load_ground_truth` returns (read once, outside any timing).
    """
    coco, labels, coco91 = ground_truth
    to_yolo = {c: i for i, c in enumerate(coco91)}
    by_image: dict[int, list] = {im["id"]: [] for im in coco["images"]}
    for p in preds:
        x, y, w, h = p["bbox"]
        by_image[p["image_id"]].append([x, y, x + w, y + h, p["score"], to_yolo[p["category_id"]]])
    stats = []
    for image_id, rows in by_image.items():
        det = torch.tensor(rows, dtype=torch.float32).reshape(-1, 6)
        lab = torch.from_numpy(labels[image_id]).float()
        correct = match_predictions(det, lab)
        stats.append((correct.numpy(), det[:, 4].numpy(), det[:, 5].numpy(), lab[:, 0].numpy()))
    tp, conf, pcls, tcls = (np.concatenate(x, 0) for x in zip(*stats))
    res = ap_per_class(tp, conf, pcls, tcls)
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
