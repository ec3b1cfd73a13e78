"""detect.py and utils/data/sources.py: box geometry, precision rule, every kind of source (and what is no source),
end to end; the size it runs at (a checkpoint's, an ensemble's); outputs of inputs that share a base name."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from helpers import cli_in_process, log_lines as _lines, one_error

import detect
from models.yolo import Model, load_for_inference
from utils.boxes import scale_boxes
from utils.data.augment import letterbox
from utils.data.sources import MediaSource
from utils.engine import checkpoint as ck
from utils.engine.amp import inference_dtype
from utils.engine.checkpoint import atomic_save, make_checkpoint
from utils.errors import UserError
from utils.inference import image_hw

REPO = Path(__file__).resolve().parents[1]
NAMES = ["circle", "square", "triangle"]
IMGSZ = 64  # smallest useful size: keeps every run of the untrained model in the tens of milliseconds


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """An untrained yolov5n checkpoint in the project's format (3 classes)."""
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=len(NAMES))
    path = tmp_path_factory.mktemp("weights") / "untrained.pt"
    atomic_save(make_checkpoint(model, model.yaml, NAMES, epoch=0), path)
    return path


def _images(folder: Path, shapes=((60, 80), (90, 50), (64, 64))) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i, (h, w) in enumerate(shapes):
        p = folder / f"im{i}.jpg"
        cv2.imwrite(str(p), rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        paths.append(p)
    return paths


def _video(path: Path, n: int, size=(80, 60)) -> Path:
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, size)
    assert w.isOpened()
    for i in range(n):
        w.write(np.full((size[1], size[0], 3), 20 * i, np.uint8))
    w.release()
    return path


def _frames(path: Path) -> int:
    cap = cv2.VideoCapture(str(path))
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    return n


def _run(weights, source, tmp_path, **kw) -> Path:
    kw = {"imgsz": IMGSZ, "conf_thres": 0.001, "max_det": 20, "project": tmp_path / "runs", **kw}
    return detect.run(weights, source, **kw)


# ----------------------------------------------------------------------------------------- geometry

SHAPES = [(480, 640), (640, 480), (100, 90), (37, 1000), (721, 1281), (64, 64)]


@pytest.mark.parametrize("imgsz", [64, 320, 640, (320, 480)])
@pytest.mark.parametrize("square", [False, True])
def test_letterbox_then_scale_boxes_is_exact(imgsz, square):
    """A box placed by the letterbox's own geometry maps back through scale_boxes to within 1e-3 px."""
    rng = np.random.default_rng(1)
    hw = image_hw(imgsz, 32)
    for h0, w0 in SHAPES:
        frame = SimpleNamespace(im0=np.zeros((h0, w0, 3), np.uint8))
        x, (((ry, rx), (padw, padh)),) = detect.preprocess([frame], hw, 32, square, torch.device("cpu"), torch.float32)
        if square:
            assert tuple(x.shape[2:]) == hw
        else:
            assert x.shape[2] % 32 == 0 and x.shape[3] % 32 == 0 and x.shape[2] <= hw[0] and x.shape[3] <= hw[1]
        xy = rng.uniform(0, 1, (20, 2, 2)) * [w0, h0]
        box0 = np.concatenate([xy.min(1), xy.max(1)], 1)  # (20, 4) xyxy inside the original image
        box1 = box0 * [rx, ry, rx, ry] + [padw, padh, padw, padh]
        back = scale_boxes(x.shape[2:], torch.tensor(box1, dtype=torch.float64), (h0, w0), ratio_pad=((ry, rx), (padw, padh)))
        assert np.abs(back.numpy() - box0).max() < 1e-3


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("auto", [True, False])
def test_letterbox_geometry_matches_pixels(shape, auto):
    """The ratio and pad that letterbox reports are where the picture actually lands."""
    h0, w0 = shape
    im = np.full((h0, w0, 3), 255, np.uint8)
    out, (rx, ry), (padw, padh) = letterbox(im, 320, stride=32, auto=auto)
    content = np.argwhere((out == 255).all(2))
    (top, left), (bottom, right) = content.min(0), content.max(0) + 1
    assert (left, top) == (padw, padh)
    assert (right - left, bottom - top) == (round(w0 * rx), round(h0 * ry))
    assert abs(rx - ry) < 2 / min(h0, w0)  # aspect ratio kept up to rounding one side to whole pixels


