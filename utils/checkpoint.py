"""The checkpoint format: plain state dicts that load with `torch.load(..., weights_only=True)`.

A checkpoint is a dict of tensors, numbers, strings, lists and dicts, never pickled modules, so opening
one never runs code. Every file is written atomically (temp file in the same folder, then os.replace):
a crash or a full disk mid-write leaves the previous file intact.

    best.pt / stripped last.pt: {'format', 'version', 'yaml', 'nc', 'names', 'model' (EMA, FP16),
                                 'epoch', 'metrics', 'date'}
    last.pt during training:    the above plus 'train': everything an exact resume needs.
"""
from __future__ import annotations

import datetime as dt
import pickle
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from utils import files
from utils.errors import UserError
from utils.files import atomic_write

FORMAT = "ampyolo"
VERSION = 1


def fp16_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights in FP16 on the CPU (integer buffers such as BN's counters keep their dtype)."""
    return {k: (v.detach().half() if v.is_floating_point() else v.detach()).cpu().clone() for k, v in model.state_dict().items()}


def fp32_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def make_checkpoint(ema_model: nn.Module, yaml: dict, names: list[str], epoch: int,
                    metrics: dict[str, float] | None = None, train_state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Assemble a checkpoint dict; `train_state` is only given for last.pt during training."""
    ckpt = {
        "format": FORMAT,
        "version": VERSION,
        "yaml": yaml,
        "nc": int(yaml["nc"]),
        "names": list(names),
        "model": fp16_state_dict(ema_model),
        "epoch": int(epoch),
        "metrics": dict(metrics or {}),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
    }
    if train_state is not None:
        ckpt["train"] = train_state
    return ckpt


def atomic_save(obj: Any, path: str | Path, before_replace: Callable[[], None] | None = None) -> None:
    """torch.save through the project's one atomic writer (utils.files.atomic_write): temp file beside
    `path`, fsync, rename. On any failure (a full disk shows up as OSError or as torch's zip-writer
    RuntimeError) the file already at `path` is kept and the user gets one line."""
    atomic_write(path, lambda f: torch.save(obj, f), fix="Free disk space or choose another --project",
                 before_replace=before_replace)


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Checkpoint temp files (.<name>.pt.<random>.tmp) that a killed process left in `folder`."""
    return files.remove_stale_temps(folder, ("*.pt",))


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load one of our checkpoints safely (weights_only), with one clear error for anything else."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} not found; pass a .pt written by train.py")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only refuses any pickle that would build arbitrary objects (and so could run code)
        first = str(e).strip().splitlines()[0] if str(e).strip() else "unsupported content"
        raise UserError(f"refused to load {path}: it holds objects other than plain tensors and numbers "
                        f"({first[:120]}); only checkpoints written by this project's train.py are loaded") from None
    except Exception as e:  # a damaged file can fail anywhere inside the unpickler (KeyError, EOFError, ...)
        msg = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot read checkpoint {path} (truncated or corrupt: {msg}); "
                        f"use another checkpoint, e.g. best.pt of the same run") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT or "model" not in ckpt or "yaml" not in ckpt:
        raise UserError(f"{path} is not a checkpoint of this project (no '{FORMAT}' format marker); "
                        f"train one with train.py, or convert it first")
    return ckpt


def build_model(ckpt: dict[str, Any], weights: str = "model", source: str | Path = "checkpoint") -> nn.Module:
    """An FP32 Model from a checkpoint's YAML, with the state dict named by `weights` loaded."""
    from models.yolo import Model  # deferred: models import utils, not the other way round

    model = Model(ckpt["yaml"], nc=ckpt["nc"])
    state = ckpt["model"] if weights == "model" else ckpt["train"][weights]
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"weights in {source} do not fit its model YAML ({str(e).splitlines()[0][:120]}); "
                        f"the file is damaged or was edited") from None
    return model.float()


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """(FP32 model in eval mode on `device`, checkpoint dict). Callers pick the inference dtype afterwards."""
    ckpt = load_checkpoint(path)
    model = build_model(ckpt, source=path)
    return model.to(device).eval(), ckpt


def strip_checkpoint(path: str | Path) -> None:
    """Rewrite a training last.pt in best.pt's form: FP16 EMA and metadata only."""
    ckpt = load_checkpoint(path)
    if ckpt.pop("train", None) is not None:
        atomic_save(ckpt, path)
