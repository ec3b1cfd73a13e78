"""Exponential moving average of model weights, kept in FP32."""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from utils.engine.dist import de_parallel


class ModelEMA:
    """EMA of a model's state, updated after each optimizer step.

    decay ramps up as decay * (1 - exp(-updates / tau)), so early weights (from a random start) are
    forgotten quickly. The copy is FP32 whatever the training precision, and stays in eval mode:
    nobody casts or rounds it; inference makes converted copies.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0):
        self.ema = copy.deepcopy(de_parallel(model)).float().eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = self.current_decay()
        src = de_parallel(model).state_dict()
        floats_e, floats_m = [], []
        for k, v in self.ema.state_dict().items():
            if v.is_floating_point():
                floats_e.append(v)
                floats_m.append(src[k].detach().float())
            else:  # e.g. BatchNorm's num_batches_tracked
                v.copy_(src[k])
        torch._foreach_lerp_(floats_e, floats_m, 1.0 - d)  # e = d*e + (1-d)*m

    def state_dict(self) -> dict:
        return {"ema": {k: v.detach().cpu().clone() for k, v in self.ema.state_dict().items()}, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state["ema"])
        self.updates = int(state["updates"])
