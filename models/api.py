"""The detector as a Python object, offline: a model in three lines.

    from models.api import load
    detector = load("runs/train/exp/weights/best.pt")          # a list of checkpoints makes an ensemble
    results = detector(["a.jpg", "pictures/", cv2.imread("b.jpg")])
    results.print(); results.save("runs/detect/exp"); results.xyxy[0]   # utils/report/detections.py

`torch.hub.load(repo, "custom", path="best.pt", source="local")` (hubconf.py) returns the same Detector, and
`create("yolov5s.yaml", classes=["cat", "dog"])` an untrained one. What a call accepts (paths, folders, NumPy
arrays in BGR unless rgb=True, PIL images, tensors, lists) is utils/data/inputs.py's docstring.

A call runs detect.py's code, not a copy of it: the same loader (models/yolo.load_for_inference, so the same
precision rule, utils.engine.amp.inference_dtype: FP16 on CUDA GPUs that handle it, FP32 on a CPU), the same
per-batch step (`predict_batch` below, which detect.py calls: letterbox -> forward -> NMS -> original pixels),
the same defaults (utils/inference.py: conf 0.25, IoU 0.45, the size the weights were trained at, else 640) and the
same drawing. So a picture gives detect.py's boxes.

Why here, in models/, and not a top-level api.py: imports run one way (commands -> models -> utils), and both
detect.py and hubconf.py are commands that need this; the per-batch step has to sit below detect.py for detect.py
to share it. A top-level module would also compete for a generic name on sys.path, as `import test` does.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from models.yolo import Model, inference_backend, load_for_inference
from utils.boxes import non_max_suppression, scale_boxes
from utils.data.augment import letterbox
from utils.data.inputs import pictures
from utils.device import select_device
from utils.engine.amp import inference_dtype
from utils.errors import UserError
from utils.inference import (CONF_THRES, DEFAULT_IMGSZ, IOU_THRES, MAX_DET, Timer, check_rules, default_imgsz, image_hw,
                             inference_rules)
from utils.interop.backends import Backend, fixed_imgsz
from utils.limits import MAX_CLASSES, check_imgsz
from utils.report.detections import Detections

LOGGER = logging.getLogger(__name__)

STAGES = ("pre-process", "inference", "NMS")
SETTING_NAMES = ("Detector conf=", "Detector iou=", "Detector max_det=", "Detector batch_size=")  # in refusals


# ---------------------------------------------------------------------------------------------
# the per-batch step detect.py and the Detector share


@dataclass(frozen=True)
class NMSOptions:
    """What non_max_suppression keeps: detect.py's --conf-thres, --iou-thres, --classes, --agnostic-nms, --max-det."""

    conf_thres: float = CONF_THRES
    iou_thres: float = IOU_THRES
    classes: Sequence[int] | None = None
    agnostic: bool = False
    max_det: int = MAX_DET


def preprocess(ims: Sequence[np.ndarray], imgsz: tuple[int, int], stride: int, square: bool,
               device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, list[tuple]]:
    """Letterbox each BGR picture, stack as an RGB (B, 3, H, W) tensor in 0..1; per picture ((ry, rx), (padw, padh)).
    square=False pads each picture only to the next stride multiple (one picture per batch); True pads all to imgsz
    so pictures of different shapes share a batch."""
    batch, geometry = [], []
    for im0 in ims:
        im, (rx, ry), pad = letterbox(im0, imgsz, stride=stride, auto=not square)
        batch.append(im)
        geometry.append(((ry, rx), pad))
    x = np.ascontiguousarray(np.stack(batch)[..., ::-1].transpose(0, 3, 1, 2))  # BGR HWC -> RGB CHW
    # cast on the device: a uint8 transfer is 4x smaller than a float one
    return torch.from_numpy(x).to(device).to(dtype).div_(255), geometry


def predict_batch(model: Backend, ims: Sequence[np.ndarray], imgsz: tuple[int, int], square: bool, nms: NMSOptions,
                  augment: bool = False, timers: Sequence[Timer] | None = None) -> tuple[tuple[int, ...], list[torch.Tensor]]:
    """Detections in a batch of BGR pictures: (network input shape, per picture an (n, 6) tensor x1, y1, x2, y2, conf,
    cls in the picture's own pixels, on the model's device). `timers` (pre-process, inference, NMS) are charged."""
    t = timers or [nullcontext()] * 3
    with t[0]:
        x, geometry = preprocess(ims, imgsz, int(model.stride.max()), square, model.device, model.dtype)
    with t[1], torch.inference_mode():
        pred = model(x, augment=augment)[0]
    with t[2]:
        dets = non_max_suppression(pred, nms.conf_thres, nms.iou_thres, nms.classes, nms.agnostic, max_det=nms.max_det)
    for im, g, det in zip(ims, geometry, dets):
        det[:, :4] = scale_boxes(x.shape[2:], det[:, :4], im.shape, ratio_pad=g)
    return tuple(x.shape), dets


# ---------------------------------------------------------------------------------------------
# the Detector