def test_drawn_object_maps_back_to_its_place():
    """A white rectangle found in the letterboxed picture maps back onto the original rectangle."""
    im = np.zeros((300, 500, 3), np.uint8)
    box = (120, 40, 260, 200)
    cv2.rectangle(im, box[:2], (box[2] - 1, box[3] - 1), (255, 255, 255), -1)
    frame = SimpleNamespace(im0=im)
    x, (geom,) = detect.preprocess([frame], (256, 256), 32, False, torch.device("cpu"), torch.float32)
    ys, xs = np.nonzero(x[0, 0].numpy() > 0.5)
    found = torch.tensor([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], dtype=torch.float64)
    back = scale_boxes(x.shape[2:], found, im.shape, ratio_pad=geom)[0].numpy()
    assert np.abs(back - box).max() <= 1 / geom[0][0] + 0.5  # one resized pixel


@pytest.mark.parametrize("bad", [{"conf_thres": 1.5}, {"iou_thres": -0.1}, {"batch_size": 0}, {"max_det": 0}])
def test_bad_options_are_user_errors(weights, tmp_path, bad):
    with pytest.raises(UserError):
        _run(weights, tmp_path, tmp_path, **bad)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("bad, says", [({"line_thickness": -5}, "--line-thickness -5 must lie in 0..100"),
                                       ({"line_thickness": 101}, "--line-thickness 101"),
                                       ({"classes": [3]}, "--classes 3: .* has 3 classes, 0..2"),
                                       ({"classes": [0, -1, 7]}, "--classes -1 7: ")])
def test_drawing_and_class_options_out_of_range_are_refused(weights, tmp_path, bad, says):
    """A negative line width drew mirrored text and no boxes; a class the model does not have found nothing."""
    _images(tmp_path / "src", shapes=((60, 80),))
    with pytest.raises(UserError, match=says):
        _run(weights, tmp_path / "src", tmp_path, **bad)
    assert not (tmp_path / "runs").exists()


def test_classes_outside_the_model_are_one_line_on_the_command_line(weights, tmp_path, capsys, monkeypatch):
    src = _images(tmp_path / "src", shapes=((60, 80),))[0]
    code, lines = cli_in_process(detect.main, ["--weights", str(weights), "--source", str(src), "--classes", "99",
                                               "--project", str(tmp_path / "runs")], capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and "--classes 99" in lines[0] and "0..2" in lines[0], lines


def test_image_hw():
    assert image_hw(640, 32) == (640, 640)
    assert image_hw(100, 32) == (128, 128)
    assert image_hw([480, 600], 32) == (480, 608)
    with pytest.raises(UserError):
        image_hw([1, 2, 3], 32)


# ----------------------------------------------------------------------------------------- precision

CUDA = torch.device("cuda:0")


@pytest.mark.parametrize(
    "props, half, expected",
    [
        (SimpleNamespace(name="NVIDIA GeForce GTX 1080", major=6, minor=1), None, torch.float32),
        (SimpleNamespace(name="Tesla T4", major=7, minor=5), None, torch.float16),
        (SimpleNamespace(name="NVIDIA GeForce RTX 2080 Ti", major=7, minor=5), None, torch.float16),
        (SimpleNamespace(name="NVIDIA GeForce GTX 1660 SUPER", major=7, minor=5), None, torch.float32),
        (SimpleNamespace(name="Quadro T1000", major=7, minor=5), None, torch.float32),
        (SimpleNamespace(name="NVIDIA A100-SXM4-80GB", major=8, minor=0), None, torch.float16),
        (SimpleNamespace(name="NVIDIA A100-SXM4-80GB", major=8, minor=0), True, torch.float16),
        (SimpleNamespace(name="NVIDIA A100-SXM4-80GB", major=8, minor=0), False, torch.float32),  # --no-half
    ],
)
def test_inference_dtype_rule(props, half, expected):
    assert inference_dtype(CUDA, half, props=props) == expected


def test_inference_dtype_cpu():
    assert inference_dtype(torch.device("cpu")) == torch.float32
    assert inference_dtype("cpu", half=False) == torch.float32
    assert inference_dtype("cpu", half=True) == torch.float16  # asked for: emulated FP16 (tests/test_fp16_cpu.py)


def test_cli_half_flags_and_defaults_agree():
    assert detect.parse_opt([]).half is None
    assert detect.parse_opt(["--half"]).half is True
    assert detect.parse_opt(["--no-half"]).half is False
    assert detect.parse_opt([]) == detect.DetectOptions()  # the CLI is built from DetectOptions' defaults
    o = detect.parse_opt(["--img", "320", "--classes", "0", "2", "--save-txt", "--conf-thres", "0.5"])
    assert (o.imgsz, o.classes, o.save_txt, o.conf_thres) == (320, [0, 2], True, 0.5)
    assert detect.parse_opt(["--imgsz", "480", "640"]).imgsz == [480, 640]


def test_cpu_run_uses_fp32_and_fused_model(weights):
    backend, names, stride, dtype = detect.load_detector(weights, torch.device("cpu"), None)
    model = backend.model  # a .pt runs behind utils.interop.backends.PyTorchBackend
    assert dtype == torch.float32 and next(model.parameters()).dtype == torch.float32
    assert names == NAMES and stride == 32 and not model.training
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())  # fused
    backend, _, _, dtype = detect.load_detector(weights, torch.device("cpu"), True)  # --half: asked for, emulated
    assert dtype == torch.float16 and all(p.dtype == torch.float16 for p in backend.model.parameters())


