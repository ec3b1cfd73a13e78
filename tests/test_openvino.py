"""export.py --include openvino (FP32, FP16, INT8 with NNCF) and the OpenVINO backend: the folders agree with PyTorch,
test.py and detect.py run them like any weights file, and bad input is one line.

The tests run in a process of their own (test_in_a_process_of_its_own starts it): with openvino and nncf loaded in the
suite's process, the process crashed with SIGSEGV in a later module, twice in the full suite and never with fewer
modules; the cause is not found yet (a malformed .xml reaching OpenVINO's reader was ruled out, a974d2c)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import test as test_cli
from pathlib import Path

import pytest
import torch

CHILD = os.environ.get("AMPYOLO_OPENVINO_TESTS") == "1"
MISSING = [m for m in ("openvino", "nncf", "onnxscript") if importlib.util.find_spec(m) is None]
if MISSING:
    pytest.skip(f"OpenVINO export needs {', '.join(MISSING)}: pip install -r requirements-export.txt",
                allow_module_level=True)

import detect  # noqa: E402
import export  # noqa: E402
import validator as evaluator  # noqa: E402
from models.yolo import load_for_inference  # noqa: E402
from test_export import IMGSZ, NAMES, _assert_close, _assert_same_boxes, _checkpoint, _cli, _labels, _pictures  # noqa: E402
from utils.engine.checkpoint import atomic_save, load_checkpoint  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.interop.backends import OpenVinoBackend  # noqa: E402

CPU = torch.device("cpu")
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def test_in_a_process_of_its_own():
    """The suite's process runs this one test: the others in a child pytest (module notes)."""
    if CHILD:
        pytest.skip("the child process runs the tests themselves")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                       env={**os.environ, "AMPYOLO_OPENVINO_TESTS": "1"}, cwd=Path(__file__).resolve().parents[1],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout[-6000:] + r.stderr[-2000:]


@pytest.fixture(autouse=True)
def _only_in_the_child(request):
    if not CHILD and request.node.name != "test_in_a_process_of_its_own":
        pytest.skip("run by test_in_a_process_of_its_own")


def _recording_data(pt: Path, data: Path) -> Path:
    """The checkpoint as train.py writes it now: with the dataset YAML it was trained on."""
    ckpt = load_checkpoint(pt)
    atomic_save({**ckpt, "data": str(data)}, pt)
    return pt


@pytest.fixture(scope="module")
def folders(tmp_path_factory, micro):
    """precision -> exported folder: FP32 and INT8 with dynamic shapes, FP16 static; all from one checkpoint that
    records the micro dataset (so --int8 calibrates on its 8 training pictures without --data)."""
    root = tmp_path_factory.mktemp("openvino")
    pt = _recording_data(_checkpoint(root, "yolov5n.yaml"), micro)
    out = {}
    for precision, kw in (("fp32", {"dynamic": True}), ("fp16", {"half": True}), ("int8", {"dynamic": True,
                                                                                          "int8": True})):
        (folder,) = export.run(pt, include=("openvino",), imgsz=IMGSZ, device="cpu", output_dir=root / precision, **kw)
        out[precision] = folder
    out["pt"] = pt
    return out


def test_folder_layout_and_metadata(folders, micro):
    for precision in ("fp32", "fp16", "int8"):
        folder = folders[precision]
        assert folder.name == "best_openvino_model"
        assert sorted(p.name for p in folder.iterdir()) == ["ampyolo.json", "best.bin", "best.xml"]
        meta = json.loads((folder / "ampyolo.json").read_text())
        assert (meta["precision"], meta["names"], meta["stride"]) == (precision, NAMES, [8.0, 16.0, 32.0])
        assert meta["imgsz"] == [IMGSZ, IMGSZ] and meta["dynamic"] == (precision != "fp16")
    calib = json.loads((folders["int8"] / "ampyolo.json").read_text())["calibration"]
    assert calib == {"data": str(micro.resolve()), "images": 8}
    sizes = {p: (folders[p] / "best.bin").stat().st_size for p in ("fp32", "fp16", "int8")}
    assert 0.45 < sizes["fp16"] / sizes["fp32"] < 0.55 and sizes["int8"] / sizes["fp32"] < 0.4, sizes
    assert not list(folders["fp32"].parent.glob(".*"))  # no staging folder left behind


