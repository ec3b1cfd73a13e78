"""Batch previews: files written, geometry, boxes at the right pixels in the class colour, empty batches."""
from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest
import torch

from utils.report.draw import colors
from utils.report.previews import (MAX_MOSAIC, MIN_TILE, PreviewThread, grid_geometry, plot_dataset_labels,
                                   plot_train_batch, plot_val_batch)

NAMES = ["circle", "square"]


def _black(n=4, size=192):
    return torch.zeros(n, 3, size, size, dtype=torch.uint8)


def _colourful(im: np.ndarray) -> bool:
    """Any saturated pixel (a box or a label tab)? Borders, file names and black images are grey."""
    return int((im.max(2).astype(int) - im.min(2)).max()) > 80


def _near(px, bgr, tol=60):
    return int(np.abs(px.astype(int) - np.array(bgr)).max()) <= tol


def test_geometry_small_scaled_up_large_scaled_down():
    assert grid_geometry(4, 192, 192) == (2, pytest.approx(MIN_TILE / 192))
    cols, scale = grid_geometry(16, 640, 640)
    assert cols == 4 and cols * 640 * scale == pytest.approx(MAX_MOSAIC)
    assert grid_geometry(1, 1000, 800) == (1, 1.0)
    assert grid_geometry(1, 3000, 3000) == (1, pytest.approx(MAX_MOSAIC / 3000))


def test_train_batch_box_edges_in_class_colour(tmp_path):
    imgs = _black()
    # image 1: class 1, box centred, half the image: 48..144 px at 192, 80..240 px on its 320 px tile
    targets = torch.tensor([[1, 1, 0.5, 0.5, 0.5, 0.5]])
    out = plot_train_batch(imgs, targets, [f"im{i}.jpg" for i in range(4)], NAMES, tmp_path / "train_batch0.jpg")
    im = cv2.imread(str(out))
    assert im.shape == (640, 640, 3)
    ox = 320  # image 1 is the second tile of the first row
    c = colors(1, bgr=True)
    assert _near(im[160, ox + 80], c), "left edge"
    assert _near(im[160, ox + 240], c), "right edge"
    assert _near(im[240, ox + 160], c), "bottom edge"
    assert _near(im[160, ox + 160], (0, 0, 0)), "inside stays clear"
    assert _near(im[160, 80], (0, 0, 0)) and _near(im[160, 160], (0, 0, 0)), "image 0 has no box"


def test_float_batch_same_picture(tmp_path):
    targets = torch.tensor([[0, 0, 0.3, 0.4, 0.2, 0.2]])
    imgs = torch.randint(0, 255, (2, 3, 96, 96), dtype=torch.uint8)
    a = cv2.imread(str(plot_train_batch(imgs, targets, None, NAMES, tmp_path / "a.jpg")))
    b = cv2.imread(str(plot_train_batch(imgs.float() / 255, targets, None, NAMES, tmp_path / "b.jpg")))
    assert a.shape == b.shape and np.abs(a.astype(int) - b.astype(int)).mean() < 2


def test_empty_targets_and_single_image(tmp_path):
    out = plot_train_batch(_black(1), torch.zeros(0, 6), ["x.jpg"], NAMES, tmp_path / "e.jpg")
    im = cv2.imread(str(out))
    assert im.shape == (320, 320, 3)
    assert not _colourful(im), "nothing drawn but the file name"


def test_at_most_16_images_and_size_capped(tmp_path):
    imgs = torch.zeros(20, 3, 640, 640, dtype=torch.uint8)
    targets = torch.tensor([[19, 0, 0.5, 0.5, 0.2, 0.2]])  # on an image beyond the 16 drawn: ignored
    im = cv2.imread(str(plot_train_batch(imgs, targets, None, NAMES, tmp_path / "big.jpg")))
    assert im.shape == (MAX_MOSAIC, MAX_MOSAIC, 3)
    assert not _colourful(im)


def test_val_batch_labels_and_preds(tmp_path):
    imgs = _black(1)
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.5, 0.5]])
    preds = [torch.tensor([[20.0, 20.0, 60.0, 60.0, 0.9, 1.0],     # drawn, class 1
                           [100.0, 100.0, 180.0, 180.0, 0.1, 0.0]])]  # below conf 0.25: not drawn
    lab, pred = plot_val_batch(imgs, targets, preds, NAMES, tmp_path / "val_batch0_labels.jpg",
                               tmp_path / "val_batch0_pred.jpg", paths=["v.jpg"])
    L, P = cv2.imread(str(lab)), cv2.imread(str(pred))
    s = MIN_TILE / 192
    assert _near(L[160, 80], colors(0, bgr=True)), "ground truth left edge"
    assert _near(P[int(40 * s), int(20 * s)], colors(1, bgr=True)), "prediction left edge"
    assert _near(P[int(140 * s), int(100 * s)], (0, 0, 0)), "low-confidence box not drawn"
    assert _near(P[160, 80], (0, 0, 0)), "ground truth not in the prediction picture"


def test_val_batch_no_predictions(tmp_path):
    lab, pred = plot_val_batch(_black(2), torch.zeros(0, 6), [torch.zeros(0, 6), torch.zeros(0, 6)], NAMES,
                               tmp_path / "l.jpg", tmp_path / "p.jpg")
    assert not _colourful(cv2.imread(str(pred))) and cv2.imread(str(lab)).shape == (320, 640, 3)


def test_dataset_labels_picture(tmp_path):
    labels = [np.array([[0, 0.5, 0.5, 0.2, 0.3]]), np.zeros((0, 5)), np.array([[1, 0.2, 0.7, 0.1, 0.1]] * 3)]
    out = plot_dataset_labels(labels, NAMES, tmp_path)
    assert out.name == "labels.jpg" and out.stat().st_size > 10_000


def test_preview_thread_writes_and_reports_failures(tmp_path, caplog):
    t = PreviewThread()
    imgs = _black(2)
    t.submit(plot_train_batch, imgs, torch.zeros(0, 6), None, NAMES, tmp_path / "t.jpg")
    imgs.fill_(255)  # the loop may reuse its tensor: the preview drew the copy taken at submit
    t.submit(plot_train_batch, torch.zeros(3, 5), torch.zeros(0, 6), None, NAMES, tmp_path / "bad.jpg")
    with caplog.at_level(logging.WARNING):
        t.close()
    assert cv2.imread(str(tmp_path / "t.jpg"))[100:200, 100:200].max() < 40, "drawn from the copy"
    assert not (tmp_path / "bad.jpg").exists()
    assert any("plot_train_batch failed" in r.getMessage() for r in caplog.records)
