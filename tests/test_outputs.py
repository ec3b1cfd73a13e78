"""Where the commands' output goes and what happens when it cannot: a reader that closes stdout (`| head -1`) and a
full disk under --project / --output-dir / --out. Either ends the command with one line or none, never a
traceback, and every file already written is whole."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

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


def test_test_py_into_a_closed_pipe_stops_quietly(micro, weights, tmp_path):
    rc, err = _read_one_line_then_close(["test.py", "--weights", str(weights), "--data", str(micro), "--imgsz", "64",
                                         "--workers", "0", "--project", str(tmp_path / "runs")], tmp_path)
    _ended_quietly(rc, err)


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

