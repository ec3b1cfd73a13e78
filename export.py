"""Export a checkpoint to ONNX, TorchScript and OpenVINO, for ONNX Runtime, torch.jit and OpenVINO deployment.

    python export.py --weights best.pt --include onnx torchscript        # best.onnx, best.torchscript
    python export.py --weights best.pt --include onnx --dynamic          # any batch size and picture size
    python export.py --weights best.pt --include onnx --half --device 0  # FP16 graph, exported on the GPU
    python export.py --weights best.pt --include openvino                # best_openvino_model/ (FP32)
    python export.py --weights best.pt --include openvino --int8         # INT8, calibrated on the training pictures

The exported graph is the fused inference model: a (B, 3, H, W) float32 batch in 0..1 in, the (B, N, 5 + nc)
float32 tensor that non_max_suppression takes out (the tensor test.py and detect.py feed to NMS). The files
carry their metadata (stride, class names, imgsz, batch, precision; utils/interop/backends.py), so test.py and detect.py
run them with --weights best.onnx / best.torchscript / best_openvino_model and no YAML.

Every file is checked before it is written: it is loaded back (ONNX Runtime's CPU or CUDA provider, torch.jit)
and run on the export input, and its output must match the PyTorch model's. Only then is it written, atomically,
so a file that would fail at load is never left behind.

Precision. FP32 is the default everywhere. --half makes an FP16 graph (FP16 weights and activations) with a
float32 boundary: the graph casts its input to FP16 and its output back, so callers feed and read float32 as
for an FP32 file. On a CUDA machine it is traced on the GPU. On a CPU-only machine:
  - ONNX: written. ONNX Runtime's CPU provider loads and runs the FP16 graph (where it has no FP16 kernel it
    computes in FP32 behind inserted casts). Measured at commit 0c2e1f2 (our COCO128 yolov5n, 320 px, one
    thread, CPU time; bench/results/export_fp16_cpu.txt): 13.1 ms against 12.9 ms for FP32
    (0.99x), boxes within 0.33 px and scores within 8e-4 of PyTorch FP32, test.py mAP equal within 0.0001,
    file 4.2 MB against 7.9 MB. So it brings a half-size file and a GPU deployment, not CPU speed; a
    warning says so.
  - TorchScript: refused. A traced graph runs only on the device type it was traced on, and FP16 on a CPU
    is emulated, about 30x slower than FP32 (utils.engine.amp.CPU_FP16_INFER_SLOWDOWN).

OpenVINO (utils/interop/openvino_export.py): the ONNX graph read by OpenVINO's runtime and written as a folder
beside the weights, <stem>_openvino_model/ with <stem>.xml/.bin and ampyolo.json (the metadata). FP32 by default;
--half stores FP16 weights (computed in FP32 on a CPU: a half-size folder, the same speed); --int8 quantizes with
NNCF, calibrated on up to 300 training pictures of --data (default: the dataset the checkpoint records) through
test.py's and detect.py's letterbox, and the metadata says so. An INT8 model is checked on a calibration picture
(random noise is not what it was calibrated for) with the looser INT8 tolerance; its mAP is what to compare
(docs/export.md).

--simplify runs onnxsim (an optional extra: pip install onnxsim); without it the flag is refused in one line.
torch's exporter (torch.export-based, the default since torch 2.9) already folds constants and removes dead
nodes, so the graph is lean without it.
"""
from __future__ import annotations

import copy
import io
import logging
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from models.yolo import load_model
from utils.device import select_device
from utils.errors import UserError, one_line, quiet, run_cli
from utils.files import atomic_write, replace_folder, resolve_weights
from utils.interop.backends import (BACKENDS, META_KEY, OPENVINO_DIR, PIP_EXPORT, Backend, make_metadata, require)
from utils.options import option, parse_options

LOGGER = logging.getLogger(__name__)

