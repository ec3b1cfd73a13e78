"""torch.hub entry points, offline: this repository's folder is the hub "repo" (source="local"); nothing downloads.

    import torch
    model = torch.hub.load("path/to/this/repo", "custom", path="best.pt", source="local")
    results = model("pictures/")                # models/api.Detector -> utils/report/detections.Detections
    results.print()

    torch.hub.load(repo, "custom", path=["a.pt", "b.pt"], source="local")       # an ensemble of checkpoints
    torch.hub.load(repo, "yolov5s", classes=["cat", "dog"], source="local")     # untrained yolov5s, 2 classes
    torch.hub.load(repo, "yolov5s", path="best.pt", source="local")             # a yolov5s-sized checkpoint

Signatures (every entry returns a models/api.Detector; extra keywords are its settings: conf, iou, classes,
agnostic, max_det, imgsz, batch_size):

    custom(path=None, *, weights=None, device="", half=None, **settings)
    yolov5n / yolov5s / yolov5m / yolov5l / yolov5x(path=None, *, weights=None, classes=None, pretrained=False,
                                                    device="", half=None, **settings)

`path` and `weights` are one argument under two names (YOLOv5's hub says path, our commands --weights): a
checkpoint, an exported .onnx / .torchscript file, or a list of checkpoints. A named entry without one builds that
model untrained, predicting `classes` (a count, a list of names or one name; 80 when not given); with one, the
file's model must be that size (else use "custom"), and its classes are the file's. pretrained=True stands for
YOLOv5's downloaded weights: here it loads weights/<name>.pt from this repository, which has to be put there by
hand (nothing downloads).

The same objects without torch.hub: `from models.api import load, create`.
"""
from __future__ import annotations

from pathlib import Path as _Path
from typing import Any as _Any, Sequence as _Sequence

# Every name here starts with an underscore except the entry points: torch.hub.list() offers any other callable
import models.api as _api
from models.yolo import load_model_yaml as _load_model_yaml
from utils.errors import UserError as _UserError

dependencies = ["torch", "torchvision", "cv2", "numpy", "yaml"]  # torch.hub checks these import before loading
_DEFAULT_CLASSES = 80  # an untrained model's, as YOLOv5's hub
_Classes = int | str | _Sequence[str] | None  # a count, one name, or a list of names


def custom(path: str | _Path | _Sequence[str | _Path] | None = None, *, weights: str | _Path | _Sequence | None = None,
           device: str = "", half: bool | None = None, **settings: _Any) -> _api.Detector:
    """A Detector from a checkpoint, an exported file or a list of checkpoints (an ensemble), given as path= or
    weights=."""
    file = _one_of(path, weights, "custom")
    if file is None:
        raise _UserError("custom needs the weights to load: torch.hub.load(repo, 'custom', path='best.pt', "
                         "source='local')")
    return _api.load(file, device, half, **settings)


def _named(cfg: str, path: _Any, weights: _Any, classes: _Classes, pretrained: bool, device: str,
           half: bool | None, settings: dict) -> _api.Detector:
    file = _one_of(path, weights, cfg)
    if file is None and pretrained:
        file = f"{cfg}.pt"  # models/yolo.load_for_inference looks bare names up in weights/
    if file is None:
        return _api.create(f"{cfg}.yaml", _DEFAULT_CLASSES if classes is None else classes, device, half, **settings)
    if classes is not None:
        raise _UserError(f"{cfg}: classes= is for an untrained model; {file} brings its own classes (drop classes=)")
    detector = _api.load(file, device, half, **settings)
    _check_size(detector, cfg)
    return detector


def _one_of(path: _Any, weights: _Any, entry: str) -> _Any:
    if path is not None and weights is not None:
        raise _UserError(f"{entry}: pass the weights once, as path= or weights= (they are the same argument)")
    return path if path is not None else weights


def _check_size(detector: _api.Detector, cfg: str) -> None:
    """Refuse a checkpoint of another size under a named entry: yolov5s(path='yolov5m.pt') would silently be an m."""
    want, _ = _load_model_yaml(f"{cfg}.yaml")
    members = getattr(detector.backend, "members", [detector.backend])
    for m in members:
        got = getattr(getattr(m, "model", None), "yaml", None)  # exported graphs keep no YAML: nothing to compare
        if got is None:
            continue
        size = [(d.get("depth_multiple"), d.get("width_multiple")) for d in (got, want)]
        if size[0] != size[1]:
            raise _UserError(f"{m.path} holds a model of depth {size[0][0]} and width {size[0][1]}, not {cfg} "
                             f"({size[1][0]}, {size[1][1]}); load it with torch.hub.load(repo, 'custom', path=...)")


def yolov5n(path: _Any = None, *, weights: _Any = None, classes: _Classes = None, pretrained: bool = False,
            device: str = "", half: bool | None = None, **settings: _Any) -> _api.Detector:
    """YOLOv5n: untrained with `classes`, or from path= / weights= (see the module docstring)."""
    return _named("yolov5n", path, weights, classes, pretrained, device, half, settings)


def yolov5s(path: _Any = None, *, weights: _Any = None, classes: _Classes = None, pretrained: bool = False,
            device: str = "", half: bool | None = None, **settings: _Any) -> _api.Detector:
    """YOLOv5s: untrained with `classes`, or from path= / weights= (see the module docstring)."""
    return _named("yolov5s", path, weights, classes, pretrained, device, half, settings)


def yolov5m(path: _Any = None, *, weights: _Any = None, classes: _Classes = None, pretrained: bool = False,
            device: str = "", half: bool | None = None, **settings: _Any) -> _api.Detector:
    """YOLOv5m: untrained with `classes`, or from path= / weights= (see the module docstring)."""
    return _named("yolov5m", path, weights, classes, pretrained, device, half, settings)


def yolov5l(path: _Any = None, *, weights: _Any = None, classes: _Classes = None, pretrained: bool = False,
            device: str = "", half: bool | None = None, **settings: _Any) -> _api.Detector:
    """YOLOv5l: untrained with `classes`, or from path= / weights= (see the module docstring)."""
    return _named("yolov5l", path, weights, classes, pretrained, device, half, settings)


def yolov5x(path: _Any = None, *, weights: _Any = None, classes: _Classes = None, pretrained: bool = False,
            device: str = "", half: bool | None = None, **settings: _Any) -> _api.Detector:
    """YOLOv5x: untrained with `classes`, or from path= / weights= (see the module docstring)."""
    return _named("yolov5x", path, weights, classes, pretrained, device, half, settings)
