"""The precision policy: every dtype decision in the project is made here.

Training: `resolve_precision` turns `--amp auto|fp16|bf16|off` plus the device into a `Precision`
(autocast dtype, whether a GradScaler is needed). Inference: `inference_dtype` is the one rule that
test.py and detect.py share, and `prepare_inference` applies it.

fp16 on a CPU (`train.py --amp fp16 --device cpu`, `test.py` / `detect.py --half --device cpu`) is
allowed on request, never chosen by default: it runs the CUDA path (fp16 autocast with a live
GradScaler, a `.half()` model) so fp16 numerics can be reproduced without a GPU, at a high price.
"""
from __future__ import annotations

import copy
import logging
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
from torch import nn

from utils.errors import UserError
from utils.hyp import Hyp

LOGGER = logging.getLogger(__name__)

AMP_MODES = ("auto", "fp16", "bf16", "off")
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "off": torch.float32}

# `--amp auto` on a CPU with native bf16 (AVX512-BF16 or AMX) trains in bf16: within 1 point of FP32 on every
# fidelity set over 10 seeds, and faster on most such CPUs (docs/precision.md has the figures).
CPU_AUTO_BF16 = True

# fp16 on a CPU without FP16 arithmetic, against FP32: about 8x for the training step, 30x for inference
# (measured with bench/speed.py; docs/precision.md)
CPU_FP16_TRAIN_SLOWDOWN = 8
CPU_FP16_INFER_SLOWDOWN = 30


@dataclass(frozen=True)
class Precision:
    """How the training step computes: autocast dtype and whether a GradScaler guards it."""

    mode: str  # 'fp16' | 'bf16' | 'off'
    device_type: str  # 'cuda' | 'cpu'
    fp32_warmup: bool = False  # the warmup steps train in FP32, autocast after (bf16 only; hyp fp32_warmup)

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.mode]

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def use_scaler(self) -> bool:
        # bf16 has FP32's exponent range, so gradients do not underflow: only fp16 needs loss scaling
        return self.mode == "fp16"

    def autocast(self, warmup: bool = False) -> AbstractContextManager:
        """The context for a forward pass and its loss; `warmup`: the step is one of the warmup steps."""
        if not self.enabled or (warmup and self.fp32_warmup):
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, enabled=self.use_scaler)

    @property
    def eval_half(self) -> bool | None:
        """The `half` that validation during training passes to test.run: None (the inference rule: FP16 on
        GPUs that handle it), except in an fp16 run on a CPU, which validates on a half copy of the EMA as
        its CUDA counterpart does."""
        return True if (self.mode == "fp16" and self.device_type == "cpu") else None


@lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """True where the CPU computes bf16 in hardware (AVX512-BF16 or AMX); otherwise bf16 is emulated and slow."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def resolve_precision(amp: str, device: torch.device, hyp: Hyp | None = None) -> Precision:
    """Turn `--amp` and the device (and the hyp's fp32_warmup, for bf16) into a Precision, before any AMP check."""
    p = _resolve_mode(amp, device)
    if p.mode == "bf16" and (hyp.fp32_warmup if hyp is not None else Hyp.fp32_warmup):
        return replace(p, fp32_warmup=True)
    return p


def _resolve_mode(amp: str, device: torch.device) -> Precision:
    if amp not in AMP_MODES:
        raise UserError(f"--amp {amp!r} is not valid; use one of {', '.join(AMP_MODES)}")
    dev = device.type
    if amp == "auto":
        if dev == "cuda":
            return Precision("fp16", dev)
        if dev == "cpu" and CPU_AUTO_BF16 and cpu_has_native_bf16():
            return Precision("bf16", dev)
        return Precision("off", dev)
    if amp == "fp16" and dev == "cpu":
        LOGGER.warning(f"warning: --amp fp16 on a CPU: fp16 autocast with a GradScaler as on CUDA, but emulated on "
                       f"most CPUs (about {CPU_FP16_TRAIN_SLOWDOWN}x slower than FP32); meant for reproducing fp16 "
                       f"numerics without a GPU. To train on a CPU use --amp bf16 or --amp off")
    elif amp == "fp16" and dev != "cuda":
        raise UserError(f"--amp fp16 needs a CUDA GPU or the CPU; {dev} is neither: use --amp off")
    if amp == "bf16" and dev == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("--amp bf16: this GPU has no bf16 support; use --amp fp16")
    return Precision(amp, dev)


@torch.no_grad()
def amp_check(model: nn.Module, precision: Precision, imgsz: int = 128) -> bool:
    """Compare the model's FP32 outputs with its autocast outputs on a fixed input.

    Runs on a copy in eval mode, so the caller's model (and its BatchNorm statistics) is untouched.
    Returns True when autocast is safe to use.
    """
    if not precision.enabled:
        return True
    device = next(model.parameters()).device
    m = copy.deepcopy(model).float().eval()
    stride = int(max(getattr(m, "stride", torch.tensor([32])).max(), 32))
    size = max(stride, imgsz // stride * stride)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, size, size, generator=g).to(device)
    ref = _first(m(x)).float()
    with precision.autocast():
        out = _first(m(x)).float()
    if not torch.isfinite(out).all():
        return False
    # boxes are in pixels and scores in 0..1: compare each on its own scale
    box_err = ((out[..., :4] - ref[..., :4]).abs().mean() / ref[..., :4].abs().mean().clamp(min=1e-6)).item()
    score_err = (out[..., 4:] - ref[..., 4:]).abs().max().item()
    return box_err < 0.05 and score_err < 0.1


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


_SLOW_FP16_NAMES = ("GTX 16", "QUADRO T", "T400", "T600", "T1000", "T1200", "T2000")


def inference_dtype(device: torch.device | str, half: bool | None = None, props=None) -> torch.dtype:
    """The dtype inference runs in: FP16 on CUDA GPUs that compute it fast and correctly, else FP32.

    `half=None` applies the rule, `half=False` forces FP32, `half=True` asks for FP16: on a CPU that is a
    truly FP16 model, emulated and slow (a one-time warning says so), for checking FP16 numerics without
    a GPU. `props` stands in for torch.cuda.get_device_properties (for tests).
    """
    device = torch.device(device)
    if device.type == "cpu" and half:
        _warn_once(f"warning: FP16 inference on a CPU: the model runs in FP16 as on a GPU, but emulated on most "
                   f"CPUs (about {CPU_FP16_INFER_SLOWDOWN}x slower than FP32); meant for checking FP16 results "
                   f"without a GPU. Drop --half for speed")
        return torch.float16
    if device.type != "cuda":
        if half:
            raise UserError(f"--half needs a CUDA GPU or the CPU; {device.type} runs inference in FP32 (drop --half)")
        return torch.float32
    if half is False:
        return torch.float32
    props = props if props is not None else torch.cuda.get_device_properties(device)
    name = str(props.name).upper()
    if (props.major, props.minor) < (7, 0):
        reason = f"compute capability {props.major}.{props.minor} < 7.0 has no fast FP16"
    elif any(s in name for s in _SLOW_FP16_NAMES):
        reason = "this card family is known to produce NaN in FP16"
    else:
        return torch.float16
    LOGGER.info(f"{props.name}: {reason}; running inference in FP32")
    return torch.float32


@lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    """Log a warning once per process (live validation asks for the dtype every epoch)."""
    LOGGER.warning(message)


def prepare_inference(model: nn.Module, device: torch.device | str, dtype: torch.dtype, copy_model: bool = False) -> nn.Module:
    """Put a model in inference form: eval mode, on `device`, in `dtype`.

    With copy_model=True the caller's model is never modified (train.py hands its FP32 EMA to test.py):
    it is returned as is when it already matches, otherwise a converted copy is returned.
    """
    device = torch.device(device)
    p = next(model.parameters())
    if copy_model:
        if p.device == device and p.dtype == dtype and not model.training:
            return model
        model = copy.deepcopy(model)
    return model.to(device=device, dtype=dtype).eval()