FORMATS = {"onnx": ".onnx", "torchscript": ".torchscript", "openvino": OPENVINO_DIR}
# Agreement the export check asks of a graph against the PyTorch model it came from, relative to the largest
# output value: FP32 graphs differ only by the order of floating-point sums; FP16 rounds every activation (or, in
# OpenVINO, every weight); INT8 rounds activations to 256 levels, which moves a confident box by a few percent of its
# size (up to ~10% of the largest output on COCO128 pictures with yolov5n). The INT8 check catches a broken graph;
# its mAP is the measure of the quantization (docs/export.md).
CHECK_RTOL = {"fp32": 1e-4, "fp16": 5e-2, "int8": 0.25}
MAX_IMGSZ = 8192
DEFAULT_IMGSZ = 640  # when neither --imgsz nor the checkpoint says (converted YOLOv5 checkpoints: YOLOv5's own size)
MAX_BATCH = 1024


@dataclass(frozen=True)
class ExportOptions:
    weights: str = option("best.pt", "checkpoint (train.py's or YOLOv5's)")
    include: list = option(["onnx"], f"formats: {' '.join(FORMATS)}")
    imgsz: int | None = option(None, "square input size in pixels (the fixed size of a static export; the trace size "
                                     "with --dynamic; default: the size the weights were trained at, else 640)",
                               "--imgsz", "--img", "--img-size", type=int)
    batch_size: int = option(1, "batch size of a static export")
    half: bool = option(False, "FP16 graph with float32 input/output (see export.py notes)")
    dynamic: bool = option(False, "any batch size and picture size (multiples of the stride)")
    simplify: bool = option(False, "simplify the ONNX graph with onnxsim (pip install onnxsim)")
    int8: bool = option(False, "OpenVINO INT8: post-training quantization with NNCF, calibrated on training pictures")
    data: str | None = option(None, "dataset YAML whose training pictures calibrate --int8 (default: the one the "
                                    "checkpoint was trained on)")
    device: str = option("", "cuda device (0) or cpu; default: first GPU if any")
    output_dir: str | None = option(None, "where the files go (default: beside the weights)")