# ----------------------------------------------------------------------------------------- sources


def test_folder_with_corrupt_file(weights, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    src = tmp_path / "imgs"
    paths = _images(src)
    (src / "broken.jpg").write_bytes(b"not a jpeg at all")
    (src / "readme.md").write_text("not an image")
    save_dir = _run(weights, src, tmp_path, save_txt=True, save_conf=True)
    assert sorted(p.name for p in save_dir.glob("*.jpg")) == sorted(p.name for p in paths)
    assert sorted(p.stem for p in (save_dir / "labels").glob("*.txt")) == sorted(p.stem for p in paths)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("broken.jpg" in w for w in warnings) == 1 and sum("readme.md" in w for w in warnings) == 1
    logs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("image 2/4 ") and m.endswith("ms") for m in logs)  # broken.jpg was 1/4
    assert any(m.startswith("Speed:") for m in logs) and any(m.startswith("Results saved to") for m in logs)


def test_label_files_are_yolo_format(weights, tmp_path):
    src = _images(tmp_path / "imgs", shapes=((60, 80),))[0]
    save_dir = _run(weights, src, tmp_path, save_txt=True, save_conf=True, save_crop=True)
    rows = np.loadtxt(save_dir / "labels" / "im0.txt", ndmin=2)
    assert rows.shape[1] == 6 and len(rows) > 0  # untrained, conf 0.001: there are boxes
    assert np.isin(rows[:, 0], range(len(NAMES))).all()
    assert (rows[:, 1:5] >= 0).all() and (rows[:, 1:5] <= 1).all() and (rows[:, 5] > 0.001).all()
    crops = list((save_dir / "crops").rglob("*.jpg"))
    assert len(crops) == len(rows) and {c.parent.name for c in crops} <= set(NAMES)
    save_dir = _run(weights, src, tmp_path, save_txt=True, nosave=True)
    assert np.loadtxt(save_dir / "labels" / "im0.txt", ndmin=2).shape[1] == 5
    assert not list(save_dir.glob("*.jpg"))  # --nosave


