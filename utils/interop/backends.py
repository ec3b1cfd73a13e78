"""One interface for every weights file test.py and detect.py can run: our .pt checkpoints, and the .onnx and
.torchscript files and <stem>_openvino_model/ folders written by export.py.

    backend = models.yolo.load_for_inference("best.onnx", device, half=None)   # any weights file
    pred = backend.predict(x)          # x: (B, 3, H, W) in 0..1, torch or NumPy -> (B, N, 5 + nc) torch tensor

`pred` is the tensor non_max_suppression takes (boxes xywh in input pixels, objectness, class scores), on
`backend.device`, so pre- and post-processing exist once. `backend(x, augment=False)` returns `(pred, None)`,
the eval-mode contract of models.yolo.Model, so the loops of test.py and detect.py call a backend exactly as
they call a live model.

Several checkpoints run as one `Ensemble` backend (YOLOv5's ensembles: predictions concatenated before NMS).

Exported files carry their metadata (stride, names, imgsz, batch size, precision) as JSON: an ONNX metadata
property, a TorchScript extra file and, in an OpenVINO folder, the file ampyolo.json beside the .xml/.bin, all
under the key `ampyolo`. It is parsed with json.loads and checked field by field; nothing in a file is evaluated.
A file without it was not written by export.py and is refused.

Static-shape exports (export.py without --dynamic) take one input shape. The backend feeds it: a smaller
batch is padded with blank images (and the extra rows dropped), a larger one is run in chunks, and a
smaller picture is padded right and bottom with the letterbox grey, which moves no box coordinate. Callers
still have to letterbox to at most the exported size: `fixed_imgsz` says which size to use, and test.py turns
its rectangular batches (which can exceed imgsz by a stride) off for such files.
"""
from __future__ import annotations

import json
import logging
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from utils.errors import UserError, one_line

LOGGER = logging.getLogger(__name__)

META_KEY = "ampyolo"  # ONNX metadata property / TorchScript extra file holding the JSON metadata
META_FORMAT = "ampyolo-export"
META_VERSION = 1
SUFFIXES = {".onnx": "onnx", ".torchscript": "torchscript", ".xml": "openvino"}  # anything else: a checkpoint
OPENVINO_DIR = "_openvino_model"  # export.py's folder name: <stem>_openvino_model/ holding <stem>.xml/.bin
PRECISIONS = ("fp32", "fp16", "int8")
PAD_VALUE = 114 / 255  # the letterbox grey, in 0..1
PIP_EXPORT = "pip install -r requirements-export.txt"