def test_fp32_and_fp16_agree_with_pytorch(folders):
    """FP32 within 1e-4 (boxes relative to the largest, scores absolute), any shape with --dynamic; FP16 weights
    within export.CHECK_RTOL['fp16'], the static folder padding a smaller picture as ONNX does."""
    ref_model = load_for_inference(folders["pt"], CPU, half=False)
    fp32, fp16 = (load_for_inference(folders[p], CPU) for p in ("fp32", "fp16"))
    assert isinstance(fp32, OpenVinoBackend) and fp32.static is False and fp16.imgsz == (IMGSZ, IMGSZ)
    g = torch.Generator().manual_seed(1)
    for shape in ((1, 3, IMGSZ, IMGSZ), (3, 3, 96, 160)):
        x = torch.rand(*shape, generator=g)
        with torch.inference_mode():
            _assert_close(fp32.predict(x), ref_model.predict(x))
    x = torch.rand(2, 3, IMGSZ, IMGSZ, generator=g)
    with torch.inference_mode():
        out, ref = fp16.predict(x), ref_model.predict(x)
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    assert err < export.CHECK_RTOL["fp16"], err


def test_int8_runs_close_to_pytorch(folders, micro):
    """INT8 on a training picture: the export's own check held (export.CHECK_RTOL['int8']); the box decoding kept
    in FP32 keeps scores in 0..1 and boxes finite."""
    from models.api import preprocess
    from utils.data.data_config import load_data_config
    from utils.data.images import load_image_file
    from utils.data.labels import list_image_files

    backend = load_for_inference(folders["int8"], CPU)
    assert backend.meta["precision"] == "int8" and backend.meta["calibration"]["images"] == 8
    im = load_image_file(list_image_files(load_data_config(micro)["train"])[0])
    x, _ = preprocess([im], (IMGSZ, IMGSZ), 32, False, CPU, torch.float32)
    with torch.inference_mode():
        out, ref = backend.predict(x), load_for_inference(folders["pt"], CPU, half=False).predict(x)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert ((out - ref).abs().max() / ref.abs().max()).item() < export.CHECK_RTOL["int8"]
    assert out[..., 4:].min() >= 0 and out[..., 4:].max() <= 1
    import openvino as ov

    from utils.interop.openvino_export import head_ops

    model = ov.Core().read_model(str(folders["int8"] / "best.xml"))
    kinds = {op.get_friendly_name(): op.get_type_name() for op in model.get_ops()}
    head = [kinds[n] for n in head_ops(model)]
    assert head.count("Convolution") == 3 and "FakeQuantize" not in head  # the Detect layer stayed FP32
    assert list(kinds.values()).count("FakeQuantize") > 20  # and the rest is quantized


def test_test_py_and_detect_py_run_the_folder(folders, micro, tmp_path):
    """test.py on the FP32 folder equals the .pt (same rectangular batches: --dynamic); detect.py writes the same
    boxes, given the folder or its .xml; the INT8 folder runs through both."""
    res = {w: evaluator.run(str(micro), weights=folders[w], imgsz=IMGSZ, batch_size=4, workers=0, plots=False,
                            project=tmp_path, name=w, half=False) for w in ("pt", "fp32", "int8")}
    assert abs(res["pt"].map - res["fp32"].map) < 1e-3 and abs(res["pt"].map50 - res["fp32"].map50) < 1e-3
    assert 0 <= res["int8"].map <= 1
    src = _pictures(tmp_path / "src")
    saved = {}
    for name, w in (("pt", folders["pt"]), ("fp32", folders["fp32"]), ("xml", folders["fp32"] / "best.xml"),
                    ("int8", folders["int8"])):
        saved[name] = _labels(detect.run(w, src, imgsz=IMGSZ, device="cpu", save_txt=True, save_conf=True,
                                         conf_thres=0.5, project=tmp_path / "runs", name=name) / "labels")
    assert _assert_same_boxes(saved["pt"], saved["fp32"]) > 0
    assert saved["xml"].keys() == saved["fp32"].keys() and saved["int8"].keys() == saved["pt"].keys()


# ----------------------------------------------------------------------------------------- bad input