def test_txt_list_and_glob(weights, tmp_path):
    paths = _images(tmp_path / "imgs")
    listing = tmp_path / "list.txt"
    listing.write_text(f"imgs/{paths[0].name}\n{paths[2]}\n\n")  # relative to the list, and absolute
    save_dir = _run(weights, listing, tmp_path)
    assert sorted(p.name for p in save_dir.glob("*.jpg")) == [paths[0].name, paths[2].name]
    save_dir = _run(weights, str(tmp_path / "imgs" / "im[01].jpg"), tmp_path)
    assert sorted(p.name for p in save_dir.glob("*.jpg")) == ["im0.jpg", "im1.jpg"]


def test_batched_folder_matches_shapes(weights, tmp_path):
    src = tmp_path / "imgs"
    _images(src, shapes=((60, 80), (90, 50), (64, 64), (30, 100), (50, 50)))
    save_dir = _run(weights, src, tmp_path, batch_size=2, save_txt=True)
    for p in sorted(src.glob("*.jpg")):
        out = cv2.imread(str(save_dir / p.name))
        assert out.shape == cv2.imread(str(p)).shape  # drawn on the original, not the letterboxed picture
        rows = np.loadtxt(save_dir / "labels" / f"{p.stem}.txt", ndmin=2)
        assert (rows[:, 1:5] >= 0).all() and (rows[:, 1:5] <= 1).all()


def test_video_frame_by_frame(weights, tmp_path):
    video = _video(tmp_path / "clip.mp4", 5)
    save_dir = _run(weights, video, tmp_path, save_txt=True)
    assert _frames(save_dir / "clip.mp4") == 5
    assert sorted(p.name for p in (save_dir / "labels").glob("*.txt")) == [f"clip_{i}.txt" for i in range(5)]
    save_dir = _run(weights, video, tmp_path, save_txt=True, vid_stride=2)
    assert _frames(save_dir / "clip.mp4") == 3
    assert sorted(p.name for p in (save_dir / "labels").glob("*.txt")) == ["clip_0.txt", "clip_2.txt", "clip_4.txt"]


def test_zero_frame_video_warns(weights, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    src = tmp_path / "media"
    _images(src, shapes=((60, 80),))
    _video(src / "empty.mp4", 0)
    (src / "garbage.avi").write_bytes(b"\x00" * 100)
    save_dir = _run(weights, src, tmp_path)
    assert (save_dir / "im0.jpg").is_file()
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "empty.mp4" in warnings and "garbage.avi" in warnings
    runs = sorted((tmp_path / "runs").iterdir())
    for alone in ("empty.mp4", "garbage.avi"):  # the only source, and unreadable: a warning, then one error line
        with pytest.raises(UserError, match="nothing was processed"):
            _run(weights, src / alone, tmp_path)
        assert sorted((tmp_path / "runs").iterdir()) == runs  # no empty results folder left behind


def test_offline_stream_is_one_user_error(weights, tmp_path):
    with pytest.raises(UserError, match="cannot open the stream"):
        _run(weights, "rtsp://127.0.0.1:9/none", tmp_path)
    assert not (tmp_path / "runs").exists()  # nothing created for a source that failed


@pytest.fixture
def stalling_stream():
    """An MJPEG stream over HTTP on 127.0.0.1 that sends 3 frames and then keeps its connection open and silent (a
    camera that hangs): its URL. The silence ends when the test does (at most a minute)."""
    import http.server
    import threading

    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
            self.end_headers()
            for i in range(3):
                jpg = cv2.imencode(".jpg", np.full((48, 64, 3), 60 * i, np.uint8))[1].tobytes()
                self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(jpg)
                                 + jpg + b"\r\n")
            self.wfile.flush()
            release.wait(60)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/stream.mjpg"
    release.set()
    server.shutdown()
    server.server_close()


def _detect_stream(weights, url: str, tmp_path: Path, *flags: str) -> subprocess.Popen:
    """detect.py on `url` as a process (stdout piped, stderr to tmp_path/stderr.txt), once its third frame is done."""
    err = open(tmp_path / "stderr.txt", "wb")
    p = subprocess.Popen([sys.executable, "detect.py", "--weights", str(weights), "--source", url, "--imgsz",
                          str(IMGSZ), "--project", str(tmp_path / "runs"), *flags], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=err, text=True)
    err.close()
    out = []
    while "(frame 2)" not in (line := p.stdout.readline()):
        out.append(line)
        assert line, "".join(out) + (tmp_path / "stderr.txt").read_text()
    return p


