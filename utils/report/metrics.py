"""Detection metrics: box IoU, COCO-style matching and AP, the confusion matrix, and fitness.

AP follows the COCO definition so our numbers agree with pycocotools on the same predictions:
IoU thresholds 0.50:0.05:0.95; predictions matched to labels one-to-one, highest confidence first, each
taking the unmatched same-class label it overlaps most (IoU >= threshold); per class the precision
envelope is sampled at recall 0:0.01:1 (101 points) and averaged; mAP is the mean over classes that
have labels. Everything here is a pure function of its inputs; loops run over images or rounds of
matching, never over single boxes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

# Built exactly as pycocotools builds its grids, so float comparisons (recall >= 0.29...) round the same way.
IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1)
RECALL_THRESHOLDS = np.linspace(0.0, 1.0, int(np.round((1.0 - 0.0) / 0.01)) + 1)
CONF_GRID = np.linspace(0.0, 1.0, 1000)  # thresholds for the P, R and F1 against confidence curves


def box_iou(box1: torch.Tensor, box2: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU (N, M) of xyxy boxes, computed in FP32 (FP64 stays FP64)."""
    box1 = box1 if box1.dtype == torch.float64 else box1.float()
    box2 = box2 if box2.dtype == torch.float64 else box2.float()
    area1 = (box1[:, 2] - box1[:, 0]).clamp(min=0) * (box1[:, 3] - box1[:, 1]).clamp(min=0)
    area2 = (box2[:, 2] - box2[:, 0]).clamp(min=0) * (box2[:, 3] - box2[:, 1]).clamp(min=0)
    lt = torch.max(box1[:, None, :2], box2[None, :, :2])
    rb = torch.min(box1[:, None, 2:4], box2[None, :, 2:4])
    inter = (rb - lt).clamp(min=0).prod(2)
    union = area1[:, None] + area2[None, :] - inter
    # no epsilon in the ratio (COCO has none); only two empty boxes have union 0, and their IoU is 0
    return inter / union.clamp(min=torch.finfo(union.dtype).tiny)


def greedy_match(candidate: torch.Tensor, quality: torch.Tensor) -> torch.Tensor:
    """One-to-one greedy matching, predictions in priority order (row 0 first).

    candidate: (T, n, m) bool, prediction i may match label j under setting t; quality: (n, m), a
    prediction takes its best free candidate (the last one on ties, as pycocotools does). Returns (T, n)
    long: index of the matched label, -1 where unmatched. Equivalent to visiting predictions one by
    one, but done in rounds: a prediction's choice is final once no open prediction ranked above it
    still wants the same label, which holds at least for the top open prediction, so every round
    settles one or more per setting.
    """
    T, n, m = candidate.shape
    open_ = torch.ones((T, n), dtype=torch.bool, device=candidate.device)
    free = torch.ones((T, m), dtype=torch.bool, device=candidate.device)
    assigned = torch.full((T, n), -1, dtype=torch.long, device=candidate.device)
    rank = torch.arange(n, device=candidate.device)
    while True:
        options = candidate & open_[:, :, None] & free[:, None, :]
        open_ &= options.any(2)  # free labels only get fewer: a prediction without options stays unmatched
        if not open_.any():
            return assigned
        q = torch.where(options, quality[None], torch.tensor(-1.0, dtype=quality.dtype))
        best = (m - 1) - q.flip(2).argmax(2)  # (T, n); flip so ties go to the last label
        top = torch.where(options, rank[None, :, None], n).amin(1)  # (T, m) best-ranked open prediction per label
        win = open_ & (top.gather(1, best) == rank[None])
        open_ &= ~win
        t, i = win.nonzero(as_tuple=True)
        assigned[t, i] = best[t, i]
        free[t, best[t, i]] = False


def match_predictions(detections: torch.Tensor, labels: torch.Tensor,
                      iou_thresholds: Sequence[float] = IOU_THRESHOLDS) -> torch.Tensor:
    """(n, T) bool: which detections are true positives at each IoU threshold, as COCOeval decides.

    detections (n, 6) x1, y1, x2, y2, conf, cls; labels (m, 5) cls, x1, y1, x2, y2 in the same pixels.
    """
    n, T = detections.shape[0], len(iou_thresholds)
    correct = torch.zeros((n, T), dtype=torch.bool, device=detections.device)
    if n == 0 or labels.shape[0] == 0:
        return correct
    order = torch.argsort(-detections[:, 4].float(), stable=True)
    det = detections[order]
    # FP32 IoU, compared in FP64 against FP64 thresholds like pycocotools
    iou = box_iou(det[:, :4], labels[:, 1:5]).double()
    same_class = det[:, 5, None] == labels[None, :, 0]
    thr = torch.as_tensor(np.asarray(iou_thresholds, dtype=np.float64), device=iou.device)
    candidate = (iou[None] >= thr[:, None, None]) & same_class[None]
    correct[order] = (greedy_match(candidate, iou) >= 0).T
    return correct