class Detector:
    """Weights ready to detect: `detector(source, size=None, rgb=False, augment=False) -> Detections`.

    The settings are attributes, changeable between calls as in YOLOv5 (`detector.conf = 0.5`): conf, iou, classes
    (keep only these class indices), agnostic (class-agnostic NMS), max_det, imgsz (None: the size the weights were
    trained at, else 640) and batch_size (1, as detect.py: each picture padded only to a stride multiple; more puts
    that many pictures in one square batch, as detect.py --batch-size does).
    """

    def __init__(self, backend: Backend, imgsz: int | Sequence[int] | None = None, conf: float = CONF_THRES,
                 iou: float = IOU_THRES, classes: Sequence[int] | None = None, agnostic: bool = False,
                 max_det: int = MAX_DET, batch_size: int = 1) -> None:
        self.backend = backend
        self.imgsz, self.conf, self.iou, self.classes = imgsz, conf, iou, classes
        self.agnostic, self.max_det, self.batch_size = agnostic, max_det, batch_size
        self._warm = False

    @property
    def names(self) -> list[str]:
        return self.backend.names

    @property
    def stride(self) -> int:
        return int(self.backend.stride.max())

    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def dtype(self) -> torch.dtype:
        return self.backend.dtype

    def __repr__(self) -> str:
        return (f"Detector({self.backend.path}, {self.backend.kind}, {len(self.names)} classes, "
                f"{str(self.dtype).removeprefix('torch.')} on {self.device})")

    def input_size(self, size: int | Sequence[int] | None = None) -> tuple[int, int]:
        """The (h, w) pictures are letterboxed to: `size`, else `imgsz`, else the weights' own size, else 640
        (utils.inference.default_imgsz, detect.py's rule), rounded up to a stride multiple."""
        chosen, flag = (size, "size") if size is not None else (self.imgsz, "imgsz")
        if chosen is not None and not _is_size(chosen):  # image_hw would read '320' as the sizes 3, 2 and 0
            raise UserError(f"{flag}={str(chosen)[:40]!r} must be a number of pixels or (height, width), e.g. "
                            f"{flag}=640 or {flag}=(480, 640)")
        asked, _ = default_imgsz(chosen, self.backend, DEFAULT_IMGSZ)
        hw = image_hw(fixed_imgsz(self.backend, asked), self.stride)
        check_imgsz(hw, self.batch_size, training=False, device=self.device, flag="size")
        return hw

    def __call__(self, source: Any, size: int | Sequence[int] | None = None, *, rgb: bool = False,
                 augment: bool = False) -> Detections:
        """Detect objects in `source` (a path, folder, glob, .txt list, NumPy array, PIL image, tensor, or a list of
        these); NumPy colour arrays are BGR unless rgb=True. `size` overrides `imgsz` for this call; augment: flip
        and scale test-time augmentation (checkpoints only)."""
        check_rules(inference_rules(self.conf, self.iou, self.max_det, self.batch_size, SETTING_NAMES))
        named = pictures(source, rgb)
        hw = self.input_size(size)
        nms = NMSOptions(self.conf, self.iou, self.classes, self.agnostic, self.max_det)
        self._warm_up(hw)
        timers = [Timer(self.device) for _ in STAGES]
        preds, shape = [], ()
        for i in range(0, len(named), self.batch_size):
            ims = [im for _, im in named[i:i + self.batch_size]]
            shape, dets = predict_batch(self.backend, ims, hw, self.batch_size > 1, nms, augment, timers)
            preds += dets
        speed = {k: t.total * 1e3 / len(named) for k, t in zip(STAGES, timers)}
        return Detections([im for _, im in named], preds, [f for f, _ in named], self.names, speed, shape)


    def _warm_up(self, hw: tuple[int, int]) -> None:
        """The first CUDA call pays for kernel selection; keep it out of `speed`, as detect.py does."""
        if self.device.type == "cuda" and not self._warm:
            with torch.inference_mode():
                self.backend(torch.zeros(1, 3, *hw, device=self.device, dtype=self.dtype))
            self._warm = True


def load(weights: str | Path | Sequence[str | Path], device: str | torch.device = "", half: bool | None = None,
         **settings: Any) -> Detector:
    """A Detector from a checkpoint (train.py's or YOLOv5's), an exported .onnx / .torchscript file, or a list of
    checkpoints (an ensemble: predictions joined before NMS). device: '' (first GPU, else CPU), 'cpu', '0', or a
    torch.device; half: None applies the precision rule, False forces FP32. `settings` are Detector's (conf, iou,
    classes, agnostic, max_det, imgsz, batch_size)."""
    backend = load_for_inference(weights, _device(device), half)
    detector = Detector(backend, **settings)
    LOGGER.info(f"loaded {detector!r}")
    return detector


def create(cfg: str | Path = "yolov5s.yaml", classes: int | str | Sequence[str] = 80, device: str | torch.device = "",
           half: bool | None = None, **settings: Any) -> Detector:
    """An untrained Detector: the model of `cfg` (a YAML path, or yolov5n/s/m/l/x from models/) with random weights,
    predicting `classes` (a count, named '0', '1', ...; a list of names; or one name). For fine-tuning or checking
    shapes: its boxes mean nothing until trained."""
    if isinstance(classes, str):  # one name: a string is a sequence too, but 'cat' is not the classes c, a, t
        classes = [classes]
    names = [str(i) for i in range(classes)] if isinstance(classes, int) else [str(c) for c in classes]
    if not 1 <= len(names) <= MAX_CLASSES:
        raise UserError(f"classes={classes!r}: give a number of classes from 1 to {MAX_CLASSES}, or a list of names")
    dev = _device(device)
    dtype = inference_dtype(dev, half)
    model = Model(cfg, nc=len(names)).eval()
    backend = inference_backend(model, Path(model.yaml_file), dev, dtype, names)
    return Detector(backend, **settings)


def _is_size(v: Any) -> bool:
    """One size or (height, width) in pixels, as numbers."""
    def number(x: Any) -> bool:
        return isinstance(x, (int, float, np.integer)) and not isinstance(x, bool)

    return number(v) or (isinstance(v, (list, tuple)) and 1 <= len(v) <= 2 and all(number(x) for x in v))


def _device(device: str | torch.device) -> torch.device:
    return device if isinstance(device, torch.device) else select_device(str(device))
