"""YOLOv5 checkpoints in, with no code run: read with torch's weights_only unpickler, converted to ours.

YOLOv5 (v6.0 to v7.0, repository layout `models.yolo` / `models.common` or the pip package's
`yolov5.models.*`) saves whole pickled modules: {'model': DetectionModel.half(), 'ema': ..., 'epoch': ...}.
Its own loader unpickles them with weights_only=False, which runs whatever the file names. Here:

1. the file's globals are listed first without unpickling (torch.serialization.get_unsafe_globals_in_checkpoint);
   anything outside ALLOWED is refused with one line naming it (Ultralytics, segmentation and classification
   files get a line saying what they are);
2. the file is unpickled by torch's weights_only unpickler with ALLOWED mapping every admitted name to an
   inert stand-in class defined here: the stand-in records the attribute dict the pickle hands it and does
   nothing else. No class named in the file is imported, constructed or called, not even torch.nn's (a
   pickle may call an admitted class with arguments, e.g. Conv2d(10**6, 10**6, 9): the stand-in refuses);
3. the stand-in tree is walked for the state dict (the keys are YOLOv5's, which ours match), and the class
   names, nc, strides and anchors are read from the model and its Detect layer, the architecture from its
   stored YAML dict. The result is our checkpoint dict, so test.py, detect.py and train.py take it as is.

Our own package is also called `models`, so a plain torch.load(weights_only=False) in this repository would
resolve YOLOv5's `models.yolo.DetectionModel` against our module: nothing here relies on class lookup.

Convert once (writes our weights_only FP16 checkpoint):  python -m models.yolov5_convert yolov5s.pt yolov5s_ampyolo.pt
"""
from __future__ import annotations

import datetime as dt
import pickle
from pathlib import Path
from typing import Any

import torch

from utils.errors import UserError

FIX = "use a YOLOv5 v6.0-v7.0 detection checkpoint (P5: yolov5n/s/m/l/x) or one written by train.py"
YOLOV5_PREFIXES = ("models", "yolov5.models")  # the repository layout and the pip package `yolov5`
# YOLOv5 classes a P5 detection checkpoint holds. 'Model' is v6.0-v6.2's name for v7.0's 'DetectionModel'.
YOLOV5_CLASSES = {"yolo": ("DetectionModel", "Model", "Detect"),
                  "common": ("Conv", "Bottleneck", "C3", "SPPF", "Concat")}
# torch.nn layers inside those modules (Conv: Conv2d, BatchNorm2d, SiLU; SPPF: MaxPool2d; the head's
# nn.Upsample; DetectionModel.model: Sequential; Detect.m and C3.m: ModuleList / Sequential).
TORCH_LAYERS = ("torch.nn.modules.conv.Conv2d", "torch.nn.modules.batchnorm.BatchNorm2d",
                "torch.nn.modules.activation.SiLU", "torch.nn.modules.pooling.MaxPool2d",
                "torch.nn.modules.upsampling.Upsample", "torch.nn.modules.container.Sequential",
                "torch.nn.modules.container.ModuleList")
# A last.pt saved during YOLOv5 training holds best_fitness as a numpy array of shape (1,):
# _reconstruct(ndarray, (0,), b'b') then BUILD, with a dtype made by dtype('f8', False, True). numpy >= 2
# pickles under numpy._core, numpy 1.x under numpy.core.
NUMPY_GLOBALS = ("numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct",
                 "numpy.ndarray", "numpy.dtype")
# What other frameworks' and YOLOv5's unsupported task files name, for a line that says what the file is.
SEGMENT_CLASSES = ("SegmentationModel", "Segment", "Proto")
CLASSIFY_CLASSES = ("ClassificationModel", "Classify")
P5_LEVELS = 3
MIN_TORCH = "2.6"  # safe_globals with (stand-in, 'name.in.the.file') pairs; 2.5 has get_unsafe_globals_in_checkpoint
BN_EPS = 1e-3  # models.common.BN_EPS: YOLOv5's initialize_weights sets the same on every BatchNorm2d
MAX_DEPTH = 64  # module nesting; yolov5x nests 6 deep
MAX_MODULES = 100_000  # yolov5x holds about 700


