"""YOLOv5 checkpoints in (utils/interop/yolov5_compat.py): read with no code run, converted, refused by name.

The checkpoints are written by tests/fixtures_yolov5.py in a separate process where this repository's
`models` package is not importable (cwd elsewhere, `python -I`): it registers stand-in modules named as
YOLOv5's and pickles a small model the way YOLOv5's train.py saves one. No YOLOv5 install is needed.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import test as test_cli
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import detect
import train
import validator
from models import yolov5_convert
from models.yolo import load_model
from tests.helpers import cli_in_process
from utils.data.synthetic import CLASSES
from utils.engine import checkpoint as ck
from utils.errors import UserError
from utils.interop import yolov5_compat

pytestmark = pytest.mark.slow  # the YOLOv5 checkpoints are written in processes of their own

FIXTURE_SCRIPT = Path(__file__).resolve().parent / "fixtures_yolov5.py"
ANCHORS = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]
BACKBONE = [[-1, 1, "Conv", [64, 6, 2, 2]], [-1, 1, "Conv", [128, 3, 2]], [-1, 3, "C3", [128]],
            [-1, 1, "Conv", [256, 3, 2]], [-1, 1, "C3", [256]], [-1, 1, "Conv", [512, 3, 2]], [-1, 1, "C3", [512]],
            [-1, 1, "Conv", [1024, 3, 2]], [-1, 1, "SPPF", [1024, 5]]]
HEAD = [[-1, 1, "Conv", [512, 1, 1]], [-1, 1, "nn.Upsample", ["None", 2, "nearest"]], [[-1, 6], 1, "Concat", [1]],
        [-1, 1, "C3", [512, False]], [-1, 1, "Conv", [256, 1, 1]], [-1, 1, "nn.Upsample", ["None", 2, "nearest"]],
        [[-1, 4], 1, "Concat", [1]], [-1, 1, "C3", [256, False]]]
# yolov5n's layout at a sixteenth of its width: 8..64 channels, a few ms per forward
P5 = {"nc": len(CLASSES), "depth_multiple": 0.33, "width_multiple": 0.0625, "anchors": ANCHORS,
      "backbone": BACKBONE, "head": [*HEAD, [[16, 12, 8], 1, "Detect", ["nc", "anchors"]]]}
P6 = {**P5, "anchors": [*ANCHORS, [436, 615, 739, 380, 925, 792]],
      "head": [*HEAD, [8, 1, "Conv", [1024, 3, 2]], [[16, 12, 8, 17], 1, "Detect", ["nc", "anchors"]]]}
YOLO, COMMON = ("DetectionModel", "Detect"), ("Conv", "Bottleneck", "C3", "SPPF", "Concat")


def classes(prefix: str = "models", **renamed: str) -> dict[str, str]:
    names = {c: f"{prefix}.yolo.{c}" for c in YOLO} | {c: f"{prefix}.common.{c}" for c in COMMON}
    return names | renamed


ULTRALYTICS = {"DetectionModel": "ultralytics.nn.tasks.DetectionModel", "Detect": "ultralytics.nn.modules.head.Detect",
               "Conv": "ultralytics.nn.modules.conv.Conv", "Concat": "ultralytics.nn.modules.conv.Concat",
               **{c: f"ultralytics.nn.modules.block.{c}" for c in ("Bottleneck", "C3", "SPPF")}}
# name -> what the fixture process writes
SPECS = {
    "yolov5_repo.pt": dict(classes=classes("models"), autoanchor=True),
    "yolov5_pip.pt": dict(classes=classes("yolov5.models")),
    "yolov5_last.pt": dict(classes=classes("models"), last=True),
    "yolov5_v6.pt": dict(classes=classes("models", DetectionModel="models.yolo.Model"), names_as_list=True),
    "os_system.pt": dict(classes=classes(), payload="os.system"),
    "eval.pt": dict(classes=classes(), payload="eval"),
    "conv2d_call.pt": dict(classes=classes(), payload="conv2d"),
    "detect_call.pt": dict(classes=classes(), payload="detect"),
    "focus.pt": dict(classes=classes(Conv="models.common.Focus")),
    "foreign_class.pt": dict(classes=classes(Conv="mypackage.layers.Conv")),
    "ultralytics.pt": dict(classes=ULTRALYTICS),
    "p6.pt": dict(classes=classes(), yaml=P6, strides=[8, 16, 32, 64]),
    "segment.pt": dict(classes=classes(DetectionModel="models.yolo.SegmentationModel", Detect="models.yolo.Segment")),
    "not_a_model.pt": dict(classes=classes(), payload="not_a_model"),
    "bn_eps.pt": dict(classes=classes(), bn_eps=1e-5),
}


def write_fixture(folder: Path, name: str, marker: Path | None = None, control: Path | None = None) -> Path:
    spec = {"yaml": P5, "strides": [8, 16, 32], "out": str(folder / name), "marker": str(marker or folder / "PWNED"),
            **SPECS[name]}
    spec["names"] = list(CLASSES) if spec.pop("names_as_list", False) else dict(enumerate(CLASSES))
    if control:
        spec["control"] = str(control)
    # -I: no PYTHON* variables, no user site, no script folder or cwd on sys.path; cwd is a folder without `models`
    r = subprocess.run([sys.executable, "-I", str(FIXTURE_SCRIPT), json.dumps(spec)], cwd=folder,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return folder / name


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("yolov5")
    out = {name: write_fixture(folder, name) for name in SPECS}
    good = out["yolov5_repo.pt"].read_bytes()
    (folder / "truncated.pt").write_bytes(good[: len(good) // 2])
    out["truncated.pt"] = folder / "truncated.pt"
    return out


def _reference(path: Path) -> dict:
    return torch.load(str(path) + ".ref", weights_only=True)


# ----------------------------------------------------------------------------------------------- reading
@pytest.mark.parametrize("name", ["yolov5_repo.pt", "yolov5_pip.pt", "yolov5_last.pt", "yolov5_v6.pt"])
def test_yolov5_checkpoint_loads_with_its_weights_names_strides_and_anchors(name, files):
    path, ref = files[name], _reference(files[name])
    ckpt = ck.load_checkpoint(path)
    assert ckpt["names"] == list(CLASSES) and ckpt["nc"] == len(CLASSES)
    assert ckpt["origin"]["stride"] == [8.0, 16.0, 32.0]
    assert ckpt["epoch"] == (7 if name == "yolov5_last.pt" else -1)
    model, _ = load_model(path)
    state = model.state_dict()
    assert state.keys() == ref["state"].keys()
    for k, v in ref["state"].items():  # the EMA of a last.pt, not its raw model; FP16 values kept exactly
        assert torch.equal(state[k], v.float()), k
    detect_layer = model.model[-1]
    assert detect_layer.stride.tolist() == [8.0, 16.0, 32.0]
    yaml_anchors = torch.tensor(ckpt["yaml"]["anchors"]).view(3, 3, 2) / detect_layer.stride.view(-1, 1, 1)
    assert torch.equal(yaml_anchors, ref["state"]["model.17.anchors"].float())  # the YAML carries the buffer's anchors
    with torch.no_grad():
        pred, _ = model(ref["input"])
    assert (pred - ref["pred"]).abs().max().item() <= 1e-3  # YOLOv5's decode, written independently


def test_autoanchor_anchors_come_from_the_detect_buffer_not_the_yaml(files):
    ckpt = ck.load_checkpoint(files["yolov5_repo.pt"])
    assert torch.allclose(torch.tensor(ckpt["yaml"]["anchors"][0]), torch.tensor(ANCHORS[0]) * 1.13, rtol=1e-3)
    assert ckpt["yaml"]["anchors"][0] != [float(a) for a in ANCHORS[0]]


def test_converter_writes_a_plain_weights_only_checkpoint_and_keeps_existing_files(files, tmp_path, capsys,
                                                                                   monkeypatch):
    out = tmp_path / "converted.pt"
    code, _ = cli_in_process(yolov5_convert.main, [str(files["yolov5_pip.pt"]), str(out)], capsys, monkeypatch)
    assert code == 0
    raw = torch.load(out, weights_only=True)  # no allowlist: plain tensors, numbers and text
    assert raw["format"] == "ampyolo" and raw["names"] == list(CLASSES)
    assert all(v.dtype == torch.float16 for v in raw["model"].values() if v.is_floating_point())
    ref = _reference(files["yolov5_pip.pt"])["state"]
    assert all(torch.equal(raw["model"][k], v) for k, v in ref.items())
    before = out.read_bytes()
    for argv, words in (([str(files["yolov5_repo.pt"]), str(out)], "already exists"),
                        ([str(out), str(tmp_path / "again.pt")], "already a checkpoint of this project"),
                        ([str(files["p6.pt"]), str(tmp_path / "p6_out.pt")], "P6")):
        code, lines = cli_in_process(yolov5_convert.main, argv, capsys, monkeypatch)
        assert code == 2 and len(lines) == 1 and words in lines[0], lines
    assert out.read_bytes() == before and not (tmp_path / "again.pt").exists() and not (tmp_path / "p6_out.pt").exists()
    code, _ = cli_in_process(yolov5_convert.main, [str(files["yolov5_repo.pt"]), str(out), "--force"], capsys, monkeypatch)
    assert code == 0 and out.read_bytes() != before


# ----------------------------------------------------------------------------------------------- refusals
REFUSALS = {name: words for name, *words in (  # file, then words its one error line must hold (besides its name)
    ("os_system.pt", "refused to load", "posix.system"),
    ("eval.pt", "refused to load", "builtins.eval"),
    ("conv2d_call.pt", "refused to load", "calls torch.nn.modules.conv.Conv2d"),
    ("detect_call.pt", "refused to load", "models.yolo.Detect"),
    ("focus.pt", "YOLOv5 checkpoint built with models.common.Focus"),
    ("foreign_class.pt", "refused to load", "mypackage.layers.Conv"),
    ("ultralytics.pt", "Ultralytics checkpoint", "not supported"),
    ("p6.pt", "P6", "not supported"),
    ("segment.pt", "segmentation", "not supported"),
    ("not_a_model.pt", "not a YOLOv5 DetectionModel"),
    ("bn_eps.pt", "eps"),
    ("truncated.pt", "truncated or corrupt"),
)}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refused_files_give_one_line_naming_the_reason(name, files):
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(files[name])
    msg = str(e.value)
    assert "\n" not in msg and files[name].name in msg, msg
    for w in REFUSALS[name]:
        assert w in msg, msg
    assert not (files[name].parent / "PWNED").exists()


@pytest.mark.parametrize("name", ["os_system.pt", "eval.pt"])
def test_code_in_the_file_never_runs_though_a_plain_unpickle_would_run_it(name, tmp_path):
    marker = tmp_path / "marker"
    path = write_fixture(tmp_path, name, marker=marker)
    for _ in range(2):  # through the loader and through the converter
        with pytest.raises(UserError, match="refused to load"):
            ck.load_checkpoint(path)
        with pytest.raises(UserError, match="refused to load"):
            yolov5_convert.convert(path, tmp_path / "out.pt")
    assert not marker.exists() and not (tmp_path / "out.pt").exists()
    write_fixture(tmp_path, "yolov5_repo.pt", control=path)  # control: YOLOv5's own torch.load(weights_only=False)
    assert marker.exists()  # the payload is real


@pytest.mark.parametrize("name", list(REFUSALS))
def test_every_refusal_is_exit_2_and_one_line_through_test_py(name, files, tiny_data, tmp_path, capsys, monkeypatch):
    argv = ["--weights", str(files[name]), "--data", str(tiny_data), "--img", "64", "--workers", "0",
            "--project", str(tmp_path)]
    code, lines = cli_in_process(test_cli.main, argv, capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and name in lines[0], lines


@pytest.mark.parametrize("name", ["os_system.pt", "ultralytics.pt", "p6.pt", "segment.pt", "truncated.pt"])
def test_refusals_through_detect_and_train(name, files, tiny_data, tmp_path, capsys, monkeypatch):
    image = next((tiny_data.parent / "shapes" / "images" / "val").iterdir())
    argv = ["--weights", str(files[name]), "--source", str(image), "--img", "64", "--project", str(tmp_path / "d")]
    code, lines = cli_in_process(detect.main, argv, capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and name in lines[0], lines
    argv = ["--weights", str(files[name]), "--data", str(tiny_data), "--epochs", "1", "--img", "64", "--workers", "0",
            "--project", str(tmp_path / "t")]
    code, lines = cli_in_process(train.main, argv, capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and name in lines[0], lines
    assert not (files[name].parent / "PWNED").exists()


# ----------------------------------------------------------------------------------------------- the three CLIs
def test_test_py_and_detect_py_run_a_yolov5_checkpoint(files, tiny_data, tmp_path):
    res = validator.run(data=str(tiny_data), weights=str(files["yolov5_pip.pt"]), imgsz=64, workers=0,
                        project=str(tmp_path), plots=False)
    assert len(res.maps) == len(CLASSES)
    image = next((tiny_data.parent / "shapes" / "images" / "val").iterdir())
    out = detect.run(weights=str(files["yolov5_pip.pt"]), source=str(image), imgsz=64, conf_thres=0.0,
                     save_txt=True, project=str(tmp_path), name="det")
    labels = list((out / "labels").glob("*.txt"))
    assert labels and labels[0].read_text().strip()  # the random head finds boxes at conf 0


def test_a_yolov5_checkpoint_runs_at_640_when_no_size_is_given(files, tiny_data, tmp_path, caplog):
    """YOLOv5's files do not record a training size here: detect.py keeps YOLOv5's own 640."""
    image = next((tiny_data.parent / "shapes" / "images" / "val").iterdir())
    with caplog.at_level(logging.INFO):
        detect.run(weights=str(files["yolov5_pip.pt"]), source=str(image), project=str(tmp_path), name="det")
    assert any(" at 640x640 px (the default; --imgsz to change)" in r.getMessage() for r in caplog.records)


def test_train_starts_from_the_imported_weights_or_reinitialises_the_head(files, caplog):
    ref = _reference(files["yolov5_repo.pt"])["state"]
    opt = SimpleNamespace(weights=str(files["yolov5_repo.pt"]), cfg="")
    with caplog.at_level(logging.INFO):
        model, _ = train.create_model(opt, list(CLASSES))
    assert "all" in caplog.text and "transferred" in caplog.text
    assert all(torch.equal(model.state_dict()[k], v.float()) for k, v in ref.items())
    caplog.clear()
    with caplog.at_level(logging.INFO):
        model, _ = train.create_model(opt, ["a", "b"])
    assert "re-initialised" in caplog.text and model.nc == 2
    own = model.state_dict()
    assert torch.equal(own["model.0.conv.weight"], ref["model.0.conv.weight"].float())
    assert own["model.17.m.0.weight"].shape[0] == 3 * 7 and torch.equal(own["model.17.anchors"],
                                                                        ref["model.17.anchors"].float())


def test_fine_tuning_run_from_a_yolov5_checkpoint(files, micro, tmp_path):
    out = train.run(data=str(micro), weights=str(files["yolov5_last.pt"]), epochs=1, imgsz=64, batch_size=8,
                    workers=0, noplots=True, amp="off", project=str(tmp_path))
    best = ck.load_checkpoint(out.save_dir / "weights" / "best.pt")
    assert best["names"] == list(CLASSES) and "origin" not in best


def test_an_older_torch_gets_one_line_asking_for_an_upgrade(files, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    with pytest.raises(UserError, match=r"needs torch >= 2.6.*2.5.1"):
        ck.load_checkpoint(files["yolov5_pip.pt"])
