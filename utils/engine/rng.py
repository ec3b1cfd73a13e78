"""The global random generators: seeding, and their state as plain tensors and numbers (what a checkpoint
may hold) for an exact resume."""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
