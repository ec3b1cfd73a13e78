"""The Python API (models/api.py, hubconf.py, utils/data/inputs.py, utils/report/detections.py) and ensembles
(utils/interop/backends.Ensemble through detect.py, test.py and the API): torch.hub offline, the same boxes as
detect.py, every input kind, the result views and files, and refusals in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import test as test_cli
import types
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from helpers import cli_in_process

import detect
import hubconf
import validator
from models.api import Detector, create, load
from utils.data.synthetic import CLASSES
from utils.engine.checkpoint import atomic_save, make_checkpoint
from utils.errors import UserError

REPO = Path(__file__).resolve().parents[1]
NAMES = list(CLASSES)  # the built-in dataset's classes, so test.py can run the checkpoint on `micro`
IMGSZ = 128  # recorded in the checkpoint: the size detect.py and the API run at when none is asked for
SHAPES = ((96, 128), (128, 80), (70, 70))


pytestmark = pytest.mark.usefixtures("one_thread")


def _checkpoint(path: Path, names: list[str], cfg: str = "yolov5n.yaml") -> Path:
    """Random weights that behave like trained ones: BatchNorm statistics measured on random pictures (at their
    initial values activations fade away and every output is its bias), class biases at 0 and objectness at -1, so
    confidences spread over 0.1-0.35 and the default threshold 0.25 keeps a few boxes per picture (5% of candidates)."""
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model(cfg, nc=len(names))
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # a plain average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.rand(4, 3, IMGSZ, IMGSZ))
        for conv in model.model[-1].m:
            bias = conv.bias.view(model.model[-1].na, -1)
            bias[:, 4], bias[:, 5:] = -1.0, 0.0
    model.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save(make_checkpoint(model, model.yaml, names, epoch=0, imgsz=IMGSZ), path)
    return path


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("weights") / "best.pt", NAMES)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    """PNG pictures (lossless, so an array read back equals what the file holds) of coloured squares on grey."""
    folder = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(SHAPES):
        im = np.full((h, w, 3), 40, np.uint8)
        for _ in range(3):
            x, y = int(rng.integers(0, w - 30)), int(rng.integers(0, h - 30))
            im[y:y + 30, x:x + 30] = rng.integers(60, 255, 3)
        cv2.imwrite(str(folder / f"im{i}.png"), im)
    return folder


@pytest.fixture(scope="module")
def detector(weights) -> Detector:
    return load(weights, device="cpu")


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> int:
    """Assert per-picture detections are equal; returns the number of boxes (a test of nothing would find 0)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and torch.equal(x, y), (x, y)
    return sum(len(x) for x in a)


# ----------------------------------------------------------------------------------------- torch.hub


