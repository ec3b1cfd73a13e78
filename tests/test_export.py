"""export.py and utils/interop/backends.py: exported graphs agree with PyTorch, test.py and detect.py run them, and bad
input is one line."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import test as test_cli
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import cli_in_process

import detect
import export
import validator as evaluator
from models.yolo import load_for_inference
from utils.data.synthetic import CLASSES
from utils.engine.checkpoint import atomic_save, make_checkpoint
from utils.errors import UserError
from utils.interop.backends import PAD_VALUE, PyTorchBackend

pytest.importorskip("onnxruntime", reason="pip install -r requirements-export.txt")
pytest.importorskip("onnxscript", reason="pip install -r requirements-export.txt")
onnx = pytest.importorskip("onnx", reason="pip install -r requirements-export.txt")

NAMES = list(CLASSES)  # the built-in dataset's classes, so test.py runs on the `micro` split
IMGSZ = 128  # small: every export and run here takes a few seconds on one CPU thread
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


def _checkpoint(folder: Path, cfg: str) -> Path:
    """Random weights made to behave like trained ones: BatchNorm statistics measured on random pictures (at
    their initial values the activations fade to ~1e-9 by the head, so every output would be its bias) and
    the head's objectness and class biases at 0, so scores spread over 0.1-0.7 and boxes pass --conf-thres."""
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model(cfg, nc=len(NAMES))
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.rand(4, 3, IMGSZ, IMGSZ))
        for conv in model.model[-1].m:
            conv.bias.view(model.model[-1].na, -1)[:, 4:] = 0.0
    model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "best.pt"
    atomic_save(make_checkpoint(model, model.yaml, NAMES, epoch=0), path)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(cfg, dynamic) -> folder with best.pt, best.onnx, best.torchscript; each exported once per module."""
    cache: dict[tuple[str, bool], Path] = {}

    def get(cfg: str, dynamic: bool) -> Path:
        if (cfg, dynamic) not in cache:
            folder = tmp_path_factory.mktemp(f"{cfg}-{'dynamic' if dynamic else 'static'}")
            pt = _checkpoint(folder, f"{cfg}.yaml")
            written = export.run(pt, include=("onnx", "torchscript"), imgsz=IMGSZ, dynamic=dynamic, device="cpu")
            assert [p.name for p in written] == ["best.onnx", "best.torchscript"]
            cache[cfg, dynamic] = folder
        return cache[cfg, dynamic]

    return get


def _assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Within 1e-4 relative: boxes against the largest box value (pixels), scores (0..1) absolutely."""
    assert out.shape == ref.shape and out.dtype == torch.float32
    box_err = ((out[..., :4] - ref[..., :4]).abs().max() / ref[..., :4].abs().max()).item()
    score_err = (out[..., 4:] - ref[..., 4:]).abs().max().item()
    assert box_err < 1e-4 and score_err < 1e-4, (box_err, score_err)


# ----------------------------------------------------------------------------------------- outputs