class InferenceForm(nn.Module):
    """The fused model as exported: float32 in, the prediction tensor NMS takes out, float32.

    The casts at both ends make an FP16 graph's boundary float32; for an FP32 model they are no-ops."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.to(self.dtype))[0].float()


def run(weights: str | Path, **options) -> list[Path]:
    """Export `weights` to each format in options' `include`; `options` are ExportOptions fields. Returns the
    paths written."""
    if options.get("output_dir") is not None:
        options["output_dir"] = str(options["output_dir"])
    return export(ExportOptions(weights=str(weights), **{**options, "include": list(options.get("include", ["onnx"]))}))


def export(opts: ExportOptions) -> list[Path]:
    """Check everything a user can get wrong, load and fuse the model, then export, verify and write each format."""
    check_options(opts)
    weights = resolve_weights(opts.weights)
    out_dir = Path(opts.output_dir) if opts.output_dir else weights.parent
    check_writable(out_dir)
    dev = select_device(opts.device)
    check_half(opts, dev)
    check_packages(opts)
    model, ckpt = load_model(weights, dev)
    model = model.fuse().eval()  # BN folded in FP32 (load_model builds FP32); FP16 copies are cast from it
    names = list(ckpt.get("names") or [str(i) for i in range(ckpt["nc"])])
    stride = int(model.stride.max())
    asked = opts.imgsz or int(ckpt.get("imgsz", DEFAULT_IMGSZ))
    size = max(-(-asked // stride) * stride, stride)
    if size != asked:
        LOGGER.info(f"--imgsz {asked} is not a multiple of the model stride {stride}; using {size}")
    # before the slow part: a dataset that gives no pictures fails in a second, not after the conversion
    calib = calibration_set(calibration_data(opts, ckpt, weights), size, stride, opts) if opts.int8 else None
    # a dynamic export is traced with 2 images, so no exporter can specialise the batch dimension to 1
    x = torch.rand(max(opts.batch_size, 2) if opts.dynamic else opts.batch_size, 3, size, size,
                   generator=torch.Generator().manual_seed(0)).to(dev)
    fp32 = InferenceForm(model, torch.float32).eval()
    cast = opts.half and any(f != "openvino" for f in opts.include)  # OpenVINO compresses FP32 weights itself
    form = InferenceForm(copy.deepcopy(model).half(), torch.float16).eval() if cast else fp32
    with torch.inference_mode():
        ref = form(x)
    meta = make_metadata(model.stride.tolist(), names, (size, size), x.shape[0], opts.dynamic,
                         "fp16" if opts.half else "fp32", dev.type, weights.name)
    written = []
    for fmt in opts.include:
        path = out_dir / (weights.stem + FORMATS[fmt])
        if fmt == "openvino":
            export_openvino(fp32, x, meta, path, opts.half, calib)
        else:
            data = export_onnx(form, x, meta, opts.simplify) if fmt == "onnx" else export_torchscript(form, x, meta)
            verify(data, fmt, path, x, ref, meta, dev)
            atomic_write(path, lambda f, d=data: f.write(d), fix="choose a writable folder with --output-dir")
            LOGGER.info(f"{fmt}: wrote {path} ({len(data) / 1e6:.1f} MB, {meta['precision']}, "
                        f"{'dynamic shapes' if opts.dynamic else f'input {x.shape[0]}x3x{size}x{size}'})")
        written.append(path)
    for p in written:
        LOGGER.info(f"run it with: python detect.py --weights {p}" + (f" --imgsz {size}" if not opts.dynamic else ""))
    return written


def check_options(opts: ExportOptions) -> None:
    bad = [f for f in opts.include if f not in FORMATS]
    if bad or not opts.include:
        raise UserError(f"--include {' '.join(bad) or '(nothing)'}: choose from {', '.join(FORMATS)}")
    if opts.imgsz is not None and not 1 <= opts.imgsz <= MAX_IMGSZ:
        raise UserError(f"--imgsz {opts.imgsz} must lie in 1..{MAX_IMGSZ} pixels")
    if not 1 <= opts.batch_size <= MAX_BATCH:
        raise UserError(f"--batch-size {opts.batch_size} must lie in 1..{MAX_BATCH}")
    if opts.simplify and "onnx" not in opts.include:
        raise UserError("--simplify applies to ONNX only; add --include onnx or drop --simplify")
    if (opts.int8 or opts.data) and "openvino" not in opts.include:
        raise UserError(f"{'--int8' if opts.int8 else '--data'} applies to OpenVINO only; add --include openvino")
    if opts.data and not opts.int8:
        raise UserError("--data names the pictures that calibrate --int8; add --int8 or drop --data")
    if opts.int8 and opts.half:
        raise UserError("--int8 and --half are two precisions for one folder; choose one")


def check_packages(opts: ExportOptions) -> None:
    """The optional packages each asked format needs, before any work: one line naming the pip command."""
    if "onnx" in opts.include:
        require("onnx", "--include onnx")
        require("onnxruntime", "--include onnx (the written file is checked with ONNX Runtime)")
        if opts.simplify:
            require("onnxsim", "--simplify")
    if "openvino" in opts.include:
        for module in ("onnx", "onnxscript", "openvino"):
            require(module, "--include openvino")
        if opts.int8:
            from utils.interop.openvino_export import require_nncf

            require_nncf()


def check_writable(folder: Path) -> None:
    """Fail before any work when the output folder cannot take a file (tried, not guessed: root ignores modes)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UserError(f"cannot write into {folder} ({e.strerror or e}); choose a writable folder with "
                        f"--output-dir") from None


