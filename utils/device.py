"""Choosing the torch device from a `--device` string, and the choices that follow from its type."""
from __future__ import annotations

import os

import torch

from utils.errors import UserError


def select_device(device: str = "") -> torch.device:
    """'' -> first GPU if any, else CPU; 'cpu'; '0'; '0,1' (this process takes LOCAL_RANK's entry)."""
    spec = str(device).strip().lower().replace("cuda:", "").replace(" ", "")
    if spec in ("", "auto"):
        return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    ids = spec.split(",")
    if not all(i.isdigit() for i in ids):
        raise UserError(f"--device {device!r} is not valid; use 'cpu', '0' or '0,1'")
    if not torch.cuda.is_available():
        raise UserError(f"--device {device!r} asks for CUDA but no GPU is available; use --device cpu")
    n = torch.cuda.device_count()
    bad = [i for i in ids if int(i) >= n]
    if bad:
        raise UserError(f"--device {device!r}: GPU {bad[0]} does not exist ({n} visible); use 0..{n - 1}")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return torch.device(f"cuda:{ids[local_rank % len(ids)]}")


def memory_used(device: torch.device) -> str:
    """GPU memory reserved by the caching allocator, or the process's peak resident memory on CPU."""
    if device.type == "cuda":
        return f"{torch.cuda.memory_reserved(device) / 2**30:.2f}G"
    import resource

    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f}G"  # ru_maxrss is in KiB on Linux


AUGMENT_ON = ("auto", "host", "device")


def resolve_augment_on(choice: str, device: torch.device) -> str:
    """--augment-on: where the random warp, HSV jitter and flips run (utils/data/device_augment.py). auto: the
    host (the loader's workers), on every machine; "device" is opt-in. The device path matches the host path on
    this CPU (tests/test_device_augment.py) but has not yet been measured on a GPU, where its warp also holds
    about 2 GiB more at batch 64 and 640 px (twice that with mixup; AutoBatch counts it); on a CPU it would move
    the workers' work onto the training process's own cores. `device` is kept in the signature so that auto can
    choose by device again once a GPU measurement says it should."""
    if choice not in AUGMENT_ON:
        raise UserError(f"--augment-on {choice!r} is not one of {', '.join(AUGMENT_ON)}")
    return "host" if choice == "auto" else choice


def pinned_transfers(device: torch.device) -> bool:
    """Whether host tensors bound for `device` should be page-locked first: a copy from pageable memory to a
    GPU waits for the GPU's queue, which a training step must never do."""
    return device.type == "cuda"