def require(module: str, purpose: str) -> Any:
    """Import an optional dependency, or one UserError line naming the pip command."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"{purpose} needs the package '{module}', which is not installed; run: {PIP_EXPORT}") from None


# ---------------------------------------------------------------------------------------------
# metadata


def make_metadata(strides: list[float], names: list[str], imgsz: tuple[int, int], batch_size: int, dynamic: bool,
                  precision: str, device: str, source: str) -> dict[str, Any]:
    """What an exported file needs to be used without a YAML. imgsz and batch are the traced sizes; with
    dynamic=True any batch size and any stride-multiple picture size run."""
    return {"format": META_FORMAT, "version": META_VERSION, "stride": [float(s) for s in strides],
            "names": list(names), "nc": len(names), "imgsz": [int(imgsz[0]), int(imgsz[1])],
            "batch": int(batch_size), "dynamic": bool(dynamic), "precision": precision, "device": device,
            "source": source}


def parse_metadata(text: str | bytes | None, path: Path) -> dict[str, Any]:
    """The metadata JSON of an exported file, checked field by field (one UserError line naming the file)."""
    fix = f"export it again with: python export.py --weights best.pt --include {exported_kind(path) or 'onnx'}"
    if text is None:
        raise UserError(f"{path} carries no '{META_KEY}' metadata, so it was not written by export.py "
                        f"(stride, class names and input size are unknown); {fix}")
    try:
        meta = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: its '{META_KEY}' metadata is not valid JSON ({str(e)[:80]}); {fix}") from None
    checks = (
        (isinstance(meta, dict) and meta.get("format") == META_FORMAT, "a metadata mapping of format " + META_FORMAT),
        (isinstance(meta.get("version"), int) and meta["version"] <= META_VERSION,
         f"version <= {META_VERSION} (update the code for newer files)"),
        (isinstance(meta.get("stride"), list) and len(meta["stride"]) > 0
         and all(isinstance(s, (int, float)) and s > 0 for s in meta["stride"]), "stride: a list of positive numbers"),
        (isinstance(meta.get("names"), list) and len(meta["names"]) > 0
         and all(isinstance(n, str) for n in meta["names"]), "names: a list of class names"),
        (meta.get("nc") == len(meta.get("names") or []), "nc equal to the number of names"),
        (isinstance(meta.get("imgsz"), list) and len(meta["imgsz"]) == 2
         and all(isinstance(s, int) and s > 0 for s in meta["imgsz"]), "imgsz: [height, width]"),
        (isinstance(meta.get("batch"), int) and meta["batch"] >= 1, "batch: a positive whole number"),
        (isinstance(meta.get("dynamic"), bool), "dynamic: true or false"),
        (meta.get("precision") in PRECISIONS, f"precision: {', '.join(PRECISIONS)}"),
        (meta.get("device") in ("cpu", "cuda"), "device: cpu or cuda"),
        (meta.get("calibration") is None or (isinstance(meta["calibration"], dict)
                                             and isinstance(meta["calibration"].get("data"), str)
                                             and isinstance(meta["calibration"].get("images"), int)),
         "calibration: {data: text, images: count}"),
    ) if isinstance(meta, dict) else ((False, "a metadata mapping"),)
    bad = next((what for ok, what in checks if not ok), None)
    if bad is not None:
        raise UserError(f"{path}: damaged or edited '{META_KEY}' metadata (expected {bad}); {fix}")
    return meta


# ---------------------------------------------------------------------------------------------
# the interface


class Backend:
    """A loaded weights file: `predict(x)` maps a (B, 3, H, W) batch in 0..1 to the (B, N, 5 + nc) tensor NMS takes.

    Attributes every backend has: kind ('pytorch', 'onnx', 'torchscript', 'openvino'), path, device, dtype (what the
    caller casts its input to), names, nc, stride (per-level strides, a tensor like Model.stride), imgsz
    ((h, w) a static export requires, None when any size runs), batch_size (the static batch, None when any),
    trained_imgsz (the size to run at when none is asked for: the checkpoint's training size, an export's traced
    size; None when the file does not say, as in converted YOLOv5 checkpoints).
    """

    kind = "base"

    def __init__(self, path: Path, device: torch.device, dtype: torch.dtype, names: list[str], strides: list[float],
                 imgsz: tuple[int, int] | None = None, batch_size: int | None = None) -> None:
        self.path, self.device, self.dtype = path, device, dtype
        self.names, self.nc = list(names), len(names)
        self.stride = torch.tensor(strides, dtype=torch.float32)
        self.imgsz, self.batch_size = imgsz, batch_size
        self.trained_imgsz: int | None = None

    @property
    def static(self) -> bool:
        return self.imgsz is not None

    def predict(self, x: torch.Tensor | np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
        if not self.static:
            return self._forward(x.to(self.device, self.dtype))
        return self._predict_static(x.to(self.device, self.dtype))

    def __call__(self, x: torch.Tensor | np.ndarray, augment: bool = False) -> tuple[torch.Tensor, None]:
        """Model's eval contract: (pred, raw maps); exported graphs hand out no raw maps."""
        if augment:
            raise UserError(f"--augment (test-time augmentation) needs the .pt checkpoint; {self.path} is an "
                            f"exported graph of the plain forward pass: drop --augment")
        return self.predict(x), None

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _predict_static(self, x: torch.Tensor) -> torch.Tensor:
        """Feed a fixed-shape graph: pad the picture right/bottom with letterbox grey (coordinates unchanged),
        pad the batch with blank images or split it in chunks, and drop the padded rows again."""
        (h, w), (hs, ws) = x.shape[2:], self.imgsz
        if h > hs or w > ws:
            raise UserError(f"{self.path} was exported for {hs}x{ws} pictures but got {h}x{w}; use --imgsz {max(hs, ws)} "
                            f"or export again with --dynamic")
        if (h, w) != (hs, ws):
            x = F.pad(x, (0, ws - w, 0, hs - h), value=PAD_VALUE)
        n, bs = x.shape[0], self.batch_size
        outs = []
        for i in range(0, n, bs):
            chunk = x[i:i + bs]
            if chunk.shape[0] < bs:
                chunk = torch.cat((chunk, chunk.new_full((bs - chunk.shape[0], *chunk.shape[1:]), PAD_VALUE)))
            outs.append(self._forward(chunk))
        return torch.cat(outs)[:n]