def check_half(opts: ExportOptions, dev: torch.device) -> None:
    """--half where it can be honoured (see the module notes), else one line that says why."""
    if not opts.half:
        return
    if dev.type not in ("cuda", "cpu"):
        raise UserError(f"--half needs a CUDA GPU (or the CPU for ONNX); {dev.type} cannot export FP16: drop --half")
    if dev.type == "cpu" and "torchscript" in opts.include:
        raise UserError("--half --include torchscript needs a CUDA GPU: a traced graph runs only on the device it was "
                        "traced on, and FP16 on a CPU is emulated (~30x slower than FP32); export on a GPU "
                        "(--device 0) or drop --half")
    if dev.type == "cpu":
        LOGGER.warning("warning: FP16 ONNX from a CPU-only machine: ONNX Runtime's CPU provider runs it, but no faster "
                       "than FP32 (most CPUs have no FP16 arithmetic); it halves the file and suits GPU deployment. "
                       "For CPU inference FP32 stays the default")


def calibration_data(opts: ExportOptions, ckpt: dict, weights: Path) -> str:
    """The dataset YAML whose training pictures calibrate --int8: --data, else the one the checkpoint records."""
    data = opts.data or ckpt.get("data")
    if not data:
        raise UserError(f"--int8 calibrates on training pictures, and {weights.name} records no dataset; pass "
                        f"--data with the data YAML it was trained on")
    return str(data)


def calibration_set(data: str, size: int, stride: int, opts: ExportOptions) -> tuple[list[np.ndarray], dict]:
    """(calibration batches, what they are for the metadata): up to MAX_CALIBRATION training pictures of `data`,
    spread evenly over its list, letterboxed by test.py's and detect.py's own pre-processing (models/api.preprocess):
    to the exported square for a static export, to the smallest stride rectangle for a dynamic one. A static batch
    of B takes B pictures per item. Pictures that cannot be read are skipped and counted; none readable is one line."""
    from models.api import preprocess
    from utils.data.data_config import load_data_config
    from utils.data.images import load_image_file
    from utils.data.labels import list_image_files
    from utils.interop.openvino_export import MAX_CALIBRATION

    cfg = load_data_config(data)
    files = list_image_files(cfg["train"])
    spread = np.linspace(0, len(files) - 1, min(len(files), MAX_CALIBRATION)).round().astype(int)
    picked = [files[i] for i in sorted(set(spread.tolist()))]
    pictures, bad = [], []
    for f in picked:
        try:
            im = load_image_file(f)
        except ValueError as e:
            bad.append(f"{f}: {e}")
            continue
        pictures.append(preprocess([im], (size, size), stride, not opts.dynamic, torch.device("cpu"), torch.float32)[0])
    if not pictures:
        raise UserError(f"--int8: none of the {len(picked)} calibration pictures of {cfg['yaml_file']} can be read "
                        f"({bad[0]}); fix the pictures or pass another --data")
    if bad:
        LOGGER.warning(f"warning: --int8 skipped {len(bad)} of {len(picked)} calibration pictures that cannot be read "
                       f"(first: {bad[0]})")
    read, per = len(pictures), 1 if opts.dynamic else opts.batch_size
    pictures = [pictures[i % read] for i in range(max(read, per))]  # a static batch needs `per` pictures
    batches = [torch.cat(pictures[i:i + per]).numpy() for i in range(0, len(pictures) - per + 1, per)]
    return batches, {"data": str(cfg["yaml_file"]), "images": read}