@pytest.mark.slow
def test_a_stalled_stream_ends_after_stream_timeout_with_one_line(weights, stalling_stream, tmp_path):
    p = _detect_stream(weights, stalling_stream, tmp_path, "--stream-timeout", "2")
    try:
        rest, _ = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0, (tmp_path / "stderr.txt").read_text()
    stalls = [ln for ln in rest.splitlines() if "no frame from" in ln]
    assert len(stalls) == 1 and stalling_stream in stalls[0] and "2 s" in stalls[0] and "--stream-timeout" in stalls[0]
    assert _frames(next((tmp_path / "runs" / "exp").glob("*.mp4"))) == 3


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_acts_while_a_stream_read_blocks(weights, stalling_stream, tmp_path, sig):
    """The stream is silent and OpenCV's read would wait 30 s: the signal still stops the run within seconds (10 s
    allowed: the end includes the interpreter's teardown, slow on a busy machine), and the video of the frames done
    plays."""
    import signal
    import time

    p = _detect_stream(weights, stalling_stream, tmp_path)
    try:
        time.sleep(0.5)  # into the silent read
        t0 = time.monotonic()
        p.send_signal(getattr(signal, sig))
        rc = p.wait(timeout=10)
        assert time.monotonic() - t0 < 10
    finally:
        p.kill()
    assert rc == 130 and "Traceback" not in (tmp_path / "stderr.txt").read_text()
    assert _frames(next((tmp_path / "runs" / "exp").glob("*.mp4"))) == 3


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "1e9"])
def test_stream_timeout_out_of_range_is_one_line(bad):
    with pytest.raises(UserError, match="--stream-timeout"):
        detect.check_options(detect.parse_opt(["--stream-timeout", bad]))


def test_media_source_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        MediaSource(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no images or videos"):
        MediaSource(tmp_path / "empty")
    with pytest.raises(UserError, match="vid-stride"):
        MediaSource(tmp_path, vid_stride=0)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "empty", "corrupt-video"])
def test_cli_bad_source_exits_2(weights, tmp_path, case):
    src = tmp_path / "nothing_here"
    if case == "empty":
        src.mkdir()
    if case == "corrupt-video":
        src = tmp_path / "bad.mp4"
        src.write_bytes(b"\x00" * 4096)
    r = subprocess.run([sys.executable, "detect.py", "--weights", str(weights), "--source", str(src),
                        "--project", str(tmp_path / "runs")], cwd=REPO, capture_output=True, text=True, timeout=120)
    one_error(r, str(src))


