"""AutoBatch (--batch-size -1): the largest batch that uses about 60% of the free GPU memory, at most a quarter of
the training set and MAX_BATCH.

A training step (forward + backward under the run's autocast) is profiled at a few batch sizes; the
memory each took is fitted with a line, mem = slope * batch + intercept, and the line is solved for
fraction * free. The arithmetic (fit_batch_size) is a pure function, unit-tested with fake readings;
autobatch() only gathers the readings on CUDA. On CPU there is nothing to measure against: -1 means 16.

With --augment-on device the batch is warped on the GPU before the forward pass, in buffers the profiled step
does not see (about 2 GiB at batch 64 and 640 px, twice that with mixup): their estimate
(utils/data/device_augment.device_augment_bytes) is added to every reading. They are freed before the forward
pass, but CUDA's caching allocator keeps them reserved, and blocks cut to their sizes do not always serve the
activations, so they are counted on top rather than beside the step's peak.
"""
from __future__ import annotations

import copy
import logging
import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from utils.errors import UserError

LOGGER = logging.getLogger(__name__)

DEFAULT_BATCH = 16
PROFILE_BATCHES = (1, 2, 4, 8, 16)
MAX_BATCH = 256  # the largest batch the recipe's scaling with the batch was measured at (utils/engine/optim)
MIN_STEPS_PER_EPOCH = 4  # a batch never takes more than this share of the training set: 1/4
GIB = 2**30


@dataclass(frozen=True)
class BatchFit:
    """The outcome of a fit: the batch size to use and the line that chose it (nan when no line was fitted)."""

    batch_size: int
    slope: float  # bytes per image
    intercept: float  # bytes at batch 0 (model, gradients, workspace)
    fraction: float  # predicted share of the free memory at batch_size (nan without a line)
    message: str  # the one line printed
    fitted: bool  # False: a fallback (too few readings, memory not increasing, ...)


def dataset_cap(n_images: int | None, max_batch: int = MAX_BATCH) -> tuple[int, str]:
    """The largest batch for a training set of n_images: a quarter of it (at least MIN_STEPS_PER_EPOCH optimizer
    steps an epoch), a multiple of 8 where it can be, at most max_batch; and the reason, for the message."""
    if not n_images:
        return max_batch, ""
    cap = n_images // MIN_STEPS_PER_EPOCH
    cap = cap // 8 * 8 if cap >= 8 else max(cap, 1)
    if cap >= max_batch:
        return max_batch, ""
    return cap, f": a quarter of the {n_images} training images, so an epoch takes {MIN_STEPS_PER_EPOCH}+ steps"