@pytest.mark.slow
def test_hub_load_offline_in_three_lines(weights, pictures, detector, tmp_path):
    """A fresh interpreter outside the repository: torch.hub.load(source='local'), call, read the boxes."""
    picture = pictures / "im0.png"
    code = (f"import json, torch\n"
            f"model = torch.hub.load({str(REPO)!r}, 'custom', path={str(weights)!r}, source='local', device='cpu')\n"
            f"results = model({str(picture)!r})\n"
            f"print(json.dumps([results.xyxy[0].tolist(), results.names, 'models' in sys.modules]))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the repository is not importable but by hub
    env.update(OMP_NUM_THREADS="1", HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")  # no network
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    xyxy, names, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded  # the project's modules came in through hubconf.py
    assert names == NAMES
    expected = detector(picture).xyxy[0]
    assert len(expected) > 0 and torch.allclose(torch.tensor(xyxy), expected)


def test_hub_entry_points(weights, tmp_path):
    entries = sorted(f for f in dir(hubconf) if callable(getattr(hubconf, f)) and not f.startswith("_"))
    assert entries == ["custom", "yolov5l", "yolov5m", "yolov5n", "yolov5s", "yolov5x"]  # what torch.hub.list shows
    untrained = torch.hub.load(str(REPO), "yolov5n", classes=["cat", "dog"], device="cpu", source="local")
    assert untrained.names == ["cat", "dog"] and untrained.backend.path.name == "yolov5n.yaml"
    assert len(hubconf.yolov5n(classes=3, device="cpu").names) == 3 and len(hubconf.yolov5n(device="cpu").names) == 80
    same = hubconf.yolov5n(weights=weights, device="cpu", conf=0.5)  # weights= is path= under our commands' name
    assert same.names == NAMES and same.conf == 0.5 and same.backend.path == weights
    with pytest.raises(UserError, match="not yolov5s"):  # a yolov5n file under the yolov5s entry
        hubconf.yolov5s(path=weights, device="cpu")
    with pytest.raises(UserError, match="path= or weights="):
        hubconf.custom(path=weights, weights=weights)
    with pytest.raises(UserError, match="drop classes="):
        hubconf.yolov5n(path=weights, classes=3)
    with pytest.raises(UserError, match="yolov5n.pt not found"):  # pretrained: weights/yolov5n.pt, never a download
        hubconf.yolov5n(pretrained=True, device="cpu")


# ----------------------------------------------------------------------------------------- the same boxes as detect.py


def _labels(folder: Path) -> dict[str, np.ndarray]:
    return {p.stem: np.loadtxt(p, ndmin=2).reshape(-1, 6) for p in sorted(folder.glob("*.txt"))}


@pytest.mark.parametrize("batch_size", [1, 2])
def test_boxes_equal_detect_py(weights, pictures, tmp_path, batch_size):
    """detect.py --save-txt --save-conf and the API on the same folder, default settings: the same rows."""
    save_dir = detect.run(weights, pictures, device="cpu", save_txt=True, save_conf=True, batch_size=batch_size,
                          project=tmp_path, nosave=True)
    labels = _labels(save_dir / "labels")
    results = load(weights, device="cpu", batch_size=batch_size)(pictures)
    assert results.files == [f"im{i}.png" for i in range(len(SHAPES))]
    # the size the checkpoint was trained at, square for batches (the last picture is 70x70: square either way)
    assert results.shape[2:] == (IMGSZ, IMGSZ)
    n = 0
    for f, xywhn in zip(results.files, results.xywhn):
        rows = labels[Path(f).stem]
        assert len(rows) == len(xywhn)
        assert (rows[:, 0] == xywhn[:, 5].numpy()).all()
        assert np.abs(rows[:, 1:5] - xywhn[:, :4].numpy()).max() < 2e-6
        assert np.abs(rows[:, 5] - xywhn[:, 4].numpy()).max() < 6e-6
        n += len(rows)
    assert 0 < n < 3 * 100  # boxes found, and the default conf 0.25 dropped most candidates


# ----------------------------------------------------------------------------------------- inputs


def test_every_input_kind_gives_the_same_boxes(detector, pictures):
    path = pictures / "im0.png"
    bgr = cv2.imread(str(path))
    rgb = np.ascontiguousarray(bgr[..., ::-1])
    chw = torch.from_numpy(rgb.copy()).permute(2, 0, 1)
    ref = detector(path)
    assert len(ref.xyxy[0]) > 0
    same = {"str path": detector(str(path)), "BGR array": detector(bgr), "RGB array": detector(rgb, rgb=True),
            "CHW uint8": detector(chw), "CHW float": detector(chw.float() / 255), "BCHW": detector(chw[None])}
    pil = pytest.importorskip("PIL.Image")
    same["PIL"] = detector(pil.open(path))
    for kind, r in same.items():
        assert _same(ref.xyxy, r.xyxy) > 0, kind
    assert not torch.equal(detector(rgb).xyxy[0], ref.xyxy[0])  # colour order matters, so rgb=True is not a no-op
    mixed = detector([path, bgr, chw.repeat(2, 1, 1, 1), str(pictures)])
    assert len(mixed) == 1 + 1 + 2 + len(SHAPES)
    assert mixed.files == ["im0.png", "image1.jpg", "image2.jpg", "image3.jpg", "im0_2.png", "im1.png", "im2.png"]
    _same([mixed.xyxy[k] for k in (0, 1, 2, 3, 4)], ref.xyxy * 5)


def test_grey_and_bgra_arrays(detector, pictures):
    bgr = cv2.imread(str(pictures / "im1.png"))
    grey = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
    assert _same(detector(grey).xyxy, detector(cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR)).xyxy) >= 0
    assert _same(detector(cv2.cvtColor(bgr, cv2.COLOR_BGR2BGRA)).xyxy, detector(bgr).xyxy) > 0


@pytest.mark.parametrize("source, match", [
    ("https://example.com/bus.jpg", "is a URL, and this detector downloads nothing"),
    ("rtsp://127.0.0.1/live", "is a URL"),
    (np.full((32, 32, 3), 200.0), "values in 0..1"),
    (np.zeros((32, 32, 3), np.int32), "uint8"),
    (np.zeros((3, 32, 32, 2), np.uint8), "HxWx3"),
    (torch.rand(2, 3), "CHW or BCHW"),
    (torch.full((3, 32, 32), 2.0), "values in 0..1"),
    (12, "cannot detect on a int"),
    ([], "no pictures given"),
])
def test_bad_inputs_are_one_line(detector, source, match):
    with pytest.raises(UserError, match=match) as e:
        detector(source)
    assert "\n" not in str(e.value)


def test_missing_file_and_video_only(detector, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        detector(tmp_path / "nope.jpg")
    video = tmp_path / "clip.mp4"
    w = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 48))
    w.write(np.zeros((48, 64, 3), np.uint8))
    w.release()
    with pytest.raises(UserError, match="detect.py --source"):
        detector(video)
    (tmp_path / "broken.png").write_bytes(b"not a picture")
    with pytest.raises(UserError, match="cannot read it as an image"):
        detector(tmp_path / "broken.png")