def test_view_img_without_display(weights, tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    caplog.set_level(logging.INFO)
    _run(weights, _images(tmp_path / "imgs", shapes=((60, 80),))[0], tmp_path, view_img=True)
    assert sum("no display" in r.getMessage() for r in caplog.records) == 1


def test_describe():
    det = np.array([[0, 0, 1, 1, 0.9, 0], [0, 0, 1, 1, 0.8, 1], [0, 0, 1, 1, 0.7, 0]])
    assert detect.describe(det, NAMES) == "2 circles, 1 square"
    assert detect.describe(np.zeros((0, 6)), NAMES) == "(no detections)"
    assert [detect.plural(w, 2) for w in ("bus", "box", "person", "butterfly", "toy")] == \
        ["buses", "boxes", "persons", "butterflies", "toys"]


@pytest.mark.slow
def test_default_source_is_sample_pictures(weights, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPYOLO_HOME", str(tmp_path / "home"))
    save_dir = _run(weights, None, tmp_path)
    assert len(list(save_dir.iterdir())) == 4


# ----------------------------------------------------------------------------------------- end to end


def _square_dataset(root: Path, n_train: int = 32, n_val: int = 4, size: int = 128) -> Path:
    """One bright square per picture on a dark noisy background, at random places: learnable in ~400 steps."""
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(n):
            im = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
            s = int(rng.integers(40, 70))
            x, y = (int(v) for v in rng.integers(0, size - s, 2))
            im[y:y + s, x:x + s] = rng.integers(150, 256, 3)
            cv2.imwrite(str(root / "images" / split / f"{i}.png"), im)
            (root / "labels" / split / f"{i}.txt").write_text(f"0 {(x + s / 2) / size} {(y + s / 2) / size} {s / size} {s / size}\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: square\n")
    hyp = (REPO / "data" / "hyps" / "hyp.scratch.yaml").read_text()
    # no mosaic and no colour jitter: the few steps go into learning one object's position and size
    overrides = {"mosaic": 0.0, "scale": 0.2, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "warmup_epochs_adam": 1.0}
    lines = [ln for ln in hyp.splitlines() if ln.split(":")[0].strip() not in overrides]
    (root / "hyp.yaml").write_text("\n".join(lines + [f"{k}: {v}" for k, v in overrides.items()]) + "\n")
    return root


@pytest.mark.slow
def test_trained_model_finds_known_object(tmp_path):
    import train

    data = _square_dataset(tmp_path / "squares")
    out = train.run(data=str(data / "data.yaml"), hyp=str(data / "hyp.yaml"), cfg="yolov5n.yaml", epochs=50,
                    imgsz=128, batch_size=4, workers=0, noval=True, noplots=True, device="cpu",
                    project=str(tmp_path / "train"))
    best = Path(getattr(out, "save_dir", out)) / "weights" / "best.pt"
    im = np.full((128, 128, 3), 30, np.uint8)
    truth = np.array([50, 20, 110, 80])  # x1, y1, x2, y2 of the object we put there
    im[truth[1]:truth[3], truth[0]:truth[2]] = (200, 220, 240)
    cv2.imwrite(str(tmp_path / "probe.png"), im)
    # default conf 0.25: over seeds 0-2 this training gives the probe 0.4-0.86 confidence and IoU 0.65-0.96
    save_dir = detect.run(best, tmp_path / "probe.png", imgsz=128, save_txt=True, save_conf=True,
                          project=tmp_path / "detect")
    rows = np.loadtxt(save_dir / "labels" / "probe.txt", ndmin=2)
    assert len(rows), "the trained model found nothing"
    cx, cy, w, h = rows[np.argmax(rows[:, 5]), 1:5] * 128
    found = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    inter = np.prod(np.clip(np.minimum(found[2:], truth[2:]) - np.maximum(found[:2], truth[:2]), 0, None))
    iou = inter / (np.prod(found[2:] - found[:2]) + np.prod(truth[2:] - truth[:2]) - inter)
    assert iou >= 0.5, f"best detection {found.round(1)} vs object {truth}: IoU {iou:.2f}"


# ----------------------------------------------------------------------------------------- outputs, lists, odd sources

@pytest.fixture(scope="module")
def nano_weights(tmp_path_factory) -> Path:
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=2)
    path = tmp_path_factory.mktemp("w") / "nano.pt"
    ck.atomic_save(ck.make_checkpoint(model, model.yaml, ["a", "b"], 0), path)
    return path


def test_two_inputs_with_one_base_name_get_their_own_outputs(nano_weights, tmp_path, caplog):
    import logging

    import detect

    rng = np.random.default_rng(1)
    for sub in ("a", "b"):
        (tmp_path / "in" / sub).mkdir(parents=True)
        cv2.imwrite(str(tmp_path / "in" / sub / "same.jpg"), (rng.random((40, 56, 3)) * 255).astype(np.uint8))
    listing = tmp_path / "list.txt"
    listing.write_text("in/a/same.jpg\nin/b/same.jpg\n")
    for source in (str(tmp_path / "in" / "[ab]" / "*.jpg"), str(listing)):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            save_dir = detect.run(nano_weights, source, imgsz=64, conf_thres=0.0, max_det=3, save_txt=True,
                                  save_crop=True, project=tmp_path / "runs")
        assert sorted(p.name for p in save_dir.glob("*.jpg")) == ["same.jpg", "same_2.jpg"]
        assert sorted(p.name for p in (save_dir / "labels").iterdir()) == ["same.txt", "same_2.txt"]
        crops = sorted(p.name for p in (save_dir / "crops").rglob("*.jpg"))
        assert len(crops) == 6 and len(set(crops)) == 6
        summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Results saved"))
        assert "2 label files" in summary and "6 crops" in summary and "with a suffix" in summary


def test_binary_txt_list_is_one_line_in_detect_and_in_training(nano_weights, tmp_path, capsys, monkeypatch):
    import detect
    from utils.data.labels import list_image_files

    binary = tmp_path / "list.txt"
    binary.write_bytes(bytes(range(256)) * 4)
    one_error(cli_in_process(detect.main, ["--weights", str(nano_weights), "--source", str(binary)], capsys, monkeypatch),
               "is not a text list of paths")
    with pytest.raises(UserError, match="is not a text list of paths"):
        list_image_files([binary])
    utf8 = tmp_path / "utf8.txt"
    utf8.write_bytes("\ufeff# comment\n  \nin/x.jpg\n".encode())
    from utils.files import read_path_list

    assert read_path_list(utf8) == [tmp_path / "in" / "x.jpg"]


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_source_that_is_no_regular_file_says_what_it_is(kind, nano_weights, tmp_path, capsys, monkeypatch):
    import detect
    from utils.data.labels import list_image_files

    if kind == "fifo":
        source = tmp_path / "pipe.txt"
        os.mkfifo(source)
        words = "is a FIFO"
    else:
        source = Path("/dev/zero")
        if not source.exists():
            pytest.skip("no /dev/zero here")
        words = "is a character device"
    one_error(cli_in_process(detect.main, ["--weights", str(nano_weights), "--source", str(source)], capsys, monkeypatch),
               words)
    with pytest.raises(UserError, match=words):
        list_image_files([source])
    with pytest.raises(UserError, match=words):
        ck.load_checkpoint(source)


# ----------------------------------------------------------------------------------------- the size an ensemble runs at


def _weights(path: Path, imgsz: int | None, cfg: str = "yolov5n.yaml") -> Path:
    model = Model(cfg, nc=3)
    ck.atomic_save(ck.make_checkpoint(model, model.yaml, ["a", "b", "c"], 0, imgsz=imgsz), path)
    return path


@pytest.mark.slow
def test_an_ensemble_runs_at_its_members_largest_training_size(tmp_path):
    """A member that records no size (a converted YOLOv5 checkpoint) counts as the default, 640: the COCO model
    of `--weights yolov5n.pt small.pt` is not run at the small one's 64 px."""
    from utils.inference import default_imgsz

    small, big = _weights(tmp_path / "small.pt", 64), _weights(tmp_path / "big.pt", 128)
    none = _weights(tmp_path / "v5.pt", None)
    cpu = torch.device("cpu")
    size, why = default_imgsz(None, load_for_inference([small, big], cpu), 640)
    assert size == 128 and why == ("the largest training size of the ensemble's members: small.pt 64, big.pt 128; "
                                   "--imgsz to change")
    size, why = default_imgsz(None, load_for_inference([none, small], cpu), 640)
    assert size == 640 and "v5.pt 640 (the default: it records none), small.pt 64" in why
    assert default_imgsz(320, load_for_inference([none, small], cpu), 640) == (320, "--imgsz")


@pytest.mark.slow
def test_detect_header_says_trained_at_for_a_checkpoint(tmp_path, caplog):
    import cv2

    import detect

    picture = tmp_path / "p.jpg"
    cv2.imwrite(str(picture), np.full((64, 80, 3), 90, np.uint8))
    with caplog.at_level(logging.INFO):
        detect.run(_weights(tmp_path / "small.pt", 64), picture, device="cpu", project=str(tmp_path / "d"))
        detect.run([str(tmp_path / "small.pt"), _weights(tmp_path / "v5.pt", None)], picture, device="cpu",
                   project=str(tmp_path / "d"))
    headers = _lines(caplog, "detect: ")
    assert "(the size small.pt was trained at; --imgsz to change)" in headers[0], headers
    assert " at 640x640 px (the largest training size of the ensemble's members" in headers[1], headers
    assert not any("exported" in h for h in headers)