def fit_batch_size(batch_sizes: Sequence[int], mem_used: Sequence[float | None], free: float, total: float,
                   fraction: float = 0.6, default: int = DEFAULT_BATCH, max_batch: int = MAX_BATCH,
                   cap_reason: str = "") -> BatchFit:
    """Choose a batch size from profiled memory readings.

    batch_sizes: the sizes profiled; mem_used: bytes one training step took at each (None or nan where it
    ran out of memory); free, total: the device's free and total bytes before profiling. The line fitted
    (least squares) over the successful readings is solved for `fraction * free`; the result is capped below
    the smallest size that ran out of memory and at `max_batch`. Without a usable line (fewer than two
    successful readings, memory not growing with the batch) the answer is `default`, or the largest size that
    was profiled successfully when that is smaller; a line that says even batch 1 exceeds the target gives 1.
    """
    if len(batch_sizes) != len(mem_used):
        raise ValueError(f"{len(batch_sizes)} batch sizes but {len(mem_used)} memory readings")
    if not 0 < fraction < 1:
        raise ValueError(f"fraction {fraction} must be between 0 and 1")
    ok = [(int(b), float(m)) for b, m in zip(batch_sizes, mem_used) if m is not None and math.isfinite(m)]
    oom = [int(b) for b, m in zip(batch_sizes, mem_used) if m is None or not math.isfinite(m)]
    first_oom = min(oom) if oom else None
    largest_ok = max((b for b, _ in ok if first_oom is None or b < first_oom), default=None)
    head = f"AutoBatch: {free / GIB:.2f} GiB free of {total / GIB:.2f} GiB, aiming at {fraction:.0%} of it"

    def fallback(reason: str) -> BatchFit:
        b = default if largest_ok is None else min(default, largest_ok)
        if first_oom is not None and b >= first_oom:
            b = max(first_oom // 2, 1)
        return BatchFit(b, math.nan, math.nan, math.nan, f"{head}; {reason}; using batch size {b}", False)

    if len({b for b, _ in ok}) < 2:
        oom_txt = f" (out of memory at batch {', '.join(map(str, oom))})" if oom else ""
        return fallback(f"fewer than two successful readings{oom_txt}")
    xs, ys = zip(*ok)
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    if slope <= 0:
        return fallback(f"memory did not grow with the batch ({', '.join(f'{b}: {m / GIB:.3f}' for b, m in ok)} GiB)")
    b = math.floor((fraction * free - intercept) / slope)
    notes = []
    if b < 1:
        notes.append(f"the fit leaves no room for a batch of 1 in {fraction:.0%} of the free memory")
        b = 1
    if first_oom is not None and b >= first_oom:
        b = max(largest_ok or 1, 1)
        notes.append(f"capped below batch {first_oom}, which ran out of memory")
    if b > max_batch:
        b = max_batch
        notes.append(f"capped at {max_batch}{cap_reason}")
    share = (slope * b + intercept) / free if free > 0 else math.nan
    msg = (f"{head}; fit mem = {slope / GIB * 1024:.1f} MiB x batch + {intercept / GIB:.3f} GiB "
           f"(batches {', '.join(map(str, xs))}); batch size {b} uses {share:.{0 if share >= 0.01 else 1}%} of the "
           f"free memory")
    if notes:
        msg += " (" + "; ".join(notes) + ")"
    return BatchFit(b, slope, intercept, share, msg, True)


def _scalar(out) -> torch.Tensor:
    """A scalar to backpropagate from whatever the model returns in training mode (a tensor or a list)."""
    if isinstance(out, torch.Tensor):
        return out.float().mean()
    return sum(_scalar(o) for o in out if isinstance(o, (torch.Tensor, list, tuple)))


def profile_memory(model: nn.Module, imgsz: int, device: torch.device, batch_sizes: Sequence[int] = PROFILE_BATCHES,
                   autocast: Callable[[], AbstractContextManager] | None = None) -> tuple[list[float | None], float, float]:
    """Peak bytes one forward + backward took at each batch size (None where CUDA ran out of memory), and the
    (free, total) bytes before profiling. Runs on a copy of the model: the caller's weights, gradients and
    BatchNorm statistics are untouched."""
    autocast = autocast or nullcontext
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    base = torch.cuda.memory_reserved(device)
    m = copy.deepcopy(model).to(device).train()
    readings: list[float | None] = []
    for b in batch_sizes:
        if readings and readings[-1] is None:  # a larger batch will not fit either
            readings.append(None)
            continue
        torch.cuda.reset_peak_memory_stats(device)
        try:
            x = torch.rand(b, 3, imgsz, imgsz, device=device).contiguous(memory_format=torch.channels_last)  # as train.py
            with autocast():
                loss = _scalar(m(x))
            loss.backward()
            torch.cuda.synchronize(device)
            readings.append(float(torch.cuda.max_memory_reserved(device) - base))
        except torch.cuda.OutOfMemoryError:
            readings.append(None)
        finally:
            x = loss = None  # noqa: F841 - release the activations before the next size
            m.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
    del m
    torch.cuda.empty_cache()
    return readings, float(free), float(total)


def autobatch(model: nn.Module, imgsz: int, device: torch.device, fraction: float = 0.6,
              batch_sizes: Sequence[int] = PROFILE_BATCHES, autocast: Callable[[], AbstractContextManager] | None = None,
              default: int = DEFAULT_BATCH, max_batch: int = MAX_BATCH, n_images: int | None = None,
              augment_on: str = "host", mixup: bool = False) -> int:
    """The batch size for training `model` at `imgsz` on CUDA `device`; prints the fit (one line). augment_on
    "device" (resolved, utils/device.resolve_augment_on) adds the device augmentation's memory to each reading;
    mixup: the hyp's mixup is above 0 (two pictures warped per sample)."""
    readings, free, total = profile_memory(model, imgsz, device, batch_sizes, autocast)
    note = ""
    if augment_on == "device":
        from utils.data.device_augment import device_augment_bytes  # deferred: cv2, only for this choice

        readings = [None if r is None else r + device_augment_bytes(b, imgsz, imgsz, mixup)
                    for b, r in zip(batch_sizes, readings)]
        note = (f"; counting --augment-on device's warp{' with mixup' if mixup else ''} "
                f"({device_augment_bytes(64, imgsz, imgsz, mixup) / GIB:.1f} GiB at batch 64)")
    cap, reason = dataset_cap(n_images, max_batch)
    fit = fit_batch_size(batch_sizes, readings, free, total, fraction, min(default, cap), cap, reason)
    (LOGGER.info if fit.fitted else LOGGER.warning)(fit.message + note + "; the lr and weight decay follow the batch "
                                                    "(utils/engine/optim.choose_recipe)")
    return fit.batch_size


def resolve_batch_size(requested: int, device: torch.device, model: nn.Module | None = None, imgsz: int = 640,
                       world_size: int = 1, fraction: float = 0.6,
                       autocast: Callable[[], AbstractContextManager] | None = None, n_images: int | None = None,
                       augment_on: str = "host", mixup: bool = False) -> int:
    """--batch-size as given, or AutoBatch's choice for -1 (16 on CPU, with one line saying so); augment_on and
    mixup as autobatch takes them."""
    if requested >= 1:
        return requested
    if requested != -1:
        raise UserError(f"--batch-size {requested} is not valid; pass a positive batch size, or -1 for AutoBatch")
    if torch.device(device).type != "cuda":
        if DEFAULT_BATCH % world_size:
            raise UserError(f"--batch-size -1 means {DEFAULT_BATCH} on {device}, which {world_size} processes cannot "
                            f"share evenly; pass a total batch size that is a multiple of {world_size}")
        LOGGER.info(f"AutoBatch (--batch-size -1) needs CUDA; using batch size {DEFAULT_BATCH} on {device}")
        return DEFAULT_BATCH
    if world_size > 1:
        raise UserError("--batch-size -1 (AutoBatch) profiles one GPU; with several processes pass the total batch "
                        "size, e.g. --batch-size 64")
    if model is None:
        raise ValueError("resolve_batch_size needs the model to profile on CUDA")
    return autobatch(model, imgsz, device, fraction, autocast=autocast, n_images=n_images, augment_on=augment_on,
                     mixup=mixup)