class PyTorchBackend(Backend):
    """Our .pt checkpoint: the fused FP32 model cast by the precision rule (utils.engine.amp.inference_dtype)."""

    kind = "pytorch"

    def __init__(self, path: Path, model: nn.Module, device: torch.device, dtype: torch.dtype, names: list[str],
                 trained_imgsz: int | None = None) -> None:
        super().__init__(path, device, dtype, names, model.stride.tolist())
        self.model, self.trained_imgsz = model, trained_imgsz

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[0]

    def __call__(self, x: torch.Tensor | np.ndarray, augment: bool = False) -> tuple[torch.Tensor, None]:
        if augment:
            x = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
            return self.model(x.to(self.device, self.dtype), augment=True)[0], None
        return self.predict(x), None


class Ensemble(Backend):
    """Several checkpoints run as one model, as YOLOv5's ensembles do (`--weights a.pt b.pt`): every member gets the
    same input and their raw predictions are concatenated along the box dimension, so one NMS picks among all of
    them. Members must predict the same classes (same names, so also the same count).

    Inputs are letterboxed to a multiple of the largest member stride (`stride` is that member's); the size to run
    at, when none is asked for, is the largest size a member was trained at (utils.inference.default_imgsz, where a
    member that records none counts as the command's default size)."""

    kind = "ensemble"

    def __init__(self, members: list[Backend]) -> None:
        first = members[0]
        for m in members[1:]:
            check_same_classes(first, m)
            if (m.device, m.dtype) != (first.device, first.dtype):  # loaded together, so only if a caller mixed them
                raise UserError(f"{first.path} and {m.path} run on {first.device} in {first.dtype} and on {m.device} in "
                                f"{m.dtype}; load ensemble members with one device and precision")
        widest = max(members, key=lambda m: float(m.stride.max()))
        label = Path("+".join(m.path.name for m in members))  # a name for log lines, not a file
        super().__init__(label, first.device, first.dtype, first.names, widest.stride.tolist())
        self.members = list(members)  # utils.inference.default_imgsz takes the size to run at from them
        LOGGER.info(f"ensemble of {len(members)} models: {', '.join(str(m.path) for m in members)}")

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([m._forward(x) for m in self.members], 1)

    def __call__(self, x: torch.Tensor | np.ndarray, augment: bool = False) -> tuple[torch.Tensor, None]:
        return torch.cat([m(x, augment=augment)[0] for m in self.members], 1), None


def check_same_classes(a: Backend, b: Backend) -> None:
    """One UserError line naming both files when two ensemble members predict different classes: their boxes
    would be compared under one class index that means two things."""
    if a.names == b.names:
        return

    def show(m: Backend) -> str:
        return f"{m.nc} ({', '.join(m.names[:3])}{', ...' if m.nc > 3 else ''})"

    raise UserError(f"{a.path} and {b.path} predict different classes, {show(a)} against {show(b)}; an ensemble "
                    f"needs models trained on the same classes: pass weights trained on one dataset")


class OnnxBackend(Backend):
    """A .onnx file through ONNX Runtime: the CUDA provider on a CUDA device where installed, else the CPU one.
    ONNX Runtime uses as many threads as torch does (torch.get_num_threads(), i.e. OMP_NUM_THREADS), so one
    setting governs both."""

    kind = "onnx"

    def __init__(self, path: Path, device: torch.device) -> None:
        ort = require("onnxruntime", f"running {path.name}")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = torch.get_num_threads()
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3  # warnings would land on stderr of a CLI that promises one-line errors
        providers = ["CPUExecutionProvider"]
        if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
        elif device.type == "cuda":
            LOGGER.info(f"{path.name}: this onnxruntime has no CUDA provider (pip install onnxruntime-gpu for it); "
                        f"running on the CPU provider")
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=providers)
        except Exception as e:  # ONNX Runtime reports a damaged file as one of several Fail/InvalidGraph errors
            raise UserError(f"cannot load {path} with ONNX Runtime ({one_line(e)}); the file is damaged or "
                            f"truncated: export it again with python export.py") from None
        meta = parse_metadata(self.session.get_modelmeta().custom_metadata_map.get(META_KEY), path)
        super().__init__(path, device, torch.float32, meta["names"], meta["stride"],
                         None if meta["dynamic"] else tuple(meta["imgsz"]), None if meta["dynamic"] else meta["batch"])
        self.meta, self.trained_imgsz = meta, max(meta["imgsz"])
        self.input_name = self.session.get_inputs()[0].name

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.session.run(None, {self.input_name: x.detach().cpu().numpy()})[0]
        return torch.from_numpy(out).to(self.device)


