"""Pictures and label files that are odd or hostile: a decompression bomb is refused from its header, any decoder
error or a cut-short JPEG leaves the picture out with one warning, a label file with a BOM is read and one that is
a folder or a FIFO is left out, and extreme shapes (1 x 4000 to 8000 x 8000) are handled or refused by name."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import detect
from utils.data.datasets import create_dataloader
from utils.engine.checkpoint import atomic_save, make_checkpoint
from utils.errors import UserError


# ----------------------------------------------------------------------------------------- image bombs, odd images and labels

def _png_header_only(w: int, h: int) -> bytes:
    """A PNG that declares w x h pixels: a valid IHDR, one tiny IDAT, IEND. Never decoded here."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def _split(root: Path, n: int = 3) -> list[Path]:
    rng = np.random.default_rng(0)
    (root / "images" / "train").mkdir(parents=True, exist_ok=True)
    (root / "labels" / "train").mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(n):
        im = cv2.GaussianBlur((rng.random((48, 64, 3)) * 255).astype(np.uint8), (5, 5), 2)
        f = root / "images" / "train" / f"im{k}.jpg"
        cv2.imwrite(str(f), im)
        (root / "labels" / "train" / f"im{k}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
        out.append(f)
    return out


def _verify(root: Path, caplog) -> tuple[list[str], list[str]]:
    """(kept image names, warning lines) of verifying root/images/train."""
    import logging

    from utils.data.datasets import create_dataloader

    caplog.clear()
    with caplog.at_level(logging.INFO):
        _, ds = create_dataloader(root / "images" / "train", 64, 2, 32, workers=0, nc=2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    return sorted(Path(f).name for f in ds.im_files), warnings


def test_decompression_bomb_is_left_out_from_its_header_without_decoding(tmp_path, caplog, monkeypatch):
    from utils.data import datasets

    _split(tmp_path)
    bomb = tmp_path / "images" / "train" / "bomb.png"
    bomb.write_bytes(_png_header_only(30000, 30000))  # 900 MP declared in 100 bytes
    real, decoded = cv2.imdecode, []

    def watch(buf, flags):
        decoded.append(len(buf))
        return real(buf, flags)

    monkeypatch.setattr(datasets.cv2, "imdecode", watch)
    kept, warnings = _verify(tmp_path, caplog)
    assert kept == ["im0.jpg", "im1.jpg", "im2.jpg"]
    lines = [w for w in warnings if "bomb.png" in w]
    assert len(lines) == 1 and "30000x30000" in lines[0] and "AMPYOLO_MAX_PIXELS" in lines[0] and "left out" in lines[0]
    assert len(bomb.read_bytes()) not in decoded  # refused before any decoder saw it


def test_pixel_limit_is_configurable(tmp_path, caplog, monkeypatch):
    from utils.data.images import load_image_file

    f = _split(tmp_path, n=1)[0]
    monkeypatch.setenv("AMPYOLO_MAX_PIXELS", "1000")  # the 64x48 images are 3072 px
    with pytest.raises(ValueError, match="64x48 pixels is over the 1,000-pixel limit"):
        load_image_file(f)
    monkeypatch.setenv("AMPYOLO_MAX_PIXELS", "lots")
    with pytest.raises(UserError, match="AMPYOLO_MAX_PIXELS"):
        load_image_file(f)
    monkeypatch.delenv("AMPYOLO_MAX_PIXELS")
    assert load_image_file(f).shape == (48, 64, 3)


def test_any_decoder_error_leaves_the_image_out(tmp_path, caplog, monkeypatch):
    from utils.data import datasets

    _split(tmp_path)
    real = cv2.imdecode

    def oom(buf, flags):
        if len(buf) == len((tmp_path / "images" / "train" / "im1.jpg").read_bytes()):
            raise cv2.error("OpenCV(5.0.0) alloc.cpp:73: error: (-4:Insufficient memory) Failed to allocate 5.8 GB")
        return real(buf, flags)

    monkeypatch.setattr(datasets.cv2, "imdecode", oom)
    kept, warnings = _verify(tmp_path, caplog)
    assert kept == ["im0.jpg", "im2.jpg"]
    assert any("im1.jpg" in w and "Insufficient memory" in w and "left out" in w for w in warnings)


def test_jpeg_cut_short_with_an_end_marker_is_left_out_but_a_grey_picture_is_kept(tmp_path, caplog):
    files = _split(tmp_path)
    data = files[1].read_bytes()
    files[1].write_bytes(data[: len(data) // 2] + b"\xff\xd9")  # cut mid-scan, end marker appended
    grey = tmp_path / "images" / "train" / "grey.jpg"
    cv2.imwrite(str(grey), np.full((48, 64, 3), 128, np.uint8))  # really grey: decodes to 128 everywhere
    (tmp_path / "labels" / "train" / "grey.txt").write_text("")
    kept, warnings = _verify(tmp_path, caplog)
    assert kept == ["grey.jpg", "im0.jpg", "im2.jpg"]
    assert any("im1.jpg" in w and "truncated JPEG" in w for w in warnings)


def test_label_file_with_a_bom_keeps_its_image(tmp_path, caplog):
    _split(tmp_path)
    (tmp_path / "labels" / "train" / "im0.txt").write_bytes("\ufeff0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n".encode())
    kept, warnings = _verify(tmp_path, caplog)
    assert kept == ["im0.jpg", "im1.jpg", "im2.jpg"] and not warnings


def test_label_path_that_is_a_folder_or_fifo_leaves_the_image_out(tmp_path, caplog):
    _split(tmp_path)
    labels = tmp_path / "labels" / "train"
    (labels / "im0.txt").unlink()
    (labels / "im0.txt").mkdir()
    (labels / "im2.txt").unlink()
    os.mkfifo(labels / "im2.txt")  # opening it would block forever
    kept, warnings = _verify(tmp_path, caplog)
    assert kept == ["im1.jpg"]
    assert any("im0.txt" in w and "a folder" in w and "left out" in w for w in warnings)
    assert any("im2.txt" in w and "FIFO" in w and "left out" in w for w in warnings)


# ----------------------------------------------------------------------------------------- extreme shapes
# (one CPU thread from here on; module-scoped, so every test below does too)

EXTREME = {"strip_h.jpg": (1, 4000), "strip_v.jpg": (4000, 1), "dot.png": (1, 1), "huge.jpg": (8000, 8000),
           "thin_h.jpg": (10, 4000), "thin_v.jpg": (4000, 10)}


@pytest.fixture(scope="module")
def extreme_images(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("extreme")
    (d / "images" / "train").mkdir(parents=True)
    (d / "labels" / "train").mkdir(parents=True)
    for name, (h, w) in EXTREME.items():
        im = np.full((h, w, 3), 90, np.uint8)
        im[h // 4 : max(3 * h // 4, h // 4 + 1), w // 4 : max(3 * w // 4, w // 4 + 1)] = 200
        assert cv2.imwrite(str(d / "images" / "train" / name), im)
        (d / "labels" / "train" / f"{Path(name).stem}.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    return d / "images" / "train"


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_extreme_shapes_through_the_dataset_loader(extreme_images, caplog):
    caplog.set_level(logging.WARNING)
    loader, ds = create_dataloader(extreme_images, 64, 2, 32, rect=True, pad=0.5, workers=0)
    for name in ("strip_h.jpg", "strip_v.jpg", "dot.png"):  # refused: one warning line each, naming the file
        assert sum(name in r.getMessage() and "too small" in r.getMessage() for r in caplog.records) == 1
    assert sorted(Path(f).name for f in ds.im_files) == ["huge.jpg", "thin_h.jpg", "thin_v.jpg"]
    seen = 0
    for imgs, targets, paths, shapes in loader:  # validation path: rectangular batches, one decode each
        assert imgs.shape[2] % 32 == 0 and imgs.shape[3] % 32 == 0 and max(imgs.shape[2:]) <= 64 + 32
        seen += len(paths)
    assert seen == 3
    thin = [str(extreme_images / "thin_h.jpg"), str(extreme_images / "thin_v.jpg")]
    mosaic, _ = create_dataloader(thin, 64, 2, 32, augment=True, workers=0)  # training path: mosaic and affine
    for imgs, targets, _, _ in mosaic:
        assert imgs.shape[1:] == (3, 64, 64) and torch.isfinite(targets).all()


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_extreme_shapes_through_detect(extreme_images, tmp_path):
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=1)
    weights = tmp_path / "w.pt"
    atomic_save(make_checkpoint(model, model.yaml, ["thing"], 0), weights)
    for batch in (1, 3):
        save_dir = detect.run(weights, extreme_images, imgsz=64, conf_thres=0.0, max_det=5, save_txt=True,
                              project=tmp_path / "runs", batch_size=batch)
        labels = sorted(p.name for p in (save_dir / "labels").iterdir())
        assert labels == sorted(f"{Path(n).stem}.txt" for n in EXTREME)
        for f in (save_dir / "labels").iterdir():
            rows = np.loadtxt(f, ndmin=2)
            assert ((rows[:, 1:5] >= 0) & (rows[:, 1:5] <= 1 + 1e-6)).all(), f.name


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_checkpoint_with_nan_weights_is_refused_instead_of_detecting_nothing(extreme_images, tmp_path):
    from models.yolo import Model

    model = Model("yolov5n.yaml", nc=1)
    with torch.no_grad():
        for p in model.model[-1].parameters():
            p.fill_(float("nan"))  # a diverged run's head
    weights = tmp_path / "nan.pt"
    atomic_save(make_checkpoint(model, model.yaml, ["thing"], 0), weights)
    with pytest.raises(UserError, match="not finite"):  # it used to run and find nothing, without a word
        detect.run(weights, extreme_images / "thin_h.jpg", imgsz=64, conf_thres=0.0, save_txt=True,
                   project=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------------------- a text file named .jpg


@pytest.mark.usefixtures("one_thread")
def test_a_text_file_named_jpg_is_not_called_a_truncated_jpeg(tmp_path):
    from utils.data.labels import _check_image

    fake = tmp_path / "fake.jpg"
    fake.write_text("hello\n")
    with pytest.raises(ValueError) as e:
        _check_image(str(fake))
    assert "truncated" not in str(e.value) and "not a decodable image" in str(e.value)