def test_folders_that_are_not_models_are_one_line(folders, tmp_path, capsys, monkeypatch):
    src = _pictures(tmp_path / "src")
    empty = tmp_path / "empty_openvino_model"
    empty.mkdir()
    unmarked = tmp_path / "unmarked_openvino_model"  # a model folder without our metadata
    unmarked.mkdir()
    for f in ("best.xml", "best.bin"):
        (unmarked / f).write_bytes((folders["fp32"] / f).read_bytes())
    corrupt = tmp_path / "corrupt_openvino_model"
    corrupt.mkdir()
    (corrupt / "ampyolo.json").write_text((folders["fp32"] / "ampyolo.json").read_text())
    (corrupt / "best.xml").write_text("<net><layers>")  # cut short
    (corrupt / "best.bin").write_bytes(b"")
    cut = tmp_path / "cut_openvino_model"  # the .bin cut short (a copy that ran out of disk)
    cut.mkdir()
    for f in ("ampyolo.json", "best.xml"):
        (cut / f).write_bytes((folders["fp32"] / f).read_bytes())
    (cut / "best.bin").write_bytes((folders["fp32"] / "best.bin").read_bytes()[:1000])
    plain = tmp_path / "plain"  # no .xml, not named like an export: not taken for a model at all
    plain.mkdir()
    for folder, text in ((empty, "no .xml"), (unmarked, "not written by export.py"), (corrupt, "cannot load"),
                         (cut, "bytes of best.bin"), (plain, "not a checkpoint file nor an OpenVINO model folder")):
        for module, argv in ((detect, ["--weights", folder, "--source", src, "--device", "cpu"]),
                             (test_cli, ["--weights", folder, "--device", "cpu"])):
            code, line = _cli(module, argv, capsys, monkeypatch)
            assert code == 2 and text in line and folder.name in line, line


def test_int8_without_usable_data_is_one_line(tmp_path, capsys, monkeypatch, micro):
    pt = _checkpoint(tmp_path / "w", "yolov5n.yaml")  # records no dataset
    bad_pictures = tmp_path / "bad"
    (bad_pictures / "images").mkdir(parents=True)
    for i in range(2):
        (bad_pictures / "images" / f"{i}.jpg").write_bytes(b"not a picture")
    (bad_pictures / "bad.yaml").write_text(f"path: {bad_pictures}\ntrain: images\nval: images\nnames: {NAMES}\n")
    for argv, text in ((["--int8"], "records no dataset"),
                       (["--int8", "--data", tmp_path / "missing.yaml"], "missing.yaml"),
                       (["--int8", "--data", bad_pictures / "bad.yaml"], "none of the 2 calibration pictures"),
                       (["--int8", "--half"], "choose one"),
                       (["--data", micro], "add --int8")):
        code, line = _cli(export, ["--weights", pt, "--include", "openvino", "--imgsz", 64, *argv], capsys, monkeypatch)
        assert code == 2 and text in line, line
    code, line = _cli(export, ["--weights", pt, "--int8"], capsys, monkeypatch)
    assert code == 2 and "--include openvino" in line
    assert not list((tmp_path / "w").glob("*openvino*")) and not list((tmp_path / "w").glob(".*"))


def test_missing_packages_name_the_pip_command(folders, tmp_path, capsys, monkeypatch):
    pt = _checkpoint(tmp_path, "yolov5n.yaml")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
        with pytest.raises(UserError, match="pip install -r requirements-export.txt"):
            load_for_inference(folders["fp32"], CPU)
        code, line = _cli(export, ["--weights", pt, "--include", "openvino", "--imgsz", 64], capsys, monkeypatch)
        assert code == 2 and "'openvino'" in line and "pip install -r requirements-export.txt" in line
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "nncf", None)
        code, line = _cli(export, ["--weights", pt, "--include", "openvino", "--int8", "--imgsz", 64], capsys,
                          monkeypatch)
        assert code == 2 and "'nncf'" in line and "pip install -r requirements-export.txt" in line


def test_export_replaces_an_earlier_folder(folders, tmp_path):
    """A second export replaces the folder whole (renamed into place), leaving nothing beside it."""
    pt = _checkpoint(tmp_path, "yolov5n.yaml")
    folder = tmp_path / "best_openvino_model"
    folder.mkdir()
    (folder / "stale.txt").write_text("from an earlier export")
    assert export.run(pt, include=("openvino",), imgsz=64, device="cpu") == [folder]
    assert sorted(p.name for p in folder.iterdir()) == ["ampyolo.json", "best.bin", "best.xml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "best_openvino_model"]