# ----------------------------------------------------------------------------------------- results


def test_views_agree(detector, pictures):
    r = detector(pictures)
    assert len(r) == len(SHAPES) and sum(len(p) for p in r.xyxy) > 0
    for i, (im, xyxy) in enumerate(zip(r.ims, r.xyxy)):
        h, w = im.shape[:2]
        gain = torch.tensor([w, h, w, h])
        x1, y1, x2, y2 = xyxy[:, :4].T
        assert torch.allclose(r.xywh[i][:, :4], torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], 1))
        assert torch.allclose(r.xyxyn[i][:, :4] * gain, xyxy[:, :4], atol=1e-4)
        assert torch.allclose(r.xywhn[i][:, :4] * gain, r.xywh[i][:, :4], atol=1e-4)
        assert ((r.xyxyn[i][:, :4] >= 0) & (r.xyxyn[i][:, :4] <= 1)).all()  # clipped to the picture
        for view in (r.xywh, r.xyxyn, r.xywhn):  # confidence and class ride along unchanged
            assert torch.equal(view[i][:, 4:], xyxy[:, 4:])
        assert torch.equal(r.boxes[i], xyxy[:, :4]) and torch.equal(r.confidences[i], xyxy[:, 4])
        assert r.classes[i].dtype == torch.int64 and r.labels[i] == [NAMES[c] for c in r.classes[i]]
        assert (xyxy[:-1, 4] >= xyxy[1:, 4]).all()  # most confident first


def test_indexing_iteration_and_text(detector, pictures, capsys):
    r = detector(pictures)
    assert [one.files for one in r] == [[f] for f in r.files] and len(r.tolist()) == len(r)
    assert _same(r[-1].xyxy, r.xyxy[-1:]) >= 0 and r[1:].files == r.files[1:]
    with pytest.raises(IndexError):
        r[len(r)]
    r.print()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"image 1/{len(r)} im0.png: 96x128 ") and out[-1].startswith("Speed: ")
    assert set(r.speed) == {"pre-process", "inference", "NMS"} and r.speed["inference"] > 0
    assert repr(r) == f"<Detections: {len(r)} picture(s), {sum(len(p) for p in r.xyxy)} box(es)>"