@dataclass
class APResult:
    """Per-class results of `ap_per_class` (K = classes that have labels, in ascending class order)."""

    classes: np.ndarray  # (K,) class indices
    n_labels: np.ndarray  # (K,) labels per class
    ap: np.ndarray  # (K, T) AP per IoU threshold
    p: np.ndarray  # (K,) precision at the confidence of max mean F1
    r: np.ndarray  # (K,) recall there
    f1: np.ndarray  # (K,) F1 there
    conf_thres: float  # that confidence
    p_curve: np.ndarray  # (K, len(CONF_GRID)) precision against confidence threshold
    r_curve: np.ndarray
    f1_curve: np.ndarray
    pr_curve: np.ndarray  # (K, len(RECALL_THRESHOLDS)) interpolated precision at IoU 0.5

    @property
    def ap50(self) -> np.ndarray:
        return self.ap[:, 0]

    @property
    def map50(self) -> float:
        return float(self.ap[:, 0].mean()) if len(self.ap) else 0.0

    @property
    def map(self) -> float:
        return float(self.ap.mean()) if len(self.ap) else 0.0

    @property
    def mp(self) -> float:
        return float(self.p.mean()) if len(self.p) else 0.0

    @property
    def mr(self) -> float:
        return float(self.r.mean()) if len(self.r) else 0.0


