"""export.py's OpenVINO side: the ONNX export read into OpenVINO, INT8 post-training quantization with NNCF, and
the model folder written (<stem>_openvino_model/: <stem>.xml, <stem>.bin, ampyolo.json).

Why from the ONNX export and not openvino.convert_model on the torch module: the ONNX graph is the one export.py
already builds and checks (torch.export-based), and OpenVINO's runtime reads it with its own ONNX reader
(Core.read_model), offline and without the conversion tool (ovc), which also reports usage over the network unless
a user opted out. convert_model traces with torch.jit, which torch 2.14 marks deprecated. What ovc would add, its
graph clean-up (the MOC transformations), is applied here: among others it fuses SiLU's x * sigmoid(x) into one
Swish operation, without which NNCF quantizes both factors of every activation (114 extra 8-bit roundings in
yolov5n; mAP@0.5 on COCO128 0.530 -> 0.542 with the fusion).

Why the Detect layer stays FP32 in an INT8 model: its last step turns the three maps into one (N, 5 + nc) tensor
holding pixel coordinates (0..640) beside scores (0..1), which one 8-bit scale cannot keep both of; and its three
1x1 output convolutions feed the boxes directly (keeping them FP32: mAP@0.5:0.95 0.342 -> 0.347, yolov5n COCO128).
Together they are under a tenth of yolov5n's arithmetic. They are found by walking the graph back from its output
to the first convolutions (head_ops), not by node names, which differ between exporters.

NNCF reports usage over the network unless a user opted out (openvino_telemetry's consent file); an export here
must not wait on a network it may not have, so that reporting is switched off for this process (no_usage_reports).
"""
from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from utils.errors import UserError, one_line, quiet
from utils.interop.backends import META_KEY, require

LOGGER = logging.getLogger(__name__)

MAX_CALIBRATION = 300  # NNCF's default subset size; more pictures barely move the ranges it measures


def read_onnx(path: Path) -> Any:
    """The ONNX file as an openvino.Model (Core.read_model: OpenVINO's own ONNX reader, no conversion tool), cleaned
    up as ovc would (module notes). Without the clean-up (an openvino that moved it) the model still runs and
    quantizes, less accurately; a warning says so."""
    ov = require("openvino", "--include openvino")
    try:
        model = ov.Core().read_model(str(path))
    except Exception as e:  # noqa: BLE001 - the reader fails in many ways; none is the user's to debug
        raise UserError(f"OpenVINO could not read the ONNX graph ({one_line(e)}); try another openvino version, or "
                        f"--include onnx") from None
    try:
        from openvino._offline_transformations import apply_moc_transformations
    except ImportError:
        LOGGER.warning("warning: this openvino has no apply_moc_transformations; the model is written unfused "
                       "(SiLU as sigmoid and multiply), which costs INT8 accuracy")
        return model
    apply_moc_transformations(model, cf=False)  # cf: constant folding, left to the runtime as ovc does
    return model


def head_ops(model: Any) -> list[str]:
    """Names of the Detect layer's operations: walking back from the outputs, everything up to and including the
    first Convolution on each path. A ShapeOf reads only its input's shape, so the walk does not go through it (it
    would reach the input picture); constants are never quantized and are left out."""
    seen, names, stack = set(), [], [r.input_value(0).get_node() for r in model.get_results()]
    while stack:
        node = stack.pop()
        if node.get_friendly_name() in seen or node.get_type_name() in ("Parameter", "Constant"):
            continue
        seen.add(node.get_friendly_name())
        names.append(node.get_friendly_name())
        if node.get_type_name() not in ("Convolution", "ShapeOf"):
            stack.extend(v.get_node() for v in node.input_values())
    return names


def require_nncf() -> Any:
    """nncf, imported without the line torch logs when nncf's torch side loads torch.utils.cpp_extension on a machine
    with a CUDA toolkit but no CUDA runtime (a warning about building CUDA extensions, which export.py never does);
    its usage reporting switched off (module notes)."""
    cpp = logging.getLogger("torch.utils.cpp_extension")
    level = cpp.level
    cpp.setLevel(logging.ERROR)
    try:
        nncf = require("nncf", "--int8")
    finally:
        cpp.setLevel(level)
    no_usage_reports()
    return nncf


def quantize(model: Any, pictures: Sequence[np.ndarray]) -> Any:
    """INT8 model calibrated on `pictures` (each a (B, 3, H, W) float32 batch in 0..1, pre-processed as test.py and
    detect.py do). MIXED preset: symmetric weights, asymmetric activations (SiLU outputs are nearly all positive, so a
    symmetric range would waste half the codes)."""
    nncf = require_nncf()
    scope = nncf.IgnoredScope(names=head_ops(model), validate=False)  # shape arithmetic is not in NNCF's graph
    with quiet(("nncf",), logging.WARNING):  # NNCF notes at INFO, rich progress bars on stdout
        try:
            return nncf.quantize(model, nncf.Dataset(list(pictures)), preset=nncf.QuantizationPreset.MIXED,
                                 subset_size=len(pictures), ignored_scope=scope)
        except Exception as e:  # noqa: BLE001
            raise UserError(f"NNCF could not quantize the model ({one_line(e)}); drop --int8, or try another nncf "
                            f"version") from None


def save(model: Any, xml: Path, meta: dict, fp16: bool) -> None:
    """<stem>.xml/.bin and ampyolo.json into xml's folder; fp16: weights stored in FP16 (computed in FP32 on a
    CPU). openvino.save_model compresses to FP16 unless told not to, so FP32 and INT8 say so."""
    ov = require("openvino", "--include openvino")
    xml.parent.mkdir(parents=True, exist_ok=True)
    try:
        ov.save_model(model, str(xml), compress_to_fp16=fp16)
    except Exception as e:  # noqa: BLE001 - its C++ writer raises RuntimeError for a full disk, not OSError
        raise UserError(f"OpenVINO could not write {xml.name} ({one_line(e)}); free disk space or choose a writable "
                        f"folder with --output-dir") from None
    (xml.parent / f"{META_KEY}.json").write_text(json.dumps(meta))


def no_usage_reports() -> None:
    """Switch off the usage reporting NNCF starts at import, for this process (see the module notes)."""
    with contextlib.suppress(Exception):  # another openvino_telemetry version: reporting stays as the library set it
        import openvino_telemetry

        openvino_telemetry.Telemetry().consent = False
