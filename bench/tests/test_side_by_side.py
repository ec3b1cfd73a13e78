"""The clocks the peer comparisons read: YOLOv5's TensorBoard stamps (parsed without TensorBoard) and epoch lengths."""
from __future__ import annotations

import statistics
import struct

import numpy as np
import pytest

from bench.curves import event_stamps, first_reaching
from bench.train_vs_yolov5 import median_epoch


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
