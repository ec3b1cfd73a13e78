"""ComputeLoss: YOLOv5's objective (CIoU box loss, BCE objectness and class losses) in FP32.

Box assignment, IoU and the losses run in FP32 even when the forward pass ran under autocast: the
raw maps are cast up first, because bf16/fp16 rounding in IoU and log-sigmoid terms is large
relative to the gradients that matter late in training.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn

from utils.engine.dist import de_parallel
from utils.hyp import Hyp

# Objectness weight per level (P3, P4, P5): small objects are many and hard, so P3 counts most.
LEVEL_BALANCE = (4.0, 1.0, 0.4)
# A target is also assigned to the 2 neighbouring cells nearest to its centre (YOLOv5's offsets); the
# dynamic assignment also considers the diagonal cell between those two, the fourth cell whose predicted
# centre (-0.5 to 1.5 cells from the cell's corner) can reach the target's.
_NEIGHBOURS = torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1], [1, 1], [1, -1], [-1, 1], [-1, -1]],
                           dtype=torch.float32)
# The dynamic assignment ranks a target's candidates by class score ** ALIGN_ALPHA * IoU ** ALIGN_BETA
# (the task-aligned metric of Feng et al., 2021, with Ultralytics' exponents).
ALIGN_ALPHA, ALIGN_BETA = 0.5, 6.0


def bbox_ciou(box1: torch.Tensor, box2: torch.Tensor, eps: float = 1e-7, plain: bool = False) -> torch.Tensor:
    """Complete IoU of matching rows of two (n, 4) cx,cy,w,h tensors (Zheng et al., 2020); plain IoU if `plain`."""
    (x1, y1, w1, h1), (x2, y2, w2, h2) = box1.unbind(-1), box2.unbind(-1)
    b1x1, b1x2, b1y1, b1y2 = x1 - w1 / 2, x1 + w1 / 2, y1 - h1 / 2, y1 + h1 / 2
    b2x1, b2x2, b2y1, b2y2 = x2 - w2 / 2, x2 + w2 / 2, y2 - h2 / 2, y2 + h2 / 2
    inter = (torch.min(b1x2, b2x2) - torch.max(b1x1, b2x1)).clamp(0) * (torch.min(b1y2, b2y2) - torch.max(b1y1, b2y1)).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    if plain:
        return iou
    cw = torch.max(b1x2, b2x2) - torch.min(b1x1, b2x1)  # enclosing box
    ch = torch.max(b1y2, b2y2) - torch.min(b1y1, b2y1)
    c2 = cw**2 + ch**2 + eps
    rho2 = (x2 - x1) ** 2 + (y2 - y1) ** 2
    v = (4 / math.pi**2) * (torch.atan(w2 / (h2 + eps)) - torch.atan(w1 / (h1 + eps))) ** 2
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


class ComputeLoss:
    """Callable (raw_outputs, targets) -> (loss scaled by batch size, detached tensor(3) box/obj/cls).

    `hyp` gains are used as given; `loss_gains()` derives the level/size/class-count scaling that
    train.py applies once, so this object never edits the caller's hyperparameters.

    Assignment is YOLOv5's by default: every anchor within anchor_t of a target's shape, at the target's
    cell and its 2 nearest neighbours. The optional hyp `assign_topk` k > 0 makes it dynamic: of the
    anchors that can reach the target (within anchor_t, at the 4 cells nearest its centre), the k whose
    current predictions align best with it (class score and IoU, ALIGN_ALPHA/ALIGN_BETA) become its
    positives; with `assign_soft: 1` their class target is also that alignment, scaled so the target's
    best positive gets its best IoU (Ultralytics' task-aligned target), instead of 1. Measured against
    YOLOv5's assignment (bench/fidelity.py fp32-tal, fp32-tal-soft; k = 10, seed 0), both lost on both
    real-image sets, so it is off by default (docs/recipe.md).
    """

    def __init__(self, model: nn.Module, hyp: Hyp, label_smoothing: float = 0.0):
        det = de_parallel(model).model[-1]
        self.na, self.nc, self.nl = det.na, det.nc, det.nl
        self.det = det  # anchors are read from it at each call: AutoAnchor or a resume may replace them
        self.hyp = hyp
        device = det.anchors.device
        self.bce_cls = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([hyp.cls_pw], device=device))
        self.bce_obj = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([hyp.obj_pw], device=device))
        self.cls_pos, self.cls_neg = 1.0 - 0.5 * label_smoothing, 0.5 * label_smoothing
        self.balance = LEVEL_BALANCE if self.nl == 3 else (4.0, 1.0, 0.25, 0.06, 0.02)[: self.nl]
        self.topk = hyp.assign_topk
        self.soft = hyp.assign_soft and self.topk > 0
        self.last_positives = 0

    @property
    def anchors(self) -> torch.Tensor:
        """(nl, na, 2) in grid units, FP32."""
        return self.det.anchors.detach().float()

    def decode(self, p: torch.Tensor, level: int, a: torch.Tensor) -> torch.Tensor:
        """(n, 4) cx,cy,w,h in grid units relative to each row's cell corner, from its raw (n, >=4) outputs."""
        pxy = p[:, :2].sigmoid() * 2 - 0.5
        pwh = (p[:, 2:4].sigmoid() * 2) ** 2 * self.anchors[level][a]
        return torch.cat((pxy, pwh), 1)

    def __call__(self, preds: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        preds = [p.float() for p in preds]
        device = preds[0].device
        lbox, lobj, lcls = (torch.zeros((), device=device) for _ in range(3))
        if self.topk:
            *assigned, soft = self.assign_dynamic(preds, targets)
        else:
            assigned, soft = self.build_targets(preds, targets), [None] * self.nl
        self.last_positives = sum(len(b) for b, *_ in assigned[0])  # anchor cells assigned (utils/engine/diagnostics.py)
        for i, (p, (b, a, gj, gi), tbox, tcls, tsoft) in enumerate(zip(preds, *assigned, soft)):
            tobj = torch.zeros(p.shape[:4], device=device)
            if b.numel():
                ps = p[b, a, gj, gi]
                iou = bbox_ciou(self.decode(ps, i, a), tbox)
                lbox = lbox + (1.0 - iou).mean()
                # objectness target = IoU of the prediction; where several targets share a cell the
                # best-overlapping one is written last and wins
                score = iou.detach().clamp(0)
                order = score.argsort()
                tobj[b[order], a[order], gj[order], gi[order]] = score[order]
                if self.nc > 1:
                    pcls = ps[:, 5:]
                    t = torch.full_like(pcls, self.cls_neg)
                    rows = torch.arange(len(tcls), device=device)
                    t[rows, tcls] = self.cls_pos if tsoft is None else (tsoft * self.cls_pos).clamp(min=self.cls_neg)
                    lcls = lcls + self.bce_cls(pcls, t)
            lobj = lobj + self.bce_obj(p[..., 4], tobj) * self.balance[i]
        lbox, lobj, lcls = lbox * self.hyp.box, lobj * self.hyp.obj, lcls * self.hyp.cls
        bs = preds[0].shape[0]
        return (lbox + lobj + lcls) * bs, torch.stack((lbox, lobj, lcls)).detach()

    def build_targets(self, preds: list[torch.Tensor], targets: torch.Tensor):
        """Assign each target to anchors whose shape ratio is within anchor_t, at its cell and 2 neighbours."""
        return self.match(preds, targets, diagonal=False)[:3]

    def match(self, preds: list[torch.Tensor], targets: torch.Tensor, diagonal: bool):
        """Per level: (b, a, gj, gi) of the anchors within anchor_t of each target's shape at its cell and
        its 2 nearest neighbours (and the diagonal between them if `diagonal`), the target box (cx, cy
        relative to that cell, w, h; grid units), its class and its row in `targets`."""
        device = targets.device
        targets = targets.float()
        nt = targets.shape[0]
        anchor_idx = torch.arange(self.na, device=device, dtype=torch.float32).view(self.na, 1).expand(self.na, nt)
        target_idx = torch.arange(nt, device=device, dtype=torch.float32).view(1, nt).expand(self.na, nt)
        t_all = torch.cat((targets.unsqueeze(0).expand(self.na, nt, 6), anchor_idx[..., None], target_idx[..., None]), 2)
        offsets = _NEIGHBOURS.to(device) * 0.5
        indices, tboxes, tclasses, tids = [], [], [], []
        for i, p in enumerate(preds):
            ny, nx = p.shape[2:4]
            anchors = self.anchors[i].to(device)
            scale = torch.tensor([1, 1, nx, ny, nx, ny, 1, 1], device=device, dtype=torch.float32)
            t = t_all * scale
            if nt:
                ratio = t[..., 4:6] / anchors[:, None]
                t = t[torch.max(ratio, 1 / ratio).max(2)[0] < self.hyp.anchor_t]
                gxy = t[:, 2:4]
                gxy_inv = scale[[2, 3]] - gxy
                left, up = ((gxy % 1 < 0.5) & (gxy > 1)).T
                right, down = ((gxy_inv % 1 < 0.5) & (gxy_inv > 1)).T
                cells = [torch.ones_like(left), left, up, right, down]
                if diagonal:
                    cells += [left & up, left & down, right & up, right & down]
                keep = torch.stack(cells)
                t = t.repeat((len(cells), 1, 1))[keep]
                off = (torch.zeros_like(gxy)[None] + offsets[: len(cells), None])[keep]
            else:
                t, off = t_all[0], torch.zeros((0, 2), device=device)
            b, c = t[:, :2].long().T
            gxy, gwh, a = t[:, 2:4], t[:, 4:6], t[:, 6].long()
            gij = (gxy - off).long()
            gi, gj = gij[:, 0].clamp_(0, nx - 1), gij[:, 1].clamp_(0, ny - 1)
            indices.append((b, a, gj, gi))
            tboxes.append(torch.cat((gxy - torch.stack((gi, gj), 1), gwh), 1))
            tclasses.append(c)
            tids.append(t[:, 7].long())
        return indices, tboxes, tclasses, tids

    @torch.no_grad()
    def assign_dynamic(self, preds: list[torch.Tensor], targets: torch.Tensor):
        """build_targets' lists cut to each target's `topk` best-aligned reachable anchors (over all levels),
        plus per level the soft class target of each kept anchor (None where assign_soft is off)."""
        indices, tboxes, tclasses, tids = self.match(preds, targets, diagonal=True)
        aligns, ious = [], []
        for i, (p, (b, a, gj, gi), tbox, tcls) in enumerate(zip(preds, indices, tboxes, tclasses)):
            ps = p[b, a, gj, gi]
            iou = bbox_ciou(self.decode(ps, i, a), tbox, plain=True).clamp(0)
            cls = ps[:, 5:].sigmoid().gather(1, tcls[:, None]).squeeze(1) if self.nc > 1 else torch.ones_like(iou)
            aligns.append(cls**ALIGN_ALPHA * iou**ALIGN_BETA)
            ious.append(iou)
        align, iou, tid = torch.cat(aligns), torch.cat(ious), torch.cat(tids)
        nt = targets.shape[0]
        # rank each candidate among its target's: sort by alignment, then (stably) by target
        order = align.argsort(descending=True)
        order = order[tid[order].argsort(stable=True)]
        counts = torch.bincount(tid, minlength=nt)
        first = counts.cumsum(0) - counts
        rank = torch.arange(len(order), device=align.device) - first[tid[order]]
        keep = torch.zeros_like(align, dtype=torch.bool)
        keep[order[rank < self.topk]] = True
        soft = None
        if self.soft:
            best_align = torch.zeros(nt, device=align.device).scatter_reduce(0, tid[keep], align[keep], "amax")
            best_iou = torch.zeros(nt, device=align.device).scatter_reduce(0, tid[keep], iou[keep], "amax")
            soft = align / best_align[tid].clamp(min=1e-9) * best_iou[tid]
        sizes = [len(t) for t in tids]
        keeps = keep.split(sizes)
        softs = soft.split(sizes) if soft is not None else [None] * self.nl
        return ([tuple(x[k] for x in idx) for idx, k in zip(indices, keeps)], [t[k] for t, k in zip(tboxes, keeps)],
                [c[k] for c, k in zip(tclasses, keeps)], [None if s is None else s[k] for s, k in zip(softs, keeps)])


def loss_gains(hyp: Hyp, nl: int, nc: int, imgsz: int, cls_by_nc: bool = True, box_gain: float = 1.0) -> Hyp:
    """A copy of hyp with the box/obj/cls gains scaled for level count, class count and image size.

    The class BCE is a mean over nc logits, so cls_by_nc (YOLOv5's rule, tuned at 80 classes) keeps each
    logit's gradient the same at any nc; without it the gain stays as at 80 classes and few-class data
    learns its classes faster (train.py's short-schedule recipe, utils/engine/optim.choose_recipe, which
    also multiplies the box gain by `box_gain`)."""
    return replace(hyp, box=hyp.box * box_gain * 3 / nl, cls=hyp.cls * (nc / 80 if cls_by_nc else 1.0) * 3 / nl,
                   obj=hyp.obj * (imgsz / 640) ** 2 * 3 / nl)