def test_render_save_and_crop(detector, pictures, tmp_path):
    r = detector(pictures)
    originals = [im.copy() for im in r.ims]
    drawn = r.render()
    assert all(np.array_equal(a, b) for a, b in zip(r.ims, originals))  # render draws on copies
    boxed = [i for i, p in enumerate(r.xyxy) if len(p)]
    assert boxed and all(not np.array_equal(drawn[i], r.ims[i]) for i in boxed)
    assert np.array_equal(r.render(rgb=True)[0], drawn[0][..., ::-1])
    folder = r.save(tmp_path / "exp")
    assert folder == tmp_path / "exp" and sorted(p.name for p in folder.iterdir()) == sorted(r.files)
    assert np.array_equal(cv2.imread(str(folder / r.files[boxed[0]])), drawn[boxed[0]])  # PNG: lossless
    assert r.save(tmp_path / "exp") == tmp_path / "exp2"  # an existing folder is not overwritten
    crops = r.crop(tmp_path / "exp", exist_ok=True)
    assert len(crops) == sum(len(p) for p in r.xyxy)
    files = sorted((tmp_path / "exp" / "crops").rglob("*.jpg"))
    assert files == sorted(c["file"] for c in crops)
    assert {f.parent.name for f in files} <= set(NAMES) and all(c["im"].size for c in crops)
    first = crops[0]
    assert first["label"].startswith(NAMES[first["cls"]]) and first["box"].shape == (4,)
    before = sorted(tmp_path.rglob("*"))
    unsaved = r.crop(tmp_path / "exp3", save=False)
    assert sorted(tmp_path.rglob("*")) == before and all(c["file"] is None for c in unsaved)
    assert all(np.array_equal(a["im"], b["im"]) for a, b in zip(unsaved, crops))


def test_pandas_without_pandas_is_one_line(detector, pictures, monkeypatch):
    r = detector(pictures / "im0.png")
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    with pytest.raises(UserError, match="pip install pandas") as e:
        r.pandas()
    assert "\n" not in str(e.value)


def test_pandas_tables(detector, pictures, monkeypatch):
    """With pandas (a stand-in recording what it is given, so the test runs where pandas is not installed)."""
    class DataFrame:
        def __init__(self, rows, columns):
            self.rows, self.columns = rows, columns

    monkeypatch.setitem(sys.modules, "pandas", types.SimpleNamespace(DataFrame=DataFrame))
    r = detector(pictures)
    t = r.pandas()
    assert len(t.xyxy) == len(r)
    assert t.xyxy[0].columns == ["xmin", "ymin", "xmax", "ymax", "confidence", "class", "name"]
    assert t.xywhn[0].columns == ["xcenter", "ycenter", "width", "height", "confidence", "class", "name"]
    k = next(i for i, p in enumerate(r.xyxy) if len(p))
    row = t.xywhn[k].rows[0]
    assert row[:5] == pytest.approx(r.xywhn[k][0, :5].tolist()) and row[5:] == [r.classes[k][0].item(), r.labels[k][0]]


def test_settings_and_size(weights, pictures):
    d = load(weights, device="cpu")
    assert (d.conf, d.iou, d.max_det, d.batch_size) == (0.25, 0.45, 1000, 1)  # detect.py's defaults
    assert d.input_size() == (IMGSZ, IMGSZ) and d.input_size(64) == (64, 64) and d.input_size(100) == (128, 128)
    many = sum(len(p) for p in d(pictures).xyxy)
    d.conf = 0.3
    fewer = sum(len(p) for p in d(pictures).xyxy)
    assert 0 < fewer < many
    d.classes = [0]
    assert all((p[:, 5] == 0).all() for p in d(pictures).xyxy)
    assert d(pictures / "im0.png", size=64).shape[2:] == (64, 64)
    d.conf = 1.5
    with pytest.raises(UserError, match=r"conf=1.5 must lie in \[0, 1\]"):
        d(pictures)


def test_untrained_detector(pictures):
    d = create("yolov5n", classes=2, device="cpu", conf=0.0, max_det=5)
    r = d(pictures / "im0.png")
    assert d.names == ["0", "1"] and len(r.xyxy[0]) == 5  # conf 0: boxes even from random weights
    with pytest.raises(UserError, match="number of classes"):
        create("yolov5n", classes=0)


# ----------------------------------------------------------------------------------------- ensembles


