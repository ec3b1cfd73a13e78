"""Convert a YOLOv5 v6.0-v7.0 detection checkpoint into this project's safe FP16 checkpoint, once:

    python -m models.yolov5_convert yolov5s.pt yolov5s_ampyolo.pt [--force]

The file is read by utils/interop/yolov5_compat.py (no code from it runs); this builds our model from it, checks
that the model has the file's strides and takes its weights key for key, and writes the checkpoint.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from models.yolo import Model
from utils.engine.checkpoint import atomic_save, load_checkpoint
from utils.errors import UserError, run_cli
from utils.interop.yolov5_compat import FIX


def convert(source: str | Path, output: str | Path, force: bool = False) -> dict[str, Any]:
    """Read a YOLOv5 checkpoint, check that our model built from it has the file's strides and takes its
    weights key for key, then write our FP16 checkpoint atomically. Returns the checkpoint written."""
    source, output = Path(source), Path(output)
    if output.exists() and not force:
        raise UserError(f"{output} already exists; choose another output name or pass --force to replace it")
    if output.resolve() == source.resolve():
        raise UserError(f"{output} is the file being converted; choose another output name")
    ckpt = load_checkpoint(source)
    if not torch.serialization.get_unsafe_globals_in_checkpoint(source):  # it loaded without stand-ins: ours
        raise UserError(f"{source} is already a checkpoint of this project; use it as it is")
    model = Model(ckpt["yaml"], nc=ckpt["nc"])
    try:
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ckpt["model"].items()})
    except RuntimeError as e:
        raise UserError(f"{source}: its weights do not fit the architecture its YAML describes "
                        f"({str(e).splitlines()[0][:120]}); {FIX}") from None
    if model.stride.tolist() != ckpt["origin"]["stride"]:
        raise UserError(f"{source}: its Detect strides {ckpt['origin']['stride']} differ from its architecture's "
                        f"{model.stride.tolist()}; the file is damaged or was edited")
    atomic_save(ckpt, output)
    return ckpt


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m models.yolov5_convert",
                                description="Convert a YOLOv5 v6.0-v7.0 detection checkpoint into this project's "
                                            "safe FP16 checkpoint (read without running any code from the file).")
    p.add_argument("source", help="YOLOv5 checkpoint (.pt written by YOLOv5's train.py)")
    p.add_argument("output", help="where to write our checkpoint, e.g. yolov5s_ampyolo.pt")
    p.add_argument("--force", action="store_true", help="replace the output file if it exists")
    a = p.parse_args(argv)
    ckpt = convert(a.source, a.output, a.force)
    stride = "/".join(f"{s:g}" for s in ckpt["origin"]["stride"])
    print(f"{a.source} -> {a.output}: {len(ckpt['model'])} tensors, {ckpt['nc']} classes, strides {stride}; "
          f"use it with --weights {a.output}")


if __name__ == "__main__":
    run_cli(main)
