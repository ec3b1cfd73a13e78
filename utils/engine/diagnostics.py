"""Per-epoch training diagnostics: train.py writes them to diagnostics.csv beside results.csv.

What a stalled run looks like from inside: how many anchor cells each target is assigned to, the
gradient norm of each parameter group before clipping, how often clipping cut the step, and where
the Detect layer's biases sit (the objectness biases are the priors that decide whether anything is
detected at all). The robust-training issue's stall was found with these columns; they cost a few
norms per step and a read of the head's biases per epoch.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from utils.errors import UserError

COLUMNS = ("epoch", "positives_per_target", "grad_norm_weights", "grad_norm_norms", "grad_norm_biases",
           "grad_norm_max", "clipped_share", "obj_bias_p3", "obj_bias_p4", "obj_bias_p5", "cls_bias_mean",
           "bn_bias_abs_mean")


class EpochDiagnostics:
    """Collects one epoch's figures from the loss and the updater, then writes them as one row."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.positives = 0
        self.targets = 0
        self.norms: list[list[float]] = []
        self.clipped = 0

    def add_batch(self, positives: int, targets: int) -> None:
        self.positives += positives
        self.targets += targets

    def add_step(self, group_norms: list[float], max_norm: float) -> None:
        self.norms.append(group_norms)
        total = math.sqrt(sum(n * n for n in group_norms))
        self.clipped += total > max_norm

    def row(self, epoch: int, model: nn.Module) -> list:
        steps = len(self.norms)
        finite = [n for n in self.norms if all(map(math.isfinite, n))]
        means = [sum(col) / len(finite) for col in zip(*finite)] if finite else [float("nan")] * 3
        peak = max((math.sqrt(sum(x * x for x in n)) for n in finite), default=float("nan"))
        return [epoch, self.positives / max(self.targets, 1), *means[:3], peak, self.clipped / max(steps, 1),
                *head_biases(model)]


@torch.no_grad()
def head_biases(model: nn.Module) -> list[float]:
    """Mean objectness bias per level (3 values, NaN where a level is missing), mean class bias, and the
    mean |shift| of every BatchNorm layer."""
    det = model.model[-1]
    obj, cls = [], []
    for conv in det.m:
        b = conv.bias.detach().float().view(det.na, -1)
        obj.append(float(b[:, 4].mean()))
        cls.append(b[:, 5:].mean())
    obj = (obj + [float("nan")] * 3)[:3]
    bn = [m.bias.detach().float().abs().mean() for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    bn_mean = float(torch.stack(bn).mean()) if bn else float("nan")
    return [*obj, float(torch.stack(cls).mean()), bn_mean]


def group_grad_norms(optimizer: torch.optim.Optimizer) -> list[float]:
    """The L2 norm of each parameter group's gradients (after unscaling, before clipping)."""
    out = []
    for g in optimizer.param_groups:
        grads = [p.grad for p in g["params"] if p.grad is not None]
        out.append(float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))) if grads else 0.0)
    return out
