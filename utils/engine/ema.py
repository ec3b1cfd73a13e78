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
    def update(self, model: nn.Module, finite: torch.Tensor | None = None) -> None:
        """One step of the average. With `finite` (a bool tensor on the device: was the optimizer step taken?)
        the update happens on the device whatever its value (weight 0 when it was not), so the host never waits
        for the GPU to learn whether a step was skipped; the count of updates then lives on the device too."""
        (floats_e, floats_m), (others_e, others_m) = self._pairs(model)
        floats_m = [m if m.dtype == torch.float32 else m.float() for m in floats_m]
        if finite is None:
            torch._foreach_copy_(others_e, others_m)  # e.g. BatchNorm's num_batches_tracked
            self.updates += 1
            torch._foreach_lerp_(floats_e, floats_m, 1.0 - self.current_decay())  # e = d*e + (1-d)*m
            return
        if others_e:  # copied where the step was taken: e += (m - e) * finite
            torch._foreach_add_(others_e, torch._foreach_mul(torch._foreach_sub(others_m, others_e), finite.long()))
        count = self._device_count(finite.device) + finite
        self._count = count
        d = self.decay * (1 - torch.exp(-count.double() / self.tau))
        torch._foreach_lerp_(floats_e, floats_m, torch.where(finite, 1.0 - d, 0.0).float())

    def _pairs(self, model: nn.Module) -> tuple[tuple[list, list], tuple[list, list]]:
        """(EMA, model) tensors, floating-point and other, matched by name once per model: a state_dict() per
        step would dispatch a detach for every tensor, three times over, which on a GPU is host time per step."""
        m = de_parallel(model)
        if getattr(self, "_source", None) is not m:
            src, own = m.state_dict(keep_vars=True), self.ema.state_dict(keep_vars=True)
            floats = [k for k, v in own.items() if v.is_floating_point()]
            others = [k for k, v in own.items() if not v.is_floating_point()]
            self._source = m
            self._matched = (([own[k] for k in floats], [src[k] for k in floats]),
                             ([own[k] for k in others], [src[k] for k in others]))
        return self._matched

    def _device_count(self, device: torch.device) -> torch.Tensor:
        count = getattr(self, "_count", None)
        if count is None or count.device != device:
            count = torch.tensor(self._updates, device=device, dtype=torch.int64)
        return count

    @property
    def updates(self) -> int:
        """Optimizer steps averaged so far (a host read when the count lives on the device)."""
        count = getattr(self, "_count", None)
        return int(count) if count is not None else self._updates

    @updates.setter
    def updates(self, value: int) -> None:
        self._updates, self._count = int(value), None

    def state_dict(self) -> dict:
        return {"ema": {k: v.detach().cpu().clone() for k, v in self.ema.state_dict().items()}, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state["ema"])
        self.updates = int(state["updates"])