class TorchScriptBackend(Backend):
    """A .torchscript file through torch.jit.load. A traced graph keeps the device type it was traced on,
    so it runs there (metadata 'device')."""

    kind = "torchscript"

    def __init__(self, path: Path, device: torch.device) -> None:
        meta = parse_metadata(read_torchscript_metadata(path), path)
        if meta["device"] != device.type:
            raise UserError(f"{path} was exported on {meta['device']} and a traced graph runs only there; use "
                            f"--device {'cpu' if meta['device'] == 'cpu' else '0'} or export it again on {device.type}")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch 2.14 marks torch.jit deprecated
                self.module = torch.jit.load(str(path), map_location=device).eval()
        except Exception as e:  # a damaged archive fails inside the C++ reader with RuntimeError and others
            raise UserError(f"cannot load {path} with torch.jit.load ({one_line(e)}); the file is damaged or "
                            f"truncated: export it again with python export.py") from None
        super().__init__(path, device, torch.float32, meta["names"], meta["stride"],
                         None if meta["dynamic"] else tuple(meta["imgsz"]), None if meta["dynamic"] else meta["batch"])
        self.meta, self.trained_imgsz = meta, max(meta["imgsz"])

    @torch.inference_mode()
    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


class OpenVinoBackend(Backend):
    """An OpenVINO model folder (<stem>_openvino_model/: <stem>.xml, <stem>.bin, ampyolo.json) on OpenVINO's CPU
    device, with as many threads as torch (torch.get_num_threads(), i.e. OMP_NUM_THREADS), as for ONNX Runtime.

    Arithmetic is pinned to FP32 (INFERENCE_PRECISION_HINT f32): on CPUs with bf16 instructions OpenVINO may
    otherwise run an FP32 model in bf16, and the precision is the one export.py measured and wrote down
    (metadata 'precision'), not one the runtime picks. FP16 folders hold FP16 weights computed in FP32; INT8
    folders run their quantized layers in INT8 and the rest (the box decoding) in FP32."""

    kind = "openvino"

    def __init__(self, path: Path, device: torch.device) -> None:
        folder, xml = openvino_files(path)
        meta_file = folder / f"{META_KEY}.json"
        meta = parse_metadata(meta_file.read_bytes() if meta_file.is_file() else None, folder)
        ov = require("openvino", f"running {folder.name}")
        check_ir(xml)
        config = {"INFERENCE_NUM_THREADS": torch.get_num_threads(), "INFERENCE_PRECISION_HINT": "f32",
                  "PERFORMANCE_HINT": "LATENCY"}
        try:
            core = ov.Core()
            self.request = core.compile_model(core.read_model(str(xml)), "CPU", config).create_infer_request()
        except Exception as e:  # noqa: BLE001 - a damaged .xml/.bin fails in the C++ reader as RuntimeError and others
            raise UserError(f"cannot load {xml} with OpenVINO ({one_line(e)}); the folder is damaged or incomplete "
                            f"(.xml and .bin belong together): export it again with python export.py --include "
                            f"openvino") from None
        if device.type != "cpu":
            LOGGER.info(f"{folder.name}: OpenVINO runs it on the CPU; outputs are moved to {device}")
        super().__init__(folder, device, torch.float32, meta["names"], meta["stride"],
                         None if meta["dynamic"] else tuple(meta["imgsz"]), None if meta["dynamic"] else meta["batch"])
        self.meta, self.trained_imgsz = meta, max(meta["imgsz"])

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.request.infer({0: x.detach().cpu().numpy()})[0]  # a copy: the request reuses its buffers
        return torch.from_numpy(out).to(self.device)


def check_ir(xml: Path) -> None:
    """Refuse a damaged model before OpenVINO's reader sees it: a malformed .xml went on to its other front ends
    (TensorFlow's among them), and in the test suite the process crashed (SIGSEGV) some tests later. The .xml must
    parse (Python's expat, with its entity-expansion limits) as a <net> with layers and edges, and every weight
    range it names must lie inside the .bin beside it."""
    import xml.etree.ElementTree as ET

    fix = "the folder is damaged or incomplete (.xml and .bin belong together): export it again with python " \
          "export.py --include openvino"
    try:
        root = ET.parse(xml).getroot()
    except (ET.ParseError, OSError) as e:
        raise UserError(f"cannot load {xml} with OpenVINO (not a readable model description: {one_line(e)}); {fix}") \
            from None
    if root.tag != "net" or root.find("layers") is None or root.find("edges") is None:
        raise UserError(f"cannot load {xml} with OpenVINO (no <net> with layers and edges); {fix}")
    ranges = [(d.get("offset"), d.get("size")) for d in root.iter("data") if d.get("offset") is not None]
    bin_file = xml.with_suffix(".bin")
    size = bin_file.stat().st_size if bin_file.is_file() else -1
    try:
        end = max((int(o) + int(n) for o, n in ranges), default=0)
    except ValueError:
        end = None
    if end is None or (ranges and size < end):
        have = "a missing" if size < 0 else f"a {size:,}-byte"
        raise UserError(f"cannot load {xml} with OpenVINO (its weights need {end or '?'} bytes of {bin_file.name}, "
                        f"{have} file); {fix}")


