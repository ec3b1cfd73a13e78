"""What evaluation (test.py) and detection (detect.py, and the Python API models/api.py) share around the
model: detection's defaults, the inference-size and threshold checks, the stage timer and the YOLO-format
label writer. (Loading a weights file for inference is models/yolo.load_for_inference; train.py rounds its
training size here too.)
"""
from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from utils.boxes import xyxy2xywhn
from utils.errors import UserError
from utils.files import atomic_write
from utils.options import option

LOGGER = logging.getLogger(__name__)

# Detection's defaults, in one place so detect.py's options and the Python API (models/api.py) cannot drift apart
CONF_THRES = 0.25  # confidence threshold
IOU_THRES = 0.45  # NMS IoU threshold
MAX_DET = 1000  # detections per image
DEFAULT_IMGSZ = 640  # when neither --imgsz nor the weights say (converted YOLOv5 checkpoints: YOLOv5's own size)
LINE_WIDTH = 3  # box line width in pixels on saved pictures


@dataclass(frozen=True)
class InferenceOptions:
    """The options test.py's EvalOptions and detect.py's DetectOptions share, with the same defaults."""

    device: str = option("", "cuda device (0, 0,1) or cpu; default: first GPU if any")
    half: bool | None = option(None, "FP16 inference (default: on for CUDA GPUs with fast FP16; on a CPU only when "
                               "asked, emulated and slow; --no-half forces FP32)", action=argparse.BooleanOptionalAction)
    augment: bool = option(False, "test-time augmentation (flip and scale)")
    save_txt: bool = option(False, "save detections as labels/*.txt (YOLO format)")
    save_conf: bool = option(False, "add confidences to --save-txt labels")
    name: str = option("exp", "results go to project/name")
    exist_ok: bool = option(False, "reuse project/name instead of incrementing")


def check_rules(rules: Iterable[tuple[bool, str]]) -> None:
    """Options a user can get wrong, as (ok, message) pairs: the first that fails is one UserError line."""
    for ok, message in rules:
        if not ok:
            raise UserError(message)


CLI_FLAGS = ("--conf-thres ", "--iou-thres ", "--max-det ", "--batch-size ")


def inference_rules(conf_thres: float, iou_thres: float, max_det: int, batch_size: int,
                    names: Sequence[str] = CLI_FLAGS) -> list[tuple[bool, str]]:
    """The checks test.py, detect.py and the API share (NMS would raise a bare ValueError on most of these); `names`
    are what the messages call the four settings (the API's say conf=, iou=, ...)."""
    conf, iou, det, batch = names
    return [(0 <= conf_thres <= 1, f"{conf}{conf_thres} must lie in [0, 1]"),
            (0 <= iou_thres <= 1, f"{iou}{iou_thres} must lie in [0, 1]"),
            (max_det >= 1, f"{det}{max_det} must be 1 or more"),
            (batch_size >= 1, f"{batch}{batch_size} must be 1 or more")]


def round_imgsz(imgsz: int, stride: int) -> int:
    """A size rounded up to a multiple of `stride` (the network halves the size that often), at least one
    stride; a warning says when it changed."""
    size = max(-(-int(imgsz) // stride) * stride, stride)
    if size != imgsz:
        LOGGER.warning(f"warning: --imgsz {imgsz} is not a multiple of the stride {stride}; using {size}")
    return size


def image_hw(imgsz: int | Sequence[int], stride: int) -> tuple[int, int]:
    """(h, w) from one size or a height and width, each rounded by round_imgsz."""
    hw = [int(imgsz)] * 2 if isinstance(imgsz, (int, float)) else [int(s) for s in imgsz]
    if len(hw) == 1:
        hw *= 2
    if len(hw) != 2 or min(hw) < 1:
        raise UserError(f"--imgsz {imgsz}: give one size or height and width, e.g. --imgsz 640 or --imgsz 480 640")
    if hw[0] == hw[1]:
        return (round_imgsz(hw[0], stride),) * 2
    return round_imgsz(hw[0], stride), round_imgsz(hw[1], stride)


def default_imgsz(asked: int | Sequence[int] | None, model: object, fallback: int,
                  fallback_why: str = "the default") -> tuple[int | Sequence[int], str]:
    """(the size to run at, why): --imgsz when given, else the size the weights were trained at (a Backend's
    trained_imgsz), else `fallback`; an ensemble runs at the largest of its members' sizes so found. The reason goes
    in the command's header line."""
    if asked is not None:
        return asked, "--imgsz"
    members = getattr(model, "members", None)
    if members:  # an ensemble: the largest size a member was trained at, one that does not say counting as `fallback`
        unique = len({m.path.name for m in members}) == len(members)  # runs' best.pt files share a name
        sizes = [(m.path.name if unique else str(m.path), m.trained_imgsz) for m in members]
        listed = ", ".join(f"{name} {size}" if size else f"{name} {fallback} ({fallback_why}: it records none)"
                           for name, size in sizes)
        return max(size or fallback for _, size in sizes), \
            f"the largest training size of the ensemble's members: {listed}; --imgsz to change"
    trained = getattr(model, "trained_imgsz", None)
    if trained:
        done = "exported" if getattr(model, "kind", "pytorch") in ("onnx", "torchscript") else "trained"
        return int(trained), f"the size {model.path.name} was {done} at; --imgsz to change"
    return fallback, f"{fallback_why}; --imgsz to change"


class Timer:
    """Accumulates the wall time of a stage (`with timer:`); synchronises CUDA so GPU work is charged to
    the stage that queued it."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.total = 0.0
        self.dt = 0.0

    def __enter__(self) -> Timer:
        self._sync()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        self.dt = time.perf_counter() - self.start
        self.total += self.dt

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def write_yolo_labels(path: str | Path, det: torch.Tensor | np.ndarray, shape: Sequence[int], save_conf: bool) -> None:
    """labels/<stem>.txt: one row per detection (x1, y1, x2, y2, conf, cls in original pixels), written as
    `class cx cy w h [conf]` normalised to the original image of `shape` (h, w, ...). An empty file means:
    looked, found nothing. Whole or not at all (utils.files.atomic_write): a full disk is one UserError line."""
    det = det.detach().float().cpu().numpy() if isinstance(det, torch.Tensor) else np.asarray(det, dtype=np.float64)
    det = det.reshape(-1, 6)
    xywhn = xyxy2xywhn(det[:, :4], w=shape[1], h=shape[0]) if len(det) else np.zeros((0, 4))
    rows = []
    for (cx, cy, w, h), conf, c in zip(xywhn, det[:, 4], det[:, 5]):
        row = f"{int(c)} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}"
        rows.append(row + (f" {conf:.5f}" if save_conf else ""))
    text = "".join(r + "\n" for r in rows).encode()
    atomic_write(path, lambda f: f.write(text), fix="free disk space or choose another --project", durable=False)
