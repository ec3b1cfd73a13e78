"""bench/side_by_side.py without the peers: the clocks it reads (YOLOv5's TensorBoard stamps, parsed without
TensorBoard, and epoch lengths), the curves from run folders, our loaders' side at its smallest setting, and the
one-line refusal where the peers' venv is missing."""
from __future__ import annotations

import os
import statistics
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.side_by_side import event_stamps, first_reaching, main, median_epoch
from utils.data.data_config import SHARED_COCO128

REPO = Path(__file__).resolve().parents[2]


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _event(wall: float, step: int, payload: bytes = b"") -> bytes:
    """One TFRecord: an Event message with wall_time (field 1, double), step (2, varint), a summary (5, bytes)."""
    msg = b"\x09" + struct.pack("<d", wall) + b"\x10" + _varint(step)
    if payload:
        msg += b"\x2a" + _varint(len(payload)) + payload
    return struct.pack("<Q", len(msg)) + b"\0" * 4 + msg + b"\0" * 4  # CRCs are not checked


def test_event_stamps_keep_the_latest_wall_time_per_step(tmp_path):
    f = tmp_path / "events.out.tfevents.1"
    records = [_event(1000.0, 0)]  # the file-version record
    for step, wall in ((0, 1010.5), (0, 1010.75), (1, 1020.0), (300, 1030.25)):
        records.append(_event(wall, step, payload=b"x" * 200))  # a long summary: multi-byte length varint
    f.write_bytes(b"".join(records))
    assert event_stamps(f) == {0: 1010.75, 1: 1020.0, 300: 1030.25}


def test_median_epoch_leaves_out_the_first_and_last_epochs():
    ends = [30.0, 40.0, 51.0, 60.0, 100.0]  # start-up in epoch 0, final validation in epoch 4
    assert median_epoch(ends) == 10.0
    with pytest.raises(statistics.StatisticsError):  # no epoch between the first and the last
        median_epoch([1.0, 2.0])


def test_first_reaching():
    t, m = np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.5, 0.4])
    assert first_reaching(t, m, 0.45) == 2.0
    assert np.isnan(first_reaching(t, m, 0.6))


def test_curves_from_the_three_tools_run_folders(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "ours.csv").write_text("epoch,time,metrics/mAP_0.5,metrics/mAP_0.5:0.95\n0,10,0.2,0.1\n1,20,0.6,0.4\n")
    (tmp_path / "ul").mkdir()
    (tmp_path / "ul" / "results.csv").write_text("epoch,time,metrics/mAP50(B),metrics/mAP50-95(B)\n1,15,0.3,0.2\n"
                                                 "2,40,0.5,0.3\n")
    y5 = tmp_path / "y5"
    y5.mkdir()
    (y5 / "results.csv").write_text("epoch,  metrics/mAP_0.5,  metrics/mAP_0.5:0.95\n0, 0.1, 0.05\n1, 0.2, 0.1\n")
    (y5 / "events.out.tfevents.1").write_bytes(_event(100.0, 0, b"x") + _event(130.0, 1, b"x"))
    main(["curves", "--ours", str(tmp_path / "ours.csv"), "--yolov5", str(y5), "--ultralytics", str(tmp_path / "ul"),
          "--out", str(tmp_path / "c.png")])
    rows = {ln.split()[0]: ln.split() for ln in capsys.readouterr().out.splitlines()[1:4]}
    assert (tmp_path / "c.png").stat().st_size > 0
    assert rows["ours"][1:3] == ["2", "20.0"] and rows["ours"][-1] == "20.0"  # 90% of the best final, 0.36, at 20 s
    assert rows["YOLOv5"][2:4] == ["2", "60.0"]  # 30 s epochs: the first one's length is the mean
    assert rows["Ultralytics"][-1] == "nan"  # never reached 0.36


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "detect"])
def test_without_the_peers_venv_it_refuses_in_one_line(mode, tmp_path):
    r = subprocess.run([sys.executable, "bench/side_by_side.py", mode], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PEER_VENV": str(tmp_path / "none")}, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "peers.sh" in r.stderr, r


@pytest.mark.slow
def test_our_loaders_at_the_smallest_setting(tmp_path):
    if not (SHARED_COCO128 / "images").is_dir():
        pytest.skip("COCO128 not found")
    r = subprocess.run([sys.executable, "bench/side_by_side.py", "loader", "--loaders", "ours", "ours-device",
                        "--caches", "off", "--rounds", "1", "--batches", "1", "--warmup", "0", "--workdir",
                        str(tmp_path), "--out", str(tmp_path / "t.txt")], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {ln[:14].strip(): ln[14:].split() for ln in (tmp_path / "t.txt").read_text().splitlines()[5:]}
    assert set(rows) == {"ours, host", "ours, device"} and float(rows["ours, host"][1]) > 0
    assert float(rows["ours, device"][3]) > 0  # the device's CPU seconds a batch
