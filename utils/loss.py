"""ComputeLoss: YOLOv5's objective (CIoU box loss, BCE objectness and class losses) in FP32.

Box assignment, IoU and the losses run in FP32 even when the forward pass ran under autocast: the
raw maps are cast up first, because bf16/fp16 rounding in IoU and log-sigmoid terms is large
relative to the gradients that matter late in training.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from utils.dist import de_parallel

# Objectness weight per level (P3, P4, P5): small objects are many and hard, so P3 counts most.
LEVEL_BALANCE = (4.0, 1.0, 0.4)
# A target is also assigned to the 2 neighbouring cells nearest to its centre (YOLOv5's offsets).
_NEIGHBOURS = torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], dtype=torch.float32)


def bbox_ciou(box1: torch.Tensor, box2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Complete IoU of matching rows of two (n, 4) cx,cy,w,h tensors (Zheng et al., 2020)."""
    (x1, y1, w1, h1), (x2, y2, w2, h2) = box1.unbind(-1), box2.unbind(-1)
    b1x1, b1x2, b1y1, b1y2 = x1 - w1 / 2, x1 + w1 / 2, y1 - h1 / 2, y1 + h1 / 2
    b2x1, b2x2, b2y1, b2y2 = x2 - w2 / 2, x2 + w2 / 2, y2 - h2 / 2, y2 + h2 / 2
    inter = (torch.min(b1x2, b2x2) - torch.max(b1x1, b2x1)).clamp(0) * (torch.min(b1y2, b2y2) - torch.max(b1y1, b2y1)).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
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
    """

    def __init__(self, model: nn.Module, hyp: dict, label_smoothing: float = 0.0):
        det = de_parallel(model).model[-1]
        self.na, self.nc, self.nl = det.na, det.nc, det.nl
        self.det = det  # anchors are read from it at each call: AutoAnchor or a resume may replace them
        self.hyp = dict(hyp)
        device = det.anchors.device
        self.bce_cls = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([hyp["cls_pw"]], device=device))
        self.bce_obj = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([hyp["obj_pw"]], device=device))
        self.cls_pos, self.cls_neg = 1.0 - 0.5 * label_smoothing, 0.5 * label_smoothing
        self.balance = LEVEL_BALANCE if self.nl == 3 else (4.0, 1.0, 0.25, 0.06, 0.02)[: self.nl]
        self.last_positives = 0

    @property
    def anchors(self) -> torch.Tensor:
        """(nl, na, 2) in grid units, FP32."""
        return self.det.anchors.detach().float()

    def __call__(self, preds: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        preds = [p.float() for p in preds]
        device = preds[0].device
        lbox, lobj, lcls = (torch.zeros((), device=device) for _ in range(3))
        assigned = self.build_targets(preds, targets)
        self.last_positives = sum(len(b) for b, *_ in assigned[0])  # anchor cells assigned (utils/diagnostics.py)
        for i, (p, (b, a, gj, gi), tbox, tcls) in enumerate(zip(preds, *assigned)):
            tobj = torch.zeros(p.shape[:4], device=device)
            if b.numel():
                pxy, pwh, _, pcls = p[b, a, gj, gi].split((2, 2, 1, self.nc), 1)
                pxy = pxy.sigmoid() * 2 - 0.5
                pwh = (pwh.sigmoid() * 2) ** 2 * self.anchors[i][a]
                iou = bbox_ciou(torch.cat((pxy, pwh), 1), tbox)
                lbox = lbox + (1.0 - iou).mean()
                # objectness target = IoU of the prediction; where several targets share a cell the
                # best-overlapping one is written last and wins
                score = iou.detach().clamp(0)
                order = score.argsort()
                tobj[b[order], a[order], gj[order], gi[order]] = score[order]
                if self.nc > 1:
                    t = torch.full_like(pcls, self.cls_neg)
                    t[torch.arange(len(tcls), device=device), tcls] = self.cls_pos
                    lcls = lcls + self.bce_cls(pcls, t)
            lobj = lobj + self.bce_obj(p[..., 4], tobj) * self.balance[i]
        lbox, lobj, lcls = lbox * self.hyp["box"], lobj * self.hyp["obj"], lcls * self.hyp["cls"]
        bs = preds[0].shape[0]
        return (lbox + lobj + lcls) * bs, torch.stack((lbox, lobj, lcls)).detach()

    def build_targets(self, preds: list[torch.Tensor], targets: torch.Tensor):
        """Assign each target to anchors whose shape ratio is within anchor_t, at its cell and 2 neighbours."""
        device = targets.device
        targets = targets.float()
        nt = targets.shape[0]
        anchor_idx = torch.arange(self.na, device=device, dtype=torch.float32).view(self.na, 1).expand(self.na, nt)
        t_all = torch.cat((targets.unsqueeze(0).expand(self.na, nt, 6), anchor_idx[..., None]), 2)  # (na, nt, 7)
        offsets = _NEIGHBOURS.to(device) * 0.5
        indices, tboxes, tclasses = [], [], []
        for i, p in enumerate(preds):
            ny, nx = p.shape[2:4]
            anchors = self.anchors[i].to(device)
            scale = torch.tensor([1, 1, nx, ny, nx, ny, 1], device=device, dtype=torch.float32)
            t = t_all * scale
            if nt:
                ratio = t[..., 4:6] / anchors[:, None]
                t = t[torch.max(ratio, 1 / ratio).max(2)[0] < self.hyp["anchor_t"]]
                gxy = t[:, 2:4]
                gxy_inv = scale[[2, 3]] - gxy
                left, up = ((gxy % 1 < 0.5) & (gxy > 1)).T
                right, down = ((gxy_inv % 1 < 0.5) & (gxy_inv > 1)).T
                keep = torch.stack((torch.ones_like(left), left, up, right, down))
                t = t.repeat((5, 1, 1))[keep]
                off = (torch.zeros_like(gxy)[None] + offsets[:, None])[keep]
            else:
                t, off = t_all[0], torch.zeros((0, 2), device=device)
            b, c = t[:, :2].long().T
            gxy, gwh, a = t[:, 2:4], t[:, 4:6], t[:, 6].long()
            gij = (gxy - off).long()
            gi, gj = gij[:, 0].clamp_(0, nx - 1), gij[:, 1].clamp_(0, ny - 1)
            indices.append((b, a, gj, gi))
            tboxes.append(torch.cat((gxy - torch.stack((gi, gj), 1), gwh), 1))
            tclasses.append(c)
        return indices, tboxes, tclasses


def loss_gains(hyp: dict, nl: int, nc: int, imgsz: int, cls_by_nc: bool = True, box_gain: float = 1.0) -> dict:
    """A copy of hyp with the box/obj/cls gains scaled for level count, class count and image size.

    The class BCE is a mean over nc logits, so cls_by_nc (YOLOv5's rule, tuned at 80 classes) keeps each
    logit's gradient the same at any nc; without it the gain stays as at 80 classes and few-class data
    learns its classes faster (train.py's short-schedule recipe, utils/optim.choose_recipe, which
    also multiplies the box gain by `box_gain`)."""
    out = dict(hyp)
    out["box"] = hyp["box"] * box_gain * 3 / nl
    out["cls"] = hyp["cls"] * (nc / 80 if cls_by_nc else 1.0) * 3 / nl
    out["obj"] = hyp["obj"] * (imgsz / 640) ** 2 * 3 / nl
    return out