def openvino_files(path: Path) -> tuple[Path, Path]:
    """(folder, .xml) of an OpenVINO model given as its folder or its .xml file; one UserError line when the folder
    holds no model. A folder with several .xml files takes the one named after it (<stem>_openvino_model/<stem>.xml)."""
    if not path.is_dir():
        return path.parent, path
    xmls = sorted(path.glob("*.xml"))
    named = path / (path.name.removesuffix(OPENVINO_DIR) + ".xml")
    if len(xmls) == 1 or named in xmls:
        return path, named if named in xmls else xmls[0]
    raise UserError(f"{path} is not an OpenVINO model folder ({'several' if xmls else 'no'} .xml files in it); pass a "
                    f"<stem>{OPENVINO_DIR} folder written by: python export.py --weights best.pt --include openvino")


def read_torchscript_metadata(path: Path) -> bytes | None:
    """The metadata extra file of a TorchScript archive, read with zipfile before any graph is loaded."""
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith(f"/extra/{META_KEY}.json")), None)
            return None if name is None else z.read(name)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise UserError(f"cannot read {path} ({one_line(e)}); it is not a TorchScript archive or it is damaged: "
                        f"export it again with python export.py") from None


# ---------------------------------------------------------------------------------------------
# loading


def exported_kind(path: Path) -> str | None:
    """'onnx', 'torchscript' or 'openvino' (a folder, or its .xml) for what export.py writes; None for a checkpoint."""
    return "openvino" if path.is_dir() else SUFFIXES.get(path.suffix.lower())


def is_exported(path: Path) -> bool:
    """A file or folder export.py wrote (.onnx, .torchscript, an OpenVINO folder), as opposed to a checkpoint."""
    return exported_kind(path) is not None


BACKENDS = {"onnx": OnnxBackend, "torchscript": TorchScriptBackend, "openvino": OpenVinoBackend}


def load_exported(path: Path, device: torch.device, half: bool | None = None) -> Backend:
    """The backend for an exported file, chosen by suffix: .onnx -> ONNX Runtime, .torchscript -> torch.jit, a
    folder (or its .xml) -> OpenVINO. Checkpoints are models/yolo.load_for_inference's (a PyTorchBackend around the
    fused model).

    An exported file's precision was fixed at export (metadata 'precision'); `half` does not change it."""
    backend = BACKENDS[exported_kind(path)](path, device)
    if half is not None and half != (backend.meta["precision"] == "fp16"):
        LOGGER.info(f"{path.name} holds an {backend.meta['precision'].upper()} graph (fixed at export); "
                    f"--{'' if half else 'no-'}half does not change it")
    shape = "dynamic shapes" if not backend.static else \
        f"static shape {backend.batch_size}x3x{backend.imgsz[0]}x{backend.imgsz[1]}"
    calib = backend.meta.get("calibration")
    calibrated = f", calibrated on {calib['images']} pictures of {Path(calib['data']).name}" if calib else ""
    LOGGER.info(f"{path.name}: {backend.kind} {backend.meta['precision']} graph, {backend.nc} classes, {shape}"
                f"{calibrated}")
    return backend


def fixed_imgsz(model: Any, imgsz: int | tuple[int, ...] | list[int]) -> Any:
    """The size to letterbox to: `imgsz`, except for a static-shape export, which takes its own size."""
    size = getattr(model, "imgsz", None) if isinstance(model, Backend) else None
    if size is None:
        return imgsz
    want = max(size)
    asked = max(imgsz) if isinstance(imgsz, (tuple, list)) else imgsz
    if asked != want:
        LOGGER.info(f"{model.path.name} was exported with a fixed {size[0]}x{size[1]} input; using --imgsz {want} "
                    f"(export with --dynamic for other sizes)")
    return want if not isinstance(imgsz, (tuple, list)) else (want, want)
