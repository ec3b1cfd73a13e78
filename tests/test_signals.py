"""A stop signal while pictures are decoded in threads (the label scan, --cache ram) ends the command as Ctrl-C does:
exit status 130, one line, never an abort as the interpreter shuts down."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")


def _pictures(folder: Path, n: int) -> Path:
    """n small JPEGs under folder/images/train."""
    images = folder / "images" / "train"
    images.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        cv2.imwrite(str(images / f"{i}.jpg"), rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    return images


# every picture read in the stopped phase first spends a while inside OpenCV (a blur): when the stop
# arrives, from the reading of picture 4, the other thread is almost surely in there
STOPPED_WHILE_DECODING = """
import os, signal, sys
from pathlib import Path
import cv2, numpy as np
from utils.data import datasets, labels
from utils.errors import run_cli

def slow_and_stopping(read):
    def read_and_stop(path, **kw):
        cv2.GaussianBlur(np.zeros((1000, 1000, 3), np.uint8), (0, 0), 25)
        if str(path).endswith("/4.jpg"):
            os.kill(os.getpid(), signal.SIGTERM)
        return read(path, **kw)
    return read_and_stop

def main():
    files = labels.list_image_files([sys.argv[1]])
    if sys.argv[2] == "scan":
        labels.load_image_file = slow_and_stopping(labels.load_image_file)
    labels.verify_dataset(files, labels.img2label_paths(files), None, Path(sys.argv[1]).parent / "x.cache.npz")
    datasets.load_image_file = slow_and_stopping(datasets.load_image_file)
    datasets.YoloDataset([sys.argv[1]], imgsz=64, cache="ram")
run_cli(main)
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: the pictures are read in one thread")
@pytest.mark.parametrize("where", ["scan", "cache"])
def test_a_stop_while_threads_decode_ends_with_130(tmp_path, where):
    """A stop in the label scan, or in --cache ram's decoding. Before: the interpreter shut down while the pool's
    daemon threads were still inside OpenCV, which ended them by unwinding through C++ ('terminate called without
    an active exception' or 'FATAL: exception not rethrown'), SIGABRT, exit 134."""
    images = _pictures(tmp_path, 48)
    p = subprocess.run([sys.executable, "-c", STOPPED_WHILE_DECODING, str(images), where], cwd=REPO,
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert p.returncode == 130, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert [ln for ln in p.stderr.splitlines() if ln.strip()] == ["interrupted"], p.stderr[-2000:]


def _stop_during_scan(data: Path, project: Path, sig: int, delay: float) -> subprocess.CompletedProcess:
    """train.py on `data` in a process group of its own; `sig` to the group `delay` s after its precision line
    (the label scan follows it)."""
    cmd = [sys.executable, "train.py", "--data", str(data), "--project", str(project), "--epochs", "1", "--imgsz",
           "64", "--batch-size", "4", "--workers", "0", "--noplots", "--amp", "off"]
    p = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    for line in p.stdout:
        if line.startswith("precision:"):
            time.sleep(delay)
            os.killpg(p.pid, sig)
            break
    out, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


@pytest.mark.parametrize("sig, delay", [(signal.SIGTERM, 0.2), (signal.SIGINT, 0.3)])
def test_a_stop_during_the_label_scan_of_coco128(coco128_dir, tmp_path, sig, delay):
    """The report's case: the 128 pictures' label cache deleted, the group stopped during the scan."""
    data = tmp_path / "coco128"
    shutil.copytree(coco128_dir, data)
    for d in (data, *(d for d in data.rglob("*") if d.is_dir())):  # the shared copy is read-only
        d.chmod(0o755)
    for f in data.rglob("*.cache.npz"):
        f.unlink()
    p = _stop_during_scan(data / "coco128.yaml", tmp_path / "runs", sig, delay)
    assert p.returncode == 130, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted"), p.stderr[-2000:]