@pytest.mark.slow
@pytest.mark.parametrize("cfg", ["yolov5n", "yolov5s"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_exports_equal_pytorch_fp32(exported, cfg, dynamic):
    folder = exported(cfg, dynamic)
    ref_model = load_for_inference(folder / "best.pt", CPU, half=False)
    assert isinstance(ref_model, PyTorchBackend) and ref_model.dtype == torch.float32
    g = torch.Generator().manual_seed(1)
    shapes = [(1, 3, 128, 128), (4, 3, 128, 128), (4, 3, 96, 160)] if dynamic else [(1, 3, 128, 128)]
    for suffix in (".onnx", ".torchscript"):
        backend = load_for_inference(folder / f"best{suffix}", CPU)
        assert backend.names == NAMES and backend.stride.tolist() == [8.0, 16.0, 32.0]
        assert backend.static != dynamic and backend.imgsz == (None if dynamic else (IMGSZ, IMGSZ))
        for shape in shapes:
            x = torch.rand(*shape, generator=g)
            with torch.inference_mode():
                ref = ref_model.predict(x)
                out = backend.predict(x.numpy() if suffix == ".onnx" else x)  # NumPy or torch in
            _assert_close(out, ref)


def test_metadata_is_json_without_yaml(exported):
    model = onnx.load(str(exported("yolov5n", False) / "best.onnx"))
    meta = json.loads({p.key: p.value for p in model.metadata_props}["ampyolo"])
    assert meta["names"] == NAMES and meta["stride"] == [8.0, 16.0, 32.0] and meta["imgsz"] == [IMGSZ, IMGSZ]
    assert (meta["precision"], meta["dynamic"], meta["batch"]) == ("fp32", False, 1)
    assert [o.name for o in model.graph.output] == ["output0"]
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, IMGSZ, IMGSZ]  # static: every dimension fixed


def test_static_export_pads_batch_and_picture(exported):
    """A smaller picture is padded right/bottom with letterbox grey, a larger batch runs in chunks: the rows
    equal PyTorch on the padded input."""
    folder = exported("yolov5n", False)
    backend = load_for_inference(folder / "best.onnx", CPU)
    ref_model = load_for_inference(folder / "best.pt", CPU)
    x = torch.rand(3, 3, 96, 128, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        out = backend.predict(x)
        ref = ref_model.predict(F.pad(x, (0, 0, 0, IMGSZ - 96), value=PAD_VALUE))
    _assert_close(out, ref)
    with pytest.raises(UserError, match="exported for 128x128"):
        backend.predict(torch.zeros(1, 3, 160, 128))


@pytest.mark.slow
def test_fp16_onnx_on_cpu(tmp_path):
    """On a CPU-only machine --half writes an FP16 graph (FP16 weights, float32 boundary) that ONNX Runtime's CPU
    provider runs, close to FP32; a CUDA machine traces it on the GPU instead."""
    pt = _checkpoint(tmp_path, "yolov5n.yaml")
    (path,) = export.run(pt, include=("onnx",), imgsz=IMGSZ, half=True, device="cpu")
    model = onnx.load(str(path))
    kinds = {i.data_type for i in model.graph.initializer if len(i.dims) == 4}  # conv weights
    assert kinds == {onnx.TensorProto.FLOAT16}
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    backend = load_for_inference(path, CPU)
    assert backend.meta["precision"] == "fp16"
    x = torch.rand(1, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        out, ref = backend.predict(x), load_for_inference(pt, CPU, half=False).predict(x)
        torch16 = load_for_inference(pt, CPU, half=True).predict(x).float()  # the precision rule's own FP16 model

    def errors(a: torch.Tensor) -> tuple[float, float]:
        return ((a[..., :4] - ref[..., :4]).abs().max() / ref[..., :4].abs().max()).item(), \
            (a[..., 4:] - ref[..., 4:]).abs().max().item()

    # FP16 rounding of this random net moves scores by a few hundredths; the graph must not add to it
    (box, score), (box16, score16) = errors(out), errors(torch16)
    assert box < 0.05 and score < 0.1 and box <= 1.5 * box16 and score <= 1.5 * score16, (box, score, box16, score16)


# ----------------------------------------------------------------------------------------- test.py and detect.py


def _labels(folder: Path) -> dict[str, np.ndarray]:
    """labels/*.txt rows (class cx cy w h conf) per picture; an empty file is a picture without boxes."""
    return {p.stem: np.array([r.split() for r in p.read_text().splitlines()], float).reshape(-1, 6)
            for p in sorted(folder.glob("*.txt"))}


def _xyxy(a: np.ndarray) -> np.ndarray:
    return np.concatenate([a[:, 1:3] - a[:, 3:5] / 2, a[:, 1:3] + a[:, 3:5] / 2], 1)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt, rb = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    area = lambda x: (x[:, 2:] - x[:, :2]).prod(1)  # noqa: E731
    with np.errstate(invalid="ignore", divide="ignore"):  # zero-area boxes: NaN, never >= 0.99
        return inter / (area(a)[:, None] + area(b)[None] - inter)


def _assert_same_boxes(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> int:
    """Every reference box has a box of the same class with IoU >= 0.99, and the counts agree. A box clipped to
    a line at the image edge (the random head predicts some off the picture) has no area and so no IoU: it must
    lie within 1e-3 of the image size of its counterpart instead."""
    assert ref.keys() == got.keys()
    n = 0
    for stem, a in ref.items():
        b = got[stem]
        assert len(a) == len(b), stem
        if len(a):
            same_cls = a[:, None, 0] == b[None, :, 0]
            near = np.abs(_xyxy(a)[:, None] - _xyxy(b)[None]).max(2) < 1e-3
            ok = ((_iou(_xyxy(a), _xyxy(b)) >= 0.99) | near) & same_cls
            assert ok.any(1).all(), (stem, a[~ok.any(1)][:3])
            assert (np.prod(a[:, 3:5], 1) > 0).sum() > len(a) // 2  # most boxes have an area: the IoU test bites
        n += len(a)
    return n


def _pictures(folder: Path) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(((120, 160), (160, 90), (128, 128))):
        im = np.full((h, w, 3), 114, np.uint8)
        for _ in range(4):
            y, x = rng.integers(0, h - 30), rng.integers(0, w - 30)
            im[y:y + 30, x:x + 30] = rng.integers(0, 255, 3)
        cv2.imwrite(str(folder / f"im{i}.jpg"), im)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_detect_onnx_writes_same_boxes_as_pt(exported, tmp_path, dynamic):
    folder = exported("yolov5n", dynamic)
    src = _pictures(tmp_path / "src")
    saved = {}
    for w in ("best.pt", "best.onnx", "best.torchscript"):
        saved[w] = _labels(detect.run(folder / w, src, imgsz=IMGSZ, device="cpu", save_txt=True, save_conf=True,
                                      conf_thres=0.5, project=tmp_path / "runs", name=w) / "labels")
    if dynamic:  # same letterbox shapes as the .pt run: the same boxes
        assert _assert_same_boxes(saved["best.pt"], saved["best.onnx"]) > 0
        assert _assert_same_boxes(saved["best.pt"], saved["best.torchscript"]) > 0
    else:  # the fixed 128x128 input pads differently from the .pt's rectangle; both exported files agree
        assert _assert_same_boxes(saved["best.onnx"], saved["best.torchscript"]) > 0


@pytest.mark.slow
def test_test_py_onnx_equals_pt(exported, micro, tmp_path):
    folder = exported("yolov5n", True)
    res = {}
    for w in ("best.pt", "best.onnx"):
        res[w] = evaluator.run(str(micro), weights=folder / w, imgsz=IMGSZ, batch_size=4, workers=0, plots=False,
                               save_txt=True, save_conf=True, project=tmp_path, name=w, half=False)
    a, b = res["best.pt"], res["best.onnx"]
    assert abs(a.map - b.map) < 1e-3 and abs(a.map50 - b.map50) < 1e-3 and abs(a.mp - b.mp) < 1e-3
    assert _assert_same_boxes(_labels(a.save_dir / "labels"), _labels(b.save_dir / "labels")) > 0


def test_test_py_static_export_uses_its_size(exported, micro, caplog):
    import logging

    caplog.set_level(logging.INFO)
    res = evaluator.run(str(micro), weights=exported("yolov5n", False) / "best.onnx", imgsz=256, batch_size=3,
                        workers=0, plots=False)
    assert "using --imgsz 128" in caplog.text and res.speed["inference"] > 0


# ----------------------------------------------------------------------------------------- bad input


def _cli(module, argv, capsys, monkeypatch) -> tuple[int, str]:
    code, lines = cli_in_process(module.main, [str(a) for a in argv], capsys, monkeypatch)
    assert len(lines) == 1, lines
    return code, lines[0]


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_onnx_is_one_line(exported, tmp_path, capsys, monkeypatch, damage):
    good = (exported("yolov5n", False) / "best.onnx").read_bytes()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model" * 100 if damage == "garbage" else good[: len(good) // 2])
    src = _pictures(tmp_path / "src")
    for module, argv in ((detect, ["--weights", bad, "--source", src, "--device", "cpu"]),
                         (test_cli, ["--weights", bad, "--device", "cpu"])):
        code, line = _cli(module, argv, capsys, monkeypatch)
        assert code == 2 and str(bad) in line and "export it again" in line


def test_onnx_without_metadata_is_refused(exported, tmp_path, capsys, monkeypatch):
    model = onnx.load(str(exported("yolov5n", False) / "best.onnx"))
    del model.metadata_props[:]
    foreign = tmp_path / "foreign.onnx"
    onnx.save(model, str(foreign))
    code, line = _cli(detect, ["--weights", foreign, "--source", _pictures(tmp_path / "src"), "--device", "cpu"],
                      capsys, monkeypatch)
    assert code == 2 and "not written by export.py" in line and str(foreign) in line


def test_torchscript_without_metadata_or_damaged(exported, tmp_path, capsys, monkeypatch):
    plain = tmp_path / "plain.torchscript"
    torch.jit.save(torch.jit.trace(torch.nn.Identity(), torch.zeros(1)), str(plain))
    code, line = _cli(test_cli, ["--weights", plain, "--device", "cpu"], capsys, monkeypatch)
    assert code == 2 and "not written by export.py" in line
    broken = tmp_path / "broken.torchscript"
    broken.write_bytes((exported("yolov5n", False) / "best.torchscript").read_bytes()[:5000])
    code, line = _cli(test_cli, ["--weights", broken, "--device", "cpu"], capsys, monkeypatch)
    assert code == 2 and str(broken) in line


def test_unwritable_output_folder(tmp_path, capsys, monkeypatch):
    pt = _checkpoint(tmp_path / "w", "yolov5n.yaml")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")  # a folder below a regular file cannot be made, even by root
    code, line = _cli(export, ["--weights", pt, "--output-dir", blocker / "out", "--imgsz", 64], capsys, monkeypatch)
    assert code == 2 and str(blocker / "out") in line and "--output-dir" in line
    if hasattr(os, "geteuid") and os.geteuid() != 0:  # modes bind everyone but root
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        code, line = _cli(export, ["--weights", pt, "--output-dir", ro, "--imgsz", 64], capsys, monkeypatch)
        assert code == 2 and str(ro) in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine exports FP16 TorchScript on the GPU")
def test_half_torchscript_on_cpu_is_refused_and_keeps_files(tmp_path, capsys, monkeypatch):
    pt = _checkpoint(tmp_path, "yolov5n.yaml")
    earlier = tmp_path / "best.torchscript"
    earlier.write_bytes(b"an earlier export")
    code, line = _cli(export, ["--weights", pt, "--include", "onnx", "torchscript", "--half", "--imgsz", 64],
                      capsys, monkeypatch)
    assert code == 2 and "--half" in line and "CUDA" in line
    assert earlier.read_bytes() == b"an earlier export" and not (tmp_path / "best.onnx").exists()


def test_half_on_unsupported_device_and_bad_options(tmp_path, capsys, monkeypatch):
    pt = _checkpoint(tmp_path, "yolov5n.yaml")
    for argv, text in ((["--include", "tflite"], "--include tflite"), (["--imgsz", "0"], "--imgsz 0"),
                       (["--batch-size", "0"], "--batch-size 0"), (["--include", "torchscript", "--simplify"], "--simplify"),
                       (["--device", "meta"], "--device")):
        code, line = _cli(export, ["--weights", pt, *argv], capsys, monkeypatch)
        assert code == 2 and text in line, line
    code, line = _cli(export, ["--weights", tmp_path / "missing.pt"], capsys, monkeypatch)
    assert code == 2 and "missing.pt" in line


def test_missing_packages_name_the_pip_command(exported, tmp_path, capsys, monkeypatch):
    onnx_file = exported("yolov5n", False) / "best.onnx"
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
        with pytest.raises(UserError, match="pip install -r requirements-export.txt"):
            load_for_inference(onnx_file, CPU)
    if importlib.util.find_spec("onnxsim") is None:
        pt = _checkpoint(tmp_path, "yolov5n.yaml")
        code, line = _cli(export, ["--weights", pt, "--simplify", "--imgsz", 64], capsys, monkeypatch)
        assert code == 2 and "onnxsim" in line and "pip install" in line


@pytest.mark.slow
def test_augment_needs_the_checkpoint(exported, tmp_path, capsys, monkeypatch):
    src = _pictures(tmp_path / "src")
    code, line = _cli(detect, ["--weights", exported("yolov5n", True) / "best.onnx", "--source", src, "--augment",
                               "--device", "cpu", "--project", tmp_path / "runs"], capsys, monkeypatch)
    assert code == 2 and "--augment" in line


@pytest.mark.slow
def test_export_cli_writes_beside_weights(tmp_path, capsys, monkeypatch):
    pt = _checkpoint(tmp_path / "run" / "weights", "yolov5n.yaml")
    code, _ = cli_in_process(export.main, ["--weights", str(pt), "--include", "torchscript", "--imgsz", "64",
                                           "--batch-size", "2"], capsys, monkeypatch)
    assert code == 0
    backend = load_for_inference(pt.with_suffix(".torchscript"), CPU)
    assert (backend.batch_size, backend.imgsz) == (2, (64, 64))
    assert not list(pt.parent.glob(".*tmp")) and not list(pt.parent.glob(".export-check-*"))  # no leftovers
