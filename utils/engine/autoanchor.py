"""AutoAnchor: fit the Detect layer's anchors to a dataset's boxes before training, as YOLOv5 does.

A target is matched to an anchor when neither side differs by more than anchor_t (4x) between them.
Two figures say how well a set of anchors suits the data, for the boxes at the training size:

- best possible recall (BPR): the share of boxes that at least one anchor can match;
- anchors above threshold (AAT): how many anchors can match a box, on average.

If BPR is under 0.98, new anchors come from k-means on the boxes' width/height (whitened, k-means++
start), refined by a genetic search that mutates them and keeps a mutation when it raises the fitness
(the mean of each box's best ratio metric, counting only matches within anchor_t). They replace the
model's anchors only if their BPR is higher. The anchors are a buffer of the model, so they travel in
every checkpoint; a resumed run takes them from last.pt and never recomputes them.

Deterministic: every random draw comes from a generator seeded with the run's --seed, and no global
RNG is touched, so exact resume and seeded reruns are unaffected.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

LOGGER = logging.getLogger(__name__)
BPR_TARGET = 0.98  # below this the anchors are recomputed
MIN_BOX_PX = 2.0  # boxes smaller than this (at the training size) are left out of the k-means fit
GENERATIONS = 1000
MAX_BOXES = 30000  # boxes sampled for the fit; the figures use every box


@dataclass(frozen=True)
class AnchorFit:
    bpr: float
    aat: float


def label_wh(shapes: np.ndarray, labels: list[np.ndarray], imgsz: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 2) box sizes in pixels at the training size: each image's long side scaled to imgsz, times a
    random 0.9-1.1 (the scale augmentation's middle)."""
    shapes = np.asarray(shapes, dtype=np.float64).reshape(-1, 2)  # (w, h) per image
    sizes = imgsz * shapes / shapes.max(1, keepdims=True)
    scale = rng.uniform(0.9, 1.1, size=(len(shapes), 1))
    wh = [l[:, 3:5] * s for s, l in zip(sizes * scale, labels) if len(l)]
    return np.concatenate(wh, 0).astype(np.float64) if wh else np.zeros((0, 2))


def ratio_metric(wh: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """(n, k): for each box and anchor, min over width and height of min(r, 1/r); 1 is a perfect fit."""
    r = wh[:, None] / anchors[None]
    return np.minimum(r, 1 / r).min(2)


def fit(wh: np.ndarray, anchors: np.ndarray, anchor_t: float) -> AnchorFit:
    if len(wh) == 0:
        return AnchorFit(1.0, float(len(anchors)))
    x = ratio_metric(wh, anchors)
    return AnchorFit(float((x.max(1) > 1 / anchor_t).mean()), float((x > 1 / anchor_t).sum(1).mean()))


def fitness(wh: np.ndarray, anchors: np.ndarray, anchor_t: float) -> float:
    best = ratio_metric(wh, anchors).max(1)
    return float((best * (best > 1 / anchor_t)).mean())


def kmeans(x: np.ndarray, k: int, rng: np.random.Generator, iters: int = 30) -> np.ndarray:
    """Lloyd's k-means with a k-means++ start; returns k centres (fewer distinct points than k: repeats)."""
    centres = [x[rng.integers(len(x))]]
    for _ in range(1, k):
        d = ((x[:, None] - np.asarray(centres)[None]) ** 2).sum(2).min(1)
        total = d.sum()
        centres.append(x[rng.choice(len(x), p=d / total)] if total > 0 else x[rng.integers(len(x))])
    c = np.asarray(centres, dtype=np.float64)
    for _ in range(iters):
        assign = ((x[:, None] - c[None]) ** 2).sum(2).argmin(1)
        new = np.array([x[assign == j].mean(0) if (assign == j).any() else c[j] for j in range(k)])
        if np.allclose(new, c):
            break
        c = new
    return c


def evolve_anchors(wh: np.ndarray, n: int, anchor_t: float, rng: np.random.Generator,
                   generations: int = GENERATIONS) -> np.ndarray:
    """n anchors (pixels, sorted by area) for the boxes wh: k-means, then a genetic refinement."""
    fit_wh = wh[(wh >= MIN_BOX_PX).all(1)]
    if len(fit_wh) > MAX_BOXES:
        fit_wh = fit_wh[rng.choice(len(fit_wh), MAX_BOXES, replace=False)]
    if len(fit_wh) < n:  # too few boxes for k-means: spread the few there are
        fit_wh = np.concatenate([fit_wh] * (n // max(len(fit_wh), 1) + 1))[: max(n, len(fit_wh))]
    std = fit_wh.std(0)
    std[std == 0] = 1.0
    anchors = kmeans(fit_wh / std, n, rng) * std
    best = fitness(fit_wh, anchors, anchor_t)
    for _ in range(generations):
        mutation = np.ones_like(anchors)
        while (mutation == 1).all():  # mutate until something changes (probability 0.9 per value)
            mutation = ((rng.random(anchors.shape) < 0.9) * rng.random() * rng.standard_normal(anchors.shape)
                        * 0.1 + 1).clip(0.3, 3.0)
        candidate = (anchors * mutation).clip(min=2.0)
        f = fitness(fit_wh, candidate, anchor_t)
        if f > best:
            best, anchors = f, candidate
    return anchors[np.argsort(anchors.prod(1))]


@torch.no_grad()
def check_anchors(model: nn.Module, shapes: np.ndarray, labels: list[np.ndarray], imgsz: int, anchor_t: float,
                  seed: int) -> tuple[AnchorFit, AnchorFit | None]:
    """Report how the model's anchors fit the data and replace them when BPR < BPR_TARGET.
    Returns (fit before, fit after or None when the anchors were kept)."""
    det = model.model[-1]
    rng = np.random.default_rng(seed)
    wh = label_wh(shapes, labels, imgsz, rng)
    stride = det.stride.to(det.anchors.device).view(-1, 1, 1)
    current = (det.anchors * stride).view(-1, 2).cpu().double().numpy()  # pixels
    before = fit(wh, current, anchor_t)
    if len(wh) == 0:
        LOGGER.info("AutoAnchor: no boxes to fit the anchors to; they are kept")
        return before, None
    message = f"AutoAnchor: {before.aat:.2f} anchors/target, best possible recall {before.bpr:.4f}"
    if before.bpr >= BPR_TARGET:
        LOGGER.info(f"{message}: the anchors fit the dataset")
        return before, None
    LOGGER.info(f"{message}: below {BPR_TARGET}, fitting new anchors to {len(wh)} boxes")
    new = evolve_anchors(wh, len(current), anchor_t, rng)
    after = fit(wh, new, anchor_t)
    if after.bpr <= before.bpr:
        LOGGER.info(f"AutoAnchor: new anchors reach recall {after.bpr:.4f}, no better; keeping the original ones")
        return before, None
    det.anchors.copy_(torch.from_numpy(new).float().view_as(det.anchors).to(det.anchors.device) / stride)
    LOGGER.info(f"AutoAnchor: new anchors {np.round(new).astype(int).tolist()}: {after.aat:.2f} anchors/target, "
                f"best possible recall {after.bpr:.4f}; saved in the model (and so in every checkpoint)")
    return before, after
