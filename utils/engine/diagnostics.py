"""Per-epoch training diagnostics: train.py writes them to diagnostics.csv beside results.csv.

What a stalled run looks like from inside: how many anchor cells each target is assigned to, the
gradient norm of each parameter group before clipping, how often clipping cut the step, and where
the Detect layer's biases sit (the objectness biases are the priors that decide whether anything is
detected at all). The robust-training issue's stall was found with these columns; they cost a few
norms per step and a read of the head's biases per epoch. The norms stay on the device until the epoch's row
is written: reading them per step would make the host wait for the GPU at every step.
"""
from __future__ import annotations

import math

import torch
from torch import nn


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
        self.norms: list[torch.Tensor] = []  # per step, the (3,) group norms, on the device

    def add_batch(self, positives: int, targets: int) -> None:
        self.positives += positives
        self.targets += targets

    def add_step(self, group_norms: torch.Tensor, max_norm: float) -> None:
        """One optimizer step's gradient norm per parameter group (group_grad_norms), kept on its device."""
        self.norms.append(group_norms.detach())
        self.max_norm = max_norm

    def row(self, epoch: int, model: nn.Module) -> list:
        steps = len(self.norms)
        norms = torch.stack(self.norms).double().cpu() if steps else torch.zeros(0, 3, dtype=torch.float64)
        total = norms.square().sum(1).sqrt()
        finite = norms[torch.isfinite(norms).all(1)]
        means = finite.mean(0).tolist() if len(finite) else [float("nan")] * 3
        peak = float(total[torch.isfinite(total)].max()) if torch.isfinite(total).any() else float("nan")
        clipped = int((total > getattr(self, "max_norm", math.inf)).sum())
        return [epoch, self.positives / max(self.targets, 1), *means[:3], peak, clipped / max(steps, 1),
                *head_biases(model)]


def group_grad_norms(optimizer: torch.optim.Optimizer, kinds: int = 3) -> torch.Tensor:
    """The L2 norm of the gradients (after unscaling, before clipping) of each kind of parameter group: weights,
    normalisation weights, biases (utils/engine/optim.build_optimizer's groups; group j is kind j % kinds), as one
    (kinds,) tensor on the gradients' device: no host read."""
    grads: list[list[torch.Tensor]] = [[] for _ in range(kinds)]
    for j, g in enumerate(optimizer.param_groups):
        grads[j % kinds] += [p.grad for p in g["params"] if p.grad is not None]
    out = [torch.linalg.vector_norm(torch.stack(torch._foreach_norm(gs))) if gs else None for gs in grads]
    device = next((n.device for n in out if n is not None), torch.device("cpu"))
    return torch.stack([n.float() if n is not None else torch.zeros((), device=device) for n in out])


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
