"""--multi-scale: each training batch at a random size in [0.5, 1.5] x imgsz, a multiple of the stride.

The size of a batch is a pure function of (seed, epoch, step): a fresh torch.Generator is seeded from
those three numbers for every draw. So a run is reproducible under --seed, a resumed run draws the same
sizes as an uninterrupted one without any RNG state in the checkpoint, and every DDP rank computes the
same size for the same step without communicating (they share the seed, epoch and step).
Validation stays at imgsz: only the training loop calls this.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SCALE_RANGE = (0.5, 1.5)
_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads (seed, epoch, step) over the generator's seed space
_MASK = (1 << 63) - 1  # torch.Generator.manual_seed accepts up to 2**64 - 1; stay well inside


def step_generator(seed: int, epoch: int, step: int) -> torch.Generator:
    """A CPU generator whose state depends only on (seed, epoch, step)."""
    key = 0
    for part in (int(seed), int(epoch), int(step)):
        key = ((key ^ (part & _MASK)) * _MIX + 0x632BE59BD9B4E019) & _MASK
    return torch.Generator().manual_seed(key)


def size_range(imgsz: int, stride: int) -> tuple[int, int]:
    """(smallest, largest) size multi-scale can pick: 0.5 x imgsz rounded up and 1.5 x imgsz rounded down to
    the stride, never below one stride."""
    if imgsz < 1 or stride < 1:
        raise ValueError(f"imgsz {imgsz} and stride {stride} must be positive")
    lo = max(math.ceil(imgsz * SCALE_RANGE[0] / stride), 1) * stride
    hi = max(math.floor(imgsz * SCALE_RANGE[1] / stride) * stride, lo)
    return lo, hi


def multi_scale_size(imgsz: int, stride: int, generator: torch.Generator) -> int:
    """A size drawn uniformly from the stride multiples in [0.5, 1.5] x imgsz (see size_range)."""
    lo, hi = size_range(imgsz, stride)
    k = int(torch.randint(lo // stride, hi // stride + 1, (1,), generator=generator))
    return k * stride


def size_for_step(imgsz: int, stride: int, seed: int, epoch: int, step: int) -> int:
    """multi_scale_size for one training step: the call train.py makes (same on every rank, resume-exact)."""
    return multi_scale_size(imgsz, stride, step_generator(seed, epoch, step))


def rescale_batch(imgs: torch.Tensor, size: int, stride: int = 32) -> torch.Tensor:
    """Resize a (B, C, H, W) batch so its longer side is `size` (bilinear); the shorter side is scaled by the
    same factor and rounded up to a multiple of `stride` (a rectangular batch stays a valid model input).
    Targets are normalised to the image, so they need no change. uint8 batches stay uint8."""
    if imgs.ndim != 4:
        raise ValueError(f"rescale_batch needs a (B, C, H, W) batch, got shape {tuple(imgs.shape)}")
    h, w = imgs.shape[-2:]
    gain = size / max(h, w)
    new = [math.ceil(x * gain / stride) * stride for x in (h, w)]
    if new == [h, w]:
        return imgs
    x = imgs if imgs.is_floating_point() else imgs.float()
    out = F.interpolate(x, size=new, mode="bilinear", align_corners=False)
    if not imgs.is_floating_point():
        out = out.round_().clamp_(0, 255).to(imgs.dtype)
    return out
