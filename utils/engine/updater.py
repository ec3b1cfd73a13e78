"""The one object that performs an optimizer update under AMP: scaled backward, unscale, clip, step, the skip of a
non-finite step, the EMA update."""
from __future__ import annotations

import torch
from torch import nn

from utils.engine.amp import Precision
from utils.engine.diagnostics import EpochDiagnostics, group_grad_norms
from utils.engine.ema import ModelEMA
from utils.engine.optim import MAX_GRAD_NORM


class AmpUpdater:
    """Owns the optimizer update under AMP, for every precision.

    backward() scales the loss (a no-op without fp16); step(), called at effective-batch boundaries
    only, does unscale_ -> clip -> step -> update -> zero_grad -> EMA update. A step whose gradients
    are not finite is skipped and counted, with or without a GradScaler, so a bad batch can never
    reach the weights or the EMA.

    With a fused optimizer (train.py's on CUDA) the whole step stays on the device: the skip is a flag the
    fused kernel reads (`found_inf`, the attribute GradScaler itself hands fused optimizers), the EMA and the
    skip count take the same flag, and nothing waits for the GPU to say whether the step was finite. Otherwise
    the flag is read on the host, as a CPU has nothing to wait for.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
                 ema: ModelEMA | None = None, max_norm: float = MAX_GRAD_NORM, diagnostics: EpochDiagnostics | None = None):
        self.model, self.optimizer, self.ema, self.max_norm = model, optimizer, ema, max_norm
        self.diagnostics = diagnostics
        self.scaler = precision.grad_scaler()
        self.on_device = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
        self._skipped: int | torch.Tensor = 0
        self._params = [p for g in optimizer.param_groups for p in g["params"]]

    @property
    def skipped(self) -> int:
        """Steps skipped for non-finite gradients so far (a host read when the count lives on the device)."""
        return int(self._skipped)

    @skipped.setter
    def skipped(self, value: int) -> None:
        self._skipped = int(value)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self) -> bool | torch.Tensor:
        """One update; returns whether it was applied (a bool tensor on the device with a fused optimizer)."""
        self.scaler.unscale_(self.optimizer)
        if self.diagnostics is not None:
            self.diagnostics.add_step(group_grad_norms(self.optimizer), self.max_norm)
        norm = nn.utils.clip_grad_norm_(self._params, self.max_norm)
        finite = torch.isfinite(norm) if self.on_device else bool(torch.isfinite(norm))
        if self.on_device:
            self._fused_step(finite)
            self._skipped = self._skipped + (~finite).int()
        elif finite:
            self.scaler.step(self.optimizer)
        else:
            self._skipped += 1
        self.scaler.update()  # with a scaler, an overflow lowers the scale for the next step
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None and self.on_device:
            self.ema.update(self.model, finite)  # weight 0 where the step was skipped
        elif self.ema is not None and finite:
            self.ema.update(self.model)
        return finite

    def _fused_step(self, finite: torch.Tensor) -> None:
        """The fused kernel skips the update where found_inf is non-zero; the scaler's own inf check (from
        unscale_) goes in when there is a scaler, our finite flag otherwise (FP32, bf16)."""
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)
            return
        self.optimizer.found_inf = (~finite).float()
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf

    def scale(self) -> float | None:
        """The GradScaler's current loss scale, None without one (bf16, FP32)."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else None

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.skipped = int(state["skipped"])