def _first_reaching(keys: np.ndarray, queries: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the first key >= query (keys sorted) and whether it lies before the segment end."""
    idx = np.searchsorted(keys, queries, side="left")
    return idx, idx < end


def _min_count_reaching(t: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(K, R) smallest integer m with float(m / n) >= t: recall >= t as pycocotools tests it, in integers."""
    m = np.ceil(t[None, :] * n[:, None]).astype(np.int64)
    m = np.where((m > 0) & ((m - 1) / n[:, None] >= t[None, :]), m - 1, m)
    return np.where(m / n[:, None] < t[None, :], m + 1, m)


def _interpolated_precision(tpc: np.ndarray, prec: np.ndarray, cls_idx: np.ndarray, start: np.ndarray,
                            end: np.ndarray, n_l: np.ndarray) -> np.ndarray:
    """(K, R) COCO-interpolated precision for one IoU threshold; predictions grouped by class, conf descending."""
    # precision envelope: max over this and every later prediction of the same class. Shifting each class
    # down by 2 per class index keeps later classes (precision <= 1) below earlier ones in the running max.
    offset = 2.0 * cls_idx
    env = np.maximum.accumulate((prec - offset)[::-1])[::-1] + offset
    # cumulative TP counts per class as one sorted integer key: class * big + tp
    big = len(tpc) + 2
    keys = cls_idx * big + tpc
    need = _min_count_reaching(RECALL_THRESHOLDS, n_l)
    idx, ok = _first_reaching(keys, np.arange(len(n_l))[:, None] * big + need, end[:, None])
    return np.where(ok, env[np.minimum(idx, max(len(env) - 1, 0))] if len(env) else 0.0, 0.0)


def _conf_curves(tpc50: np.ndarray, conf: np.ndarray, cls_idx: np.ndarray, start: np.ndarray, n_l: np.ndarray):
    """P, R, F1 (K, len(CONF_GRID)) when keeping predictions with conf >= each grid value (IoU 0.5)."""
    K = len(n_l)
    keys = 2.0 * cls_idx - conf  # ascending: classes in order, conf descending within a class
    idx = np.searchsorted(keys, 2.0 * np.arange(K)[:, None] - CONF_GRID[None, :], side="right")
    count = idx - start[:, None]
    tp = np.where(count > 0, tpc50[np.maximum(idx - 1, 0)] if len(tpc50) else 0, 0)
    r = tp / n_l[:, None]
    p = np.where(count > 0, tp / np.maximum(count, 1), 0.0)  # nothing kept: no precision to speak of
    f1 = 2 * p * r / np.maximum(p + r, 1e-16)
    return p, r, f1


def ap_per_class(tp: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, target_cls: np.ndarray) -> APResult:
    """COCO-style AP per class from matched predictions pooled over a dataset.

    tp (N, T) bool from `match_predictions`; conf (N,); pred_cls (N,); target_cls (M,) every label's class.
    Predictions of classes without labels are ignored (COCO skips such categories).
    """
    conf = np.asarray(conf, dtype=np.float64)
    tp = np.asarray(tp, dtype=bool).reshape(len(conf), -1 if len(conf) else np.shape(tp)[-1])
    pred_cls, target_cls = np.asarray(pred_cls).astype(np.int64), np.asarray(target_cls).astype(np.int64)
    classes, n_l = np.unique(target_cls, return_counts=True)
    K, T = len(classes), tp.shape[1]
    if K == 0:
        z = np.zeros((0, len(CONF_GRID)))
        e = np.zeros(0)
        return APResult(classes, n_l, np.zeros((0, T)), e, e, e, 0.0, z, z, z, np.zeros((0, len(RECALL_THRESHOLDS))))
    k = np.searchsorted(classes, pred_cls)
    keep = (k < K) & (classes[np.minimum(k, K - 1)] == pred_cls)
    order = np.lexsort((-conf[keep], k[keep]))  # by class, then confidence descending (stable, like COCO)
    tp, conf, cls_idx = tp[keep][order], conf[keep][order], k[keep][order]
    start = np.searchsorted(cls_idx, np.arange(K), side="left")
    end = np.searchsorted(cls_idx, np.arange(K), side="right")

    csum = np.concatenate([np.zeros((1, T), np.int64), np.cumsum(tp, 0, dtype=np.int64)])
    tpc = csum[1:] - csum[start[cls_idx]]  # TP so far within the class
    n_seen = np.arange(len(cls_idx)) - start[cls_idx] + 1
    prec = tpc / n_seen[:, None]

    q = np.stack([_interpolated_precision(tpc[:, t], prec[:, t], cls_idx, start, end, n_l) for t in range(T)], -1)
    p_c, r_c, f1_c = _conf_curves(tpc[:, 0], conf, cls_idx, start, n_l)
    best = int(np.argmax(f1_c.mean(0)))
    return APResult(
        classes=classes, n_labels=n_l, ap=q.mean(1), p=p_c[:, best], r=r_c[:, best], f1=f1_c[:, best],
        conf_thres=float(CONF_GRID[best]), p_curve=p_c, r_curve=r_c, f1_curve=f1_c, pr_curve=q[:, :, 0],
    )


def fitness(result) -> float:
    """Single number to rank models: 0.1 * mAP@0.5 + 0.9 * mAP@0.5:0.95.

    Takes anything with `map50` and `map` attributes, or a sequence (P, R, mAP@0.5, mAP@0.5:0.95, ...).
    """
    if hasattr(result, "map50") and hasattr(result, "map"):
        map50, map_ = result.map50, result.map
    else:
        map50, map_ = result[2], result[3]
    return 0.1 * float(map50) + 0.9 * float(map_)


class ConfusionMatrix:
    """Counts matrix[predicted, true] over (nc + 1) classes; index nc is background.

    Detections above `conf` are matched one-to-one to labels of any class (highest confidence first,
    each taking its best free label with IoU > iou_thres). A label left unmatched is a miss
    (matrix[nc, true]); a detection left unmatched is a false alarm (matrix[pred, nc]).
    """

    def __init__(self, nc: int, conf: float = 0.25, iou_thres: float = 0.45) -> None:
        self.nc, self.conf, self.iou_thres = nc, conf, iou_thres
        self.matrix = np.zeros((nc + 1, nc + 1), dtype=np.int64)

    def process_batch(self, detections: torch.Tensor | None, labels: torch.Tensor) -> None:
        """Add one image: detections (n, 6) x1, y1, x2, y2, conf, cls; labels (m, 5) cls, x1, y1, x2, y2."""
        gt_cls = labels[:, 0].long().cpu().numpy()
        if detections is None or len(detections) == 0:
            np.add.at(self.matrix, (self.nc, gt_cls), 1)
            return
        det = detections[detections[:, 4] > self.conf]
        det = det[torch.argsort(-det[:, 4].float(), stable=True)]
        det_cls = det[:, 5].long().cpu().numpy()
        if len(labels) and len(det):
            iou = box_iou(det[:, :4], labels[:, 1:5])
            label_of = greedy_match((iou > self.iou_thres)[None], iou)[0].cpu().numpy()
        else:
            label_of = np.full(len(det), -1)
        hit = label_of >= 0
        np.add.at(self.matrix, (det_cls[hit], gt_cls[label_of[hit]]), 1)
        missed = np.ones(len(gt_cls), dtype=bool)
        missed[label_of[hit]] = False
        np.add.at(self.matrix, (self.nc, gt_cls[missed]), 1)
        np.add.at(self.matrix, (det_cls[~hit], self.nc), 1)

    def tp_fp(self) -> tuple[np.ndarray, np.ndarray]:
        """Per class true positives (diagonal) and false positives (row sum minus diagonal), background excluded."""
        tp = self.matrix.diagonal()
        fp = self.matrix.sum(1) - tp
        return tp[:-1], fp[:-1]