class StandIn:
    """An inert placeholder for one class a YOLOv5 pickle names: it keeps the attribute dict the pickle
    hands it (nn.Module's __dict__: _parameters, _buffers, _modules, plain attributes) and nothing more."""

    name = "?"  # the global it stands for, e.g. 'models.common.Conv'

    def __new__(cls, *args: Any) -> StandIn:  # NEWOBJ: pickled nn.Modules pass no arguments
        if args:
            raise pickle.UnpicklingError(f"the file calls {cls.name}(...), which a saved model never does")
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # reached only when the pickle calls the class
        raise pickle.UnpicklingError(f"the file calls {self.name}(...), which a saved model never does")

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise pickle.UnpicklingError(f"{self.name} carries a {type(state).__name__} state, not an attribute dict")
        self.__dict__["attrs"] = state


class InertValue:
    """Stand-in for numpy's array and dtype rebuilders: keeps whatever arguments and state it is given."""

    name = "?"

    def __init__(self, *args: Any) -> None:
        self.args = args
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _standin(full_name: str, base: type) -> type:
    return type(f"StandIn_{full_name.rsplit('.', 1)[-1]}", (base,), {"name": full_name, "__module__": __name__})


def _build_allowlist() -> tuple[dict[str, type], list[tuple[type, str]]]:
    """{global name: stand-in class} and the same as torch.serialization.safe_globals wants it."""
    table: dict[str, type] = {}
    for module, classes in YOLOV5_CLASSES.items():
        for cls in classes:
            standin = _standin(f"models.{module}.{cls}", StandIn)  # one stand-in for both prefixes
            for prefix in YOLOV5_PREFIXES:
                table[f"{prefix}.{module}.{cls}"] = standin
    for name in TORCH_LAYERS:
        table[name] = _standin(name, StandIn)
    rebuild = _standin("numpy.ndarray", InertValue)
    for name in NUMPY_GLOBALS:
        table[name] = rebuild
    return table, [(cls, name) for name, cls in table.items()]


ALLOWED, _SAFE_GLOBALS = _build_allowlist()


def _short(name: str) -> str:
    """'yolov5.models.common.Conv' -> 'common.Conv' (the same class under either prefix)."""
    for prefix in YOLOV5_PREFIXES:
        if name.startswith(prefix + "."):
            return name[len(prefix) + 1:]
    return name


def _check_globals(path: Path, names: list[str]) -> None:
    """Refuse, with one line saying what the file is, any global outside ALLOWED (nothing is unpickled yet)."""
    unknown = sorted(n for n in names if n not in ALLOWED)
    if not unknown:
        return
    shown = ", ".join(unknown[:4]) + (f" and {len(unknown) - 4} more" if len(unknown) > 4 else "")
    prefixes = tuple(p + "." for p in YOLOV5_PREFIXES)
    yolov5 = [n for n in unknown if n.startswith(prefixes)]
    if any(n.startswith("ultralytics.") for n in names):
        raise UserError(f"{path} is an Ultralytics checkpoint (YOLOv5u, YOLOv8 or later: anchor-free head, classes "
                        f"from ultralytics.nn): not supported; {FIX}")
    if any(_short(n).split(".")[-1] in SEGMENT_CLASSES for n in yolov5):
        raise UserError(f"{path} is a YOLOv5 segmentation checkpoint (Segment head): not supported, only detection "
                        f"models are; {FIX}")
    if any(_short(n).split(".")[-1] in CLASSIFY_CLASSES for n in yolov5):
        raise UserError(f"{path} is a YOLOv5 classification checkpoint: not supported, only detection models are; {FIX}")
    if any(n.startswith(prefixes) for n in names) and all(n.startswith((*prefixes, "torch.nn.")) for n in unknown):
        raise UserError(f"{path} is a YOLOv5 checkpoint built with {shown}, which this project does not implement "
                        f"(it reads Conv, C3, SPPF, Concat, Upsample and Detect models with SiLU); {FIX}")
    raise UserError(f"refused to load {path}: it names {shown}, which no YOLOv5 detection checkpoint holds and "
                    f"which could run code if unpickled (nothing was run); {FIX}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    if "WeightsUnpickler error:" in text:  # torch wraps the unpickler's reason in a long how-to
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:160]


