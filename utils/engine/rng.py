"""The global random generators: seeding, deterministic algorithms, and the generators' state as plain tensors
and numbers (what a checkpoint may hold) for an exact resume."""
from __future__ import annotations

import contextlib
import os
import random
from typing import Iterator

import numpy as np
import torch
import torch.utils.deterministic

# cuBLAS picks its reduction order by workspace; with this fixed workspace its results repeat (NVIDIA's cuBLAS
# documentation, "Results reproducibility"). Read when cuBLAS first starts, so it is set before any CUDA matmul.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # every device's generator, CUDA's included


@contextlib.contextmanager
def reproducible(on: bool, seed: int) -> Iterator[None]:
    """With `on`, a seeded run is a function of its command: PyTorch's deterministic algorithms, cuDNN's
    deterministic kernels, cuBLAS's fixed workspace and Python's hash seed for child processes. The settings in
    force before are restored on exit, so a caller that trains in-process keeps its own.

    On a CPU with several threads, a sum into the same element from several places (the backward of the loss's
    `p[b, a, gj, gi]` gather, where targets share a cell) adds in a different order from run to run; the
    deterministic implementation sorts first. An operation with no deterministic implementation on a device warns
    once (warn_only) instead of stopping the run. Uninitialised memory is not filled with NaN
    (fill_uninitialized_memory): that is a debugging aid and costs a write per allocation."""
    env = {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE_CONFIG, "PYTHONHASHSEED": str(seed)}
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              torch.utils.deterministic.fill_uninitialized_memory, {k: os.environ.get(k) for k in env})
    if on:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        torch.utils.deterministic.fill_uninitialized_memory = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)  # a user's own setting stands
        os.environ["PYTHONHASHSEED"] = str(seed)
    else:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
    try:
        yield
    finally:
        algorithms, warn_only, cudnn_det, cudnn_bench, fill, old_env = before
        torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn_det, cudnn_bench
        torch.utils.deterministic.fill_uninitialized_memory = fill
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def rng_state() -> dict:
    """Every global RNG, as plain tensors and numbers (checkpoints hold nothing else)."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(keys.astype(np.int64)),
            "numpy_pos": [int(pos), int(has_gauss), float(gauss)], "python": list(random.getstate()[1])}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    pos, has_gauss, gauss = state["numpy_pos"]
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate((3, tuple(state["python"]), None))