def export_onnx(form: nn.Module, x: torch.Tensor, meta: dict, simplify: bool) -> bytes:
    """The ONNX model as bytes, with the metadata property set. torch's default (torch.export-based) exporter."""
    import json

    onnx = require("onnx", "--include onnx")
    require("onnxscript", "--include onnx (torch's ONNX exporter)")
    dim = torch.export.Dim.DYNAMIC
    dynamic_shapes = {"x": {0: dim, 2: dim, 3: dim}} if meta["dynamic"] else None
    # torch.onnx.export(dynamo=True) prints its progress
    with warnings.catch_warnings(), quiet(("torch.onnx", "torch.export", "torch._export", "onnxscript", "onnx_ir"),
                                          logging.ERROR):
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(form, (x,), dynamo=True, input_names=["images"], output_names=["output0"],
                                        dynamic_shapes=dynamic_shapes, external_data=False, verbose=False)
        except Exception as e:  # noqa: BLE001 - the exporter fails in many ways; none is the user's to debug
            raise UserError(f"torch could not export {meta['source']} to ONNX ({one_line(e)}); try "
                            f"--include torchscript, or another torch version") from None
    proto = program.model_proto
    if simplify:
        proto = _simplify(proto, x, meta)
    del proto.metadata_props[:]
    entry = proto.metadata_props.add()
    entry.key, entry.value = META_KEY, json.dumps(meta)
    proto.producer_name = "ampyolo export.py"
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def _simplify(proto, x: torch.Tensor, meta: dict):
    onnxsim = require("onnxsim", "--simplify")
    try:
        simple, ok = onnxsim.simplify(proto)
    except Exception as e:  # noqa: BLE001
        LOGGER.warning(f"warning: onnxsim failed ({one_line(e)}); writing the graph unsimplified")
        return proto
    if not ok:
        LOGGER.warning("warning: onnxsim could not check its result; writing the graph unsimplified")
        return proto
    return simple


def export_torchscript(form: nn.Module, x: torch.Tensor, meta: dict) -> bytes:
    """The traced module as bytes, metadata in the extra file ampyolo.json. The trace records how shapes flow
    (models.yolo.Detect builds its grid from the map size while tracing), so a --dynamic file runs any size."""
    import json

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarnings about shape arithmetic: the trace keeps it symbolic
        traced = torch.jit.trace(form, x, check_trace=False)
        buf = io.BytesIO()  # torch 2.14 marks torch.jit deprecated (FutureWarning); it is what --include asks for
        torch.jit.save(traced, buf, _extra_files={f"{META_KEY}.json": json.dumps(meta)})
    return buf.getvalue()


def export_openvino(form: nn.Module, x: torch.Tensor, meta: dict, folder: Path, half: bool,
                    calib: tuple[list[np.ndarray], dict] | None) -> None:
    """<stem>_openvino_model/ from the FP32 `form`: its ONNX graph read by OpenVINO, quantized to INT8 with `calib`
    (batches, source) or its weights stored in FP16 with `half`, checked like the other formats (an INT8 model on
    a calibration picture), staged in a temp folder beside `folder` and then moved into place."""
    meta = {**meta, "device": "cpu"}  # OpenVINO runs it on the CPU, wherever it was traced
    try:
        _stage_openvino(form, x, meta, folder, half, calib)
    except OSError as e:  # a full disk or a folder taken away while staging: the temp folder goes, nothing is half-written
        raise UserError(f"could not write {folder}: {e.strerror or one_line(e)}; choose a writable folder with "
                        f"--output-dir") from None
    size = sum(p.stat().st_size for p in folder.iterdir())
    LOGGER.info(f"openvino: wrote {folder}/ ({size / 1e6:.1f} MB, {meta['precision']}, "
                f"{'dynamic shapes' if meta['dynamic'] else 'input {}x3x{}x{}'.format(x.shape[0], *meta['imgsz'])})")


def _stage_openvino(form: nn.Module, x: torch.Tensor, meta: dict, folder: Path, half: bool,
                    calib: tuple[list[np.ndarray], dict] | None) -> None:
    """export_openvino's work in a temp folder beside `folder`; `meta` gets the precision and calibration."""
    from utils.interop import openvino_export

    with tempfile.TemporaryDirectory(prefix=".export-check-", dir=folder.parent) as tmp:
        onnx_file = Path(tmp) / "graph.onnx"
        onnx_file.write_bytes(export_onnx(form, x, {**meta, "precision": "fp32"}, simplify=False))
        model = openvino_export.read_onnx(onnx_file)
        if calib is not None:
            batches, meta["calibration"] = calib
            t0 = time.perf_counter()
            model = openvino_export.quantize(model, batches)
            LOGGER.info(f"openvino: INT8 calibrated on {meta['calibration']['images']} pictures of "
                        f"{meta['calibration']['data']} in {time.perf_counter() - t0:.0f} s")
            meta["precision"], x = "int8", torch.from_numpy(batches[0]).to(x.device)
        with torch.inference_mode():
            ref = form(x)
        staged = Path(tmp) / folder.name
        openvino_export.save(model, staged / (folder.name.removesuffix(OPENVINO_DIR) + ".xml"), meta, half)
        check_backend(staged, "openvino", x, ref, meta, torch.device("cpu"))
        replace_folder(staged, folder, fix="choose a writable folder with --output-dir")


