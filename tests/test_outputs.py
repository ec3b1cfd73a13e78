"""Where the commands' output goes and what happens when it cannot: a reader that closes stdout (`| head -1`) and a
full disk under --project / --output-dir / --out. Either ends the command with one line or none, never a
traceback, and every file already written is whole."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from helpers import cli_in_process, one_error

from utils.data.synthetic import CLASSES
from utils.engine.checkpoint import atomic_save, make_checkpoint
from utils.errors import PIPE_EXIT

REPO = Path(__file__).resolve().parents[1]
NAMES = list(CLASSES)  # the built-in dataset's classes, so test.py runs on the `micro` split
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """An untrained yolov5n checkpoint in the project's format, for the built-in dataset's classes."""
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=len(NAMES))
    path = tmp_path_factory.mktemp("weights") / "untrained.pt"
    atomic_save(make_checkpoint(model, model.yaml, NAMES, epoch=0), path)
    return path


def _pictures(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        cv2.imwrite(str(folder / f"{i:03d}.jpg"), rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    return folder


def _video(path: Path, n: int, size=(80, 60)) -> Path:
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, size)
    for i in range(n):
        w.write(np.full((size[1], size[0], 3), 5 * i % 256, np.uint8))
    w.release()
    return path


def _frames(path: Path) -> int:
    cap = cv2.VideoCapture(str(path))
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    return n


# ----------------------------------------------------------------------------------------- a reader that goes away


def _read_one_line_then_close(argv: list[str], tmp_path: Path) -> tuple[int, str]:
    """`python argv | head -1`: (exit status, stderr). stderr goes to a file, so a flood of it cannot block the
    command."""
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        p = subprocess.Popen([sys.executable, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=err, env=ENV)
        try:
            line = p.stdout.readline()
            p.stdout.close()
            rc = p.wait(timeout=300)
        finally:
            p.kill()
    assert line, err_path.read_text()[-2000:]
    return rc, err_path.read_text()


def _ended_quietly(rc: int, err: str) -> None:
    assert rc == PIPE_EXIT, (rc, err[-2000:])
    assert err == "", err[-2000:]


@pytest.mark.slow
def test_detect_into_a_closed_pipe_stops_quietly_and_keeps_whole_files(weights, tmp_path):
    src = _pictures(tmp_path / "src", 30)
    _video(src / "zclip.mp4", 20)
    rc, err = _read_one_line_then_close(["detect.py", "--weights", str(weights), "--source", str(src), "--imgsz", "64",
                                         "--project", str(tmp_path / "runs"), "--save-txt"], tmp_path)
    _ended_quietly(rc, err)
    out = tmp_path / "runs" / "exp"
    written = sorted(out.glob("*.jpg"))
    assert len(written) < 30, "the run stopped at the closed pipe instead of going on to the end"
    assert all(cv2.imread(str(p)) is not None for p in written)
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_detect_into_a_closed_pipe_closes_the_video_it_was_writing(weights, tmp_path):
    src = _video(tmp_path / "clip.mp4", 40)
    argv = ["detect.py", "--weights", str(weights), "--source", str(src), "--imgsz", "64", "--project",
            str(tmp_path / "runs")]
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        p = subprocess.Popen([sys.executable, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=err, env=ENV)
        try:
            while b"frame 3/" not in p.stdout.readline():  # a few frames are in the video
                pass
            p.stdout.close()
            rc = p.wait(timeout=300)
        finally:
            p.kill()
    _ended_quietly(rc, err_path.read_text())
    assert 3 <= _frames(tmp_path / "runs" / "exp" / "clip.mp4") < 40


@pytest.mark.slow
def test_test_py_into_a_closed_pipe_stops_quietly(micro, weights, tmp_path):
    rc, err = _read_one_line_then_close(["test.py", "--weights", str(weights), "--data", str(micro), "--imgsz", "64",
                                         "--workers", "0", "--project", str(tmp_path / "runs")], tmp_path)
    _ended_quietly(rc, err)


@pytest.mark.slow
def test_train_into_a_closed_pipe_stops_quietly_and_keeps_last_pt(micro, tmp_path):
    rc, err = _read_one_line_then_close(["train.py", "--data", str(micro), "--epochs", "1", "--imgsz", "64",
                                         "--batch-size", "8", "--workers", "0", "--noplots", "--project",
                                         str(tmp_path / "runs")], tmp_path)
    _ended_quietly(rc, err)
    for last in (tmp_path / "runs").glob("*/weights/last.pt"):
        torch.load(last, weights_only=True)  # whole: it loads


def test_coco2yolo_into_a_closed_pipe_stops_quietly(tmp_path):
    images = tmp_path / "pics"
    _pictures(images, 2)
    js = tmp_path / "ann.json"
    js.write_text(json.dumps({"images": [{"id": i, "file_name": f"{i:03d}.jpg", "width": 64, "height": 48}
                                         for i in range(2)], "annotations": [], "categories": [{"id": 1, "name": "a"}]}))
    rc, err = _read_one_line_then_close(["-m", "utils.data.coco2yolo", "--json", str(js), "--images", str(images),
                                         "--out", str(tmp_path / "out")], tmp_path)
    _ended_quietly(rc, err)



# ----------------------------------------------------------------------------------------- a full disk


@pytest.fixture
def full_disk(tmp_path):
    """A real 256 kB file system (tmpfs) filled to the last byte; skipped where mounting is not allowed (not root,
    no CAP_SYS_ADMIN). Filled by a file, so the test does not depend on what else is written there."""
    d = tmp_path / "disk"
    d.mkdir()
    if shutil.which("mount") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)  # short writes at the end, then ENOSPC
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _left(disk: Path) -> list[str]:
    """Files on the disk besides the filler (folders do not count: they hold no data)."""
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*") if p.is_file() and p.name != "filler")


@pytest.mark.parametrize("flags", [[], ["--save-txt", "--nosave"], ["--save-crop", "--nosave"]])
def test_detect_onto_a_full_disk_is_one_line_and_leaves_no_partial_file(weights, full_disk, tmp_path, flags, capsys,
                                                                       monkeypatch):
    import detect

    argv = ["--weights", str(weights), "--source", str(_pictures(tmp_path / "src", 3)), "--imgsz", "64",
            "--conf-thres", "0", "--max-det", "3", "--project", str(full_disk), *flags]
    code, lines = cli_in_process(detect.main, argv, capsys, monkeypatch)
    one_error((code, lines), "could not write", str(full_disk / "exp"), "free disk space")
    assert _left(full_disk) == []


def test_detect_video_onto_a_full_disk_is_one_line_and_leaves_no_broken_video(weights, full_disk, tmp_path, capsys,
                                                                              monkeypatch):
    import detect

    argv = ["--weights", str(weights), "--source", str(_video(tmp_path / "clip.mp4", 10)), "--imgsz", "64",
            "--project", str(full_disk)]
    code, lines = cli_in_process(detect.main, argv, capsys, monkeypatch)
    one_error((code, lines), "could not write", str(full_disk / "exp" / "clip.mp4"), "--project")
    assert _left(full_disk) == []


def test_test_py_save_json_onto_a_full_disk_is_one_line(micro, weights, full_disk, capsys, monkeypatch):
    import test as test_cli

    argv = ["--weights", str(weights), "--data", str(micro), "--imgsz", "64", "--workers", "0", "--no-plots",
            "--save-json", "--project", str(full_disk)]
    code, lines = cli_in_process(test_cli.main, argv, capsys, monkeypatch)
    one_error((code, lines), "could not write", "predictions.json", "free disk space")
    assert _left(full_disk) == []


def test_export_onto_a_full_disk_is_one_line(weights, full_disk, capsys, monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import export

    argv = ["--weights", str(weights), "--include", "torchscript", "--imgsz", "64", "--output-dir", str(full_disk)]
    code, lines = cli_in_process(export.main, argv, capsys, monkeypatch)
    one_error((code, lines), "could not write", str(full_disk / "untrained.torchscript"), "--output-dir")
    assert _left(full_disk) == [] and not list(full_disk.glob(".export-check-*"))


def test_an_image_write_that_fails_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """The same without a mount: the write inside utils.files.atomic_write fails as on a full disk."""
    from utils import files
    from utils.errors import UserError
    from utils.report.draw import write_image

    real = os.fdopen

    def full(fd, *args, **kwargs):
        f = real(fd, *args, **kwargs)
        f.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        return f

    monkeypatch.setattr(files.os, "fdopen", full)
    with pytest.raises(UserError, match="could not write .*a.png: No space left on device"):
        write_image(np.zeros((8, 8, 3), np.uint8), tmp_path / "a.png")
    assert list(tmp_path.iterdir()) == []