@pytest.fixture(scope="module")
def others(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("others")
    return {"fewer": _checkpoint(folder / "fewer.pt", NAMES[:2]),
            "renamed": _checkpoint(folder / "renamed.pt", [n.upper() for n in NAMES])}


@pytest.mark.slow
def test_ensemble_with_itself_gives_the_models_boxes(weights, pictures, detector, tmp_path):
    both = load([weights, weights], device="cpu", conf=0.05)
    alone = load(weights, device="cpu", conf=0.05)
    assert both.backend.kind == "ensemble" and len(both.backend.members) == 2
    x = torch.rand(1, 3, 64, 64)
    assert both.backend(x)[0].shape[1] == 2 * alone.backend(x)[0].shape[1]  # joined along the box dimension
    assert _same(both(pictures).xyxy, alone(pictures).xyxy) > 0
    one = load([weights], device="cpu")
    assert one.backend.kind == "pytorch"  # a list of one file is that file
    runs = {}
    for name, w in (("alone", weights), ("both", [weights, weights])):
        runs[name] = _labels(detect.run(w, pictures, device="cpu", save_txt=True, save_conf=True, nosave=True,
                                        project=tmp_path, name=name) / "labels")
    assert runs["alone"].keys() == runs["both"].keys()
    assert all(np.array_equal(runs["alone"][k], runs["both"][k]) for k in runs["alone"])
    assert sum(len(v) for v in runs["alone"].values()) > 0


@pytest.mark.slow
def test_test_py_evaluates_an_ensemble(weights, micro, tmp_path):
    """Several --weights are one ensemble (YOLOv5's val.py): one result, equal to the model's for a model with
    itself; --task speed still times each file in turn."""
    common = ["--data", str(micro), "--img", "64", "--workers", "0", "--batch-size", "4", "--no-plots",
              "--device", "cpu", "--project", str(tmp_path), "--save-txt", "--save-conf"]
    (alone,) = test_cli.main(["--weights", str(weights), *common, "--name", "alone"])
    results = test_cli.main(["--weights", str(weights), str(weights), *common, "--name", "both"])
    assert len(results) == 1
    both = results[0]
    assert (both.map, both.map50, both.mp, both.mr) == (alone.map, alone.map50, alone.mp, alone.mr)
    rows = [_labels(r.save_dir / "labels") for r in (alone, both)]  # every detection of every picture
    assert rows[0].keys() == rows[1].keys() and all(np.array_equal(rows[0][k], rows[1][k]) for k in rows[0])
    assert sum(len(v) for v in rows[0].values()) > 0
    speed = test_cli.main(["--weights", str(weights), str(weights), "--task", "speed", *common])
    assert len(speed) == 2
    res = validator.run(micro, weights=[weights, weights], imgsz=64, workers=0, plots=False, save_json=True,
                        project=tmp_path, name="json")
    assert (res.save_dir / "best+best_predictions.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("other", ["fewer", "renamed"])
def test_ensemble_of_different_classes_is_refused(weights, others, other):
    with pytest.raises(UserError) as e:
        load([weights, others[other]], device="cpu")
    msg = str(e.value)
    assert "\n" not in msg and str(weights) in msg and str(others[other]) in msg and "different classes" in msg


@pytest.mark.slow
def test_ensemble_refusals_on_the_command_lines(weights, others, pictures, micro, tmp_path, capsys, monkeypatch):
    pair = [str(weights), str(others["fewer"])]
    argv = ["--weights", *pair, "--source", str(pictures), "--project", str(tmp_path), "--device", "cpu"]
    code, lines = cli_in_process(detect.main, argv, capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and all(p in lines[0] for p in pair), lines
    argv = ["--weights", *pair, "--data", str(micro), "--workers", "0", "--project", str(tmp_path), "--device", "cpu"]
    code, lines = cli_in_process(test_cli.main, argv, capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and all(p in lines[0] for p in pair), lines
    assert not (tmp_path / "exp").exists()  # refused before any output folder


def test_exported_file_in_an_ensemble_is_refused(weights, tmp_path):
    onnx = tmp_path / "best.onnx"
    onnx.write_bytes(b"never opened")  # refused by its suffix, before any runtime is asked
    with pytest.raises(UserError, match="ensembles take .pt checkpoints only") as e:
        load([weights, onnx], device="cpu")
    assert str(onnx) in str(e.value)


def test_detect_cli_takes_several_weights():
    o = detect.parse_opt(["--weights", "a.pt", "b.pt"])
    assert o.weights == ["a.pt", "b.pt"]
    assert detect.parse_opt(["--weights", "a.pt"]).weights == "a.pt"  # one file is not an ensemble of one
    assert detect.parse_opt([]).weights == "best.pt"


def test_one_class_name_as_a_string_is_one_class():
    import hubconf

    assert hubconf.yolov5n(classes="cat", device="cpu").names == ["cat"]
    assert hubconf.yolov5n(classes=["cat", "dog"], device="cpu").names == ["cat", "dog"]