def verify(data: bytes, fmt: str, path: Path, x: torch.Tensor, ref: torch.Tensor, meta: dict, dev: torch.device) -> None:
    """Load the exported bytes as test.py / detect.py would and compare with PyTorch; refuse to write on failure."""
    with tempfile.TemporaryDirectory(prefix=".export-check-", dir=path.parent) as tmp:
        probe = Path(tmp) / path.name
        try:
            probe.write_bytes(data)
        except OSError as e:  # a full disk: the same line as atomic_write's below, and nothing left behind
            raise UserError(f"could not write {path}: {e.strerror or e}; nothing written. Free disk space or "
                            f"choose another folder with --output-dir") from None
        if fmt == "onnx" and dev.type == "cuda" and not _ort_has_cuda():
            dev = torch.device("cpu")  # a CPU-only onnxruntime still proves the file loads and agrees
        check_backend(probe, fmt, x, ref, meta, dev)


def check_backend(probe: Path, fmt: str, x: torch.Tensor, ref: torch.Tensor, meta: dict, dev: torch.device) -> None:
    """Run the exported `probe` through its backend and compare with `ref` within CHECK_RTOL; one line if not."""
    try:
        backend: Backend = BACKENDS[fmt](probe, dev)
        with torch.inference_mode():
            out = backend.predict(x)
    except UserError as e:
        raise UserError(f"{fmt} export of {meta['source']} does not load back ({e}); nothing written") from None
    except Exception as e:  # noqa: BLE001 - e.g. an FP16 node the provider cannot run
        raise UserError(f"{fmt} export of {meta['source']} does not run ({one_line(e)}); nothing written"
                        f"{'; drop --half' if meta['precision'] == 'fp16' else ''}") from None
    out, ref = out.float().cpu(), ref.cpu()
    err = ((out - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item()
    limit = CHECK_RTOL[meta["precision"]]
    if not (out.shape == ref.shape and err <= limit):
        raise UserError(f"{fmt} export of {meta['source']} disagrees with PyTorch (relative error {err:.2g} > {limit:g}, "
                        f"shapes {tuple(out.shape)} / {tuple(ref.shape)}); nothing written")
    LOGGER.info(f"{fmt}: checked against PyTorch, max relative difference {err:.1e} (limit {limit:g})")


def _ort_has_cuda() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


# flags of YOLOv5's export.py this one does not take
YOLOV5_ONLY = {f: "this export.py writes ONNX, TorchScript and OpenVINO only (--include onnx torchscript openvino)"
               for f in ("--keras", "--optimize", "--per-tensor", "--workspace", "--nms", "--agnostic-nms",
                         "--topk-per-class", "--topk-all", "--iou-thres", "--conf-thres", "--inplace", "--verbose")}


def parse_opt(argv: Sequence[str] | None = None) -> ExportOptions:
    return parse_options(ExportOptions, argv, "Export a checkpoint to ONNX / TorchScript / OpenVINO (fused, with "
                                              f"metadata); ONNX and OpenVINO need the export extras: {PIP_EXPORT}",
                         YOLOV5_ONLY)


def main(argv: Sequence[str] | None = None) -> list[Path]:
    return export(parse_opt(argv))


if __name__ == "__main__":
    run_cli(main)