def read_pickle(path: Path) -> Any:
    """The file unpickled into stand-ins, or one UserError line (unknown global, damaged file)."""
    if torch.torch_version.TorchVersion(torch.__version__) < MIN_TORCH:
        raise UserError(f"{path} holds pickled model objects; reading YOLOv5 checkpoints safely needs torch >= "
                        f"{MIN_TORCH} (name-mapped weights_only allowlists), this is {torch.__version__}: upgrade torch")
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception as e:  # not a torch zip file, truncated, a TorchScript archive
        raise UserError(f"cannot read checkpoint {path} (truncated or corrupt: {_first_line(e)}); "
                        f"use another checkpoint") from None
    _check_globals(path, names)
    try:
        with torch.serialization.safe_globals(_SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UserError(f"refused to load {path}: {_first_line(e)} (nothing was run); {FIX}") from None
    except Exception as e:
        raise UserError(f"cannot read checkpoint {path} (truncated or corrupt: {_first_line(e)}); "
                        f"use another checkpoint") from None


# ----------------------------------------------------------------------------------------------- stand-in tree
class _Bad(ValueError):
    """The file's structure is not a YOLOv5 detection model; the message says where."""


def _kind(node: Any) -> str:
    return _short(node.name).split(".")[-1] if isinstance(node, StandIn) else type(node).__name__


def _attrs(node: Any, where: str) -> dict[str, Any]:
    if not isinstance(node, StandIn) or "attrs" not in node.__dict__:
        raise _Bad(f"{where} is a {_kind(node)}, not a saved module")
    return node.attrs


def _children(node: StandIn, where: str) -> dict[str, Any]:
    kids = _attrs(node, where).get("_modules", {})
    if not isinstance(kids, dict):
        raise _Bad(f"{where} has no module table")
    return {k: v for k, v in kids.items() if v is not None}


def state_dict(root: StandIn) -> dict[str, torch.Tensor]:
    """nn.Module.state_dict() of the stand-in tree, read from the attribute dicts alone: parameters and
    persistent buffers, depth first in registration order. Calls nothing on the file's objects."""
    out: dict[str, torch.Tensor] = {}
    visits = 0
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    while stack:
        node, prefix, depth = stack.pop()
        where = prefix.rstrip(".") or "the model"
        visits += 1
        # one module may sit in several places (YOLOv5 v7.0 shares one SiLU among all Convs), so a loop or
        # a fan-out bomb shows up as depth or size, not as a module seen twice
        if depth > MAX_DEPTH or visits > MAX_MODULES:
            raise _Bad(f"{where}: modules nested in a loop, too deep or too many")
        attrs = _attrs(node, where)
        skip = attrs.get("_non_persistent_buffers_set", set())
        for table in ("_parameters", "_buffers"):
            entries = attrs.get(table, {})
            if not isinstance(entries, dict) or not isinstance(skip, (set, frozenset)):
                raise _Bad(f"{where}: malformed {table}")
            for name, t in entries.items():
                if t is None or (table == "_buffers" and name in skip):
                    continue
                if not isinstance(t, torch.Tensor):
                    raise _Bad(f"{where}.{name} is a {type(t).__name__}, not a tensor")
                out[prefix + name] = t.detach()
        kids = list(_children(node, where).items())
        stack.extend((child, f"{prefix}{name}.", depth + 1) for name, child in reversed(kids))
    return out


def _names(model: dict[str, Any], nc: int) -> list[str]:
    """Class names as a list: YOLOv5 v7.0 stores {0: 'person', ...}, v6.x a list."""
    names = model.get("names")
    if isinstance(names, dict) and all(type(k) is int for k in names) and sorted(names) == list(range(len(names))):
        names = [names[i] for i in range(len(names))]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise _Bad(f"its class names are not a list or index->name mapping of text ({type(names).__name__})")
    if len(names) != nc:
        raise _Bad(f"it names {len(names)} classes but its Detect layer predicts {nc}")
    return list(names)


def _detect(model: StandIn) -> tuple[StandIn, dict[str, Any]]:
    layers = _children(model, "model").get("model")
    if _kind(layers) != "Sequential":
        raise _Bad("model.model is not the Sequential of layers a DetectionModel holds")
    kids = list(_children(layers, "model.model").values())
    if not kids or _kind(kids[-1]) != "Detect":
        raise _Bad("the last layer is not a Detect head")
    return kids[-1], _attrs(kids[-1], "the Detect layer")


def _check_batchnorm(root: StandIn) -> None:
    """BatchNorm eps enters every output: ours is fixed at BN_EPS, as in every YOLOv5 v6-v7 model."""
    stack, visits = [root], 0
    while stack and visits <= MAX_MODULES:  # state_dict() walked the same tree within these bounds
        node, visits = stack.pop(), visits + 1
        if _kind(node) == "BatchNorm2d" and node.attrs.get("eps") != BN_EPS:
            raise _Bad(f"a BatchNorm2d has eps {str(node.attrs.get('eps'))[:20]}, this project's models use {BN_EPS}")
        stack.extend(_children(node, "a layer").values())


def to_checkpoint(obj: Any, path: Path) -> dict[str, Any]:
    """Our checkpoint dict (utils.engine.checkpoint schema) from an unpickled YOLOv5 checkpoint, all but the
    format marker and version, which the caller (utils.engine.checkpoint.load_checkpoint) adds. The EMA is taken
    when present, as YOLOv5's own loader does; 'origin' records the file and its strides."""
    if not isinstance(obj, dict):
        raise _Bad(f"it holds a {type(obj).__name__}, not a checkpoint dict")
    model = obj.get("ema") or obj.get("model")
    if _kind(model) not in ("DetectionModel", "Model"):
        raise _Bad(f"its 'model' is a {_kind(model)}, not a YOLOv5 DetectionModel")
    attrs = _attrs(model, "model")
    detect, d = _detect(model)
    nl, nc, anchors, stride = d.get("nl"), d.get("nc"), d.get("_buffers", {}).get("anchors"), d.get("stride")
    if not isinstance(stride, torch.Tensor) or not isinstance(anchors, torch.Tensor) or not isinstance(nl, int):
        raise _Bad("its Detect layer lacks nl, stride or anchors")
    if nl != P5_LEVELS:
        what = f"a YOLOv5 P6 model ({nl} detection levels, e.g. yolov5s6)" if nl == 4 else \
            f"a YOLOv5 model with {nl} detection levels"
        raise UserError(f"{path} is {what}: not supported, only P5 models (3 levels) are; {FIX}")
    if tuple(stride.shape) != (nl,) or anchors.dim() != 3 or anchors.shape[0] != nl or anchors.shape[2] != 2:
        raise _Bad(f"its Detect layer has strides {tuple(stride.shape)} and anchors {tuple(anchors.shape)} for {nl} levels")
    if not isinstance(nc, int) or isinstance(nc, bool) or nc < 1:
        raise _Bad(f"its Detect layer's nc is {str(nc)[:20]!r}")
    yaml = attrs.get("yaml")
    if not isinstance(yaml, dict):
        raise _Bad("the model has no stored YAML dict")
    state = {k: v.half() if v.is_floating_point() else v for k, v in state_dict(model).items()}
    _check_batchnorm(model)
    # Both store anchors in grid units (pixels / stride) in the Detect buffer; a YAML holds pixels. The buffer
    # (after AutoAnchor, in FP16) is what the weights were trained with: it goes into the YAML, scaled back.
    anchors_px = anchors.float() * stride.float().view(-1, 1, 1)
    yaml = {**yaml, "nc": nc, "anchors": [row.flatten().tolist() for row in anchors_px]}
    epoch = obj.get("epoch")
    date = obj.get("date")
    return {
        "yaml": yaml, "nc": nc, "names": _names(attrs, nc), "model": state,
        "epoch": epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else -1,
        "metrics": {}, "date": date if isinstance(date, str) else dt.datetime.now().isoformat(timespec="seconds"),
        "origin": {"format": "yolov5", "file": path.name, "class": _kind(model), "stride": stride.float().tolist()},
    }


def load_yolov5(path: str | Path) -> dict[str, Any]:
    """A YOLOv5 checkpoint as our checkpoint's contents (to_checkpoint), or one UserError line saying what the file is and why
    it is refused. utils.engine.checkpoint.load_checkpoint calls this for any file whose pickle names classes."""
    path = Path(path)
    obj = read_pickle(path)
    try:
        return to_checkpoint(obj, path)
    except (_Bad, TypeError, AttributeError, KeyError, IndexError, RuntimeError) as e:  # a malformed or edited file
        raise UserError(f"{path} is not a YOLOv5 detection checkpoint this project can read: "
                        f"{_first_line(e)}; {FIX}") from None
