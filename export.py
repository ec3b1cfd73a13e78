"""Export a checkpoint to ONNX and TorchScript, for ONNX Runtime and torch.jit deployment.

    python export.py --weights best.pt --include onnx torchscript        # best.onnx, best.torchscript
    python export.py --weights best.pt --include onnx --dynamic          # any batch size and picture size
    python export.py --weights best.pt --include onnx --half --device 0  # FP16 graph, exported on the GPU

The exported graph is the fused inference model: a (B, 3, H, W) float32 batch in 0..1 in, the (B, N, 5 + nc)
float32 tensor that non_max_suppression takes out (the tensor test.py and detect.py feed to NMS). The files
carry their metadata (stride, class names, imgsz, batch, precision; utils/interop/backends.py), so test.py and detect.py
run them with --weights best.onnx / best.torchscript and no YAML.

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

--simplify runs onnxsim (an optional extra: pip install onnxsim); without it the flag is refused in one line.
torch's exporter (torch.export-based, the default since torch 2.9) already folds constants and removes dead
nodes, so the graph is lean without it.
"""
from __future__ import annotations

import io
import logging
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from models.yolo import load_model
from utils.device import select_device
from utils.errors import UserError, one_line, run_cli
from utils.files import atomic_write, resolve_weights
from utils.interop.backends import (META_KEY, PIP_EXPORT, Backend, OnnxBackend, TorchScriptBackend, make_metadata,
                                    require)
from utils.options import option, parse_options

LOGGER = logging.getLogger(__name__)

FORMATS = {"onnx": ".onnx", "torchscript": ".torchscript"}
# Agreement the export check asks of a graph against the PyTorch model it came from, relative to the largest
# output value: FP32 graphs differ only by the order of floating-point sums; FP16 rounds every activation.
CHECK_RTOL = {"fp32": 1e-4, "fp16": 5e-2}
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
    if "onnx" in opts.include:
        require("onnx", "--include onnx")
        require("onnxruntime", "--include onnx (the written file is checked with ONNX Runtime)")
        if opts.simplify:
            require("onnxsim", "--simplify")
    model, ckpt = load_model(weights, dev)
    dtype = torch.float16 if opts.half else torch.float32
    model = model.fuse().to(dtype).eval()  # BN folded in FP32 (load_model builds FP32), then cast
    form = InferenceForm(model, dtype).eval()
    names = list(ckpt.get("names") or [str(i) for i in range(ckpt["nc"])])
    stride = int(model.stride.max())
    asked = opts.imgsz or int(ckpt.get("imgsz", DEFAULT_IMGSZ))
    size = max(-(-asked // stride) * stride, stride)
    if size != asked:
        LOGGER.info(f"--imgsz {asked} is not a multiple of the model stride {stride}; using {size}")
    # a dynamic export is traced with 2 images, so no exporter can specialise the batch dimension to 1
    x = torch.rand(max(opts.batch_size, 2) if opts.dynamic else opts.batch_size, 3, size, size,
                   generator=torch.Generator().manual_seed(0)).to(dev)
    with torch.inference_mode():
        ref = form(x)
    meta = make_metadata(model.stride.tolist(), names, (size, size), x.shape[0], opts.dynamic,
                         "fp16" if opts.half else "fp32", dev.type, weights.name)
    written = []
    for fmt in opts.include:
        path = out_dir / (weights.stem + FORMATS[fmt])
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


def export_onnx(form: nn.Module, x: torch.Tensor, meta: dict, simplify: bool) -> bytes:
    """The ONNX model as bytes, with the metadata property set. torch's default (torch.export-based) exporter."""
    import json

    onnx = require("onnx", "--include onnx")
    require("onnxscript", "--include onnx (torch's ONNX exporter)")
    dim = torch.export.Dim.DYNAMIC
    dynamic_shapes = {"x": {0: dim, 2: dim, 3: dim}} if meta["dynamic"] else None
    with warnings.catch_warnings(), _quiet_torch_onnx():
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
        try:
            backend: Backend = OnnxBackend(probe, dev) if fmt == "onnx" else TorchScriptBackend(probe, dev)
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
    LOGGER.info(f"{fmt}: checked against PyTorch, max relative difference {err:.1e}")


def _ort_has_cuda() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


class _quiet_torch_onnx:
    """torch.onnx.export(dynamo=True) prints its progress; keep it out of our one-line-per-step log."""

    def __enter__(self):
        import contextlib

        self._stack = contextlib.ExitStack()
        self._stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        for name in ("torch.onnx", "torch.export", "torch._export", "onnxscript", "onnx_ir"):
            lg = logging.getLogger(name)
            self._stack.callback(lg.setLevel, lg.level)
            lg.setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False


# flags of YOLOv5's export.py this one does not take
YOLOV5_ONLY = {f: "this export.py writes ONNX and TorchScript only (--include onnx torchscript)" for f in (
    "--keras", "--optimize", "--int8", "--per-tensor", "--workspace", "--nms", "--agnostic-nms", "--topk-per-class",
    "--topk-all", "--iou-thres", "--conf-thres", "--data", "--inplace", "--verbose")}


def parse_opt(argv: Sequence[str] | None = None) -> ExportOptions:
    return parse_options(ExportOptions, argv, "Export a checkpoint to ONNX / TorchScript (fused, with metadata); "
                                              f"ONNX needs the export extras: {PIP_EXPORT}", YOLOV5_ONLY)


def main(argv: Sequence[str] | None = None) -> list[Path]:
    return export(parse_opt(argv))


if __name__ == "__main__":
    run_cli(main)
