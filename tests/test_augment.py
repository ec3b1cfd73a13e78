"""Letterbox math, and geometric augmentation keeping every box on its object."""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.boxes import xywhn2xyxy, xyxy2xywhn
from utils.data.augment import augment_hsv, box_candidates, letterbox, mosaic4, random_flips, random_perspective
from utils.hyp import load_hyp
from utils.data.datasets import YoloDataset

COLOURS = ((0, 0, 255), (0, 255, 0), (255, 0, 0), (0, 255, 255))  # one per class, far from the grey pad


def iou(a, b) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def pixel_box(im: np.ndarray, colour, near=None) -> tuple | None:
    """Box around the pixels close to `colour` (edges blur under interpolation: a loose tolerance).

    With `near` (a box), only the blobs of that colour touching it count: mosaic may show the same
    picture twice, so one colour can appear in two places.
    """
    mask = (np.abs(im.astype(int) - np.array(colour)).max(2) < 60).astype(np.uint8)
    if near is not None:
        _, blobs = cv2.connectedComponents(mask)
        x1, y1, x2, y2 = (int(v) for v in np.round(near))
        touching = np.unique(blobs[max(y1, 0):y2 + 1, max(x1, 0):x2 + 1])
        mask = np.isin(blobs, touching[touching > 0])
    if mask.sum() < 20:
        return None
    ys, xs = np.nonzero(mask)
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1


def rect_image(w: int, h: int, box, colour) -> tuple[np.ndarray, np.ndarray]:
    """Grey image with one solid rectangle; returns it and its (1, 5) cls + xywhn label."""
    im = np.full((h, w, 3), 90, np.uint8)
    x1, y1, x2, y2 = box
    im[y1:y2, x1:x2] = colour
    label = np.array([[COLOURS.index(colour), (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h]],
                     np.float32)
    return im, label


def assert_boxes_on_objects(im: np.ndarray, labels: np.ndarray, min_iou: float = 0.8) -> int:
    """Every cls + xyxy label covers the pixels of its colour; returns how many were checked."""
    for cls, *box in labels:
        seen = pixel_box(im, COLOURS[int(cls)], near=box)
        assert seen is not None, f"label {box} has no object pixels"
        assert iou(box, seen) >= min_iou, (box, seen)
    return len(labels)


# ---------------------------------------------------------------------------------------------
# letterbox


def test_letterbox_pads_to_square_centred():
    im = np.zeros((480, 640, 3), np.uint8)
    out, (rx, ry), (padw, padh) = letterbox(im, 640, auto=False)
    assert out.shape == (640, 640, 3) and (rx, ry) == (1.0, 1.0) and (padw, padh) == (0.0, 80.0)
    assert (out[:80] == 114).all() and (out[80:560] == 0).all() and (out[560:] == 114).all()


def test_letterbox_auto_pads_only_to_stride():
    im = np.zeros((479, 640, 3), np.uint8)
    out, _, (padw, padh) = letterbox(im, 640, auto=True, stride=32)
    assert out.shape == (480, 640, 3) and (padw, padh) == (0.0, 0.0)  # 1 px pad goes to the bottom


def test_letterbox_downscale_ratio_and_odd_pad():
    im = np.zeros((50, 100, 3), np.uint8)
    out, (rx, ry), (padw, padh) = letterbox(im, (64, 64), auto=False)
    assert out.shape == (64, 64, 3) and rx == ry == 0.64 and (padw, padh) == (0.0, 16.0)
    out, (rx, ry), (padw, padh) = letterbox(np.zeros((33, 100, 3), np.uint8), 100, auto=False)
    assert out.shape == (100, 100, 3) and padh == 33.0  # 67 rows of padding: 33 top, 34 bottom
    # a point maps back exactly with the returned ratio and pad
    x, y = 50.0, 10.0
    assert ((x * rx + padw - padw) / rx, (y * ry + padh - padh) / ry) == (x, y)


def test_letterbox_no_scaleup_and_tuple_shape():
    im = np.zeros((100, 200, 3), np.uint8)
    out, (rx, ry), (padw, padh) = letterbox(im, (320, 480), auto=False, scaleup=False)
    assert out.shape == (320, 480, 3) and rx == ry == 1.0 and (padw, padh) == (140.0, 110.0)
    out, (rx, _), _ = letterbox(im, (320, 480), auto=False, scaleup=True)
    assert rx == 2.4 and out.shape == (320, 480, 3)


# ---------------------------------------------------------------------------------------------
# geometric transforms


def test_box_conversions_round_trip():
    x = np.array([[0.5, 0.5, 0.2, 0.4], [0.1, 0.9, 0.2, 0.2]], np.float32)
    xyxy = xywhn2xyxy(x, 100, 50, padw=3, padh=4)
    np.testing.assert_allclose(xyxy[0], [43, 19, 63, 39])
    np.testing.assert_allclose(xyxy2xywhn(xyxy - [3, 4, 3, 4], 100, 50, clip=True), x, atol=1e-6)


def test_box_candidates_filters():
    before = np.array([[0, 0, 10, 10]] * 4, float)
    after = np.array([[0, 0, 10, 10], [0, 0, 1.5, 10], [0, 0, 3, 3], [0, 0, 100, 0.5]], float)
    assert box_candidates(before, after).tolist() == [True, False, False, False]
    before = np.array([[0, 0, 1000, 4]], float)
    assert not box_candidates(before, np.array([[0, 0, 1000, 4]], float)).any()  # aspect 250


@pytest.mark.parametrize("seed", range(6))
def test_random_perspective_keeps_box_on_object(seed):
    rng = np.random.default_rng(seed)
    colour = COLOURS[seed % 4]
    im, label = rect_image(160, 120, (40, 30, 100, 80), colour)
    labels = np.concatenate([label[:, :1], xywhn2xyxy(label[:, 1:], 160, 120)], 1)
    out, new = random_perspective(im, labels, rng, degrees=10, translate=0.1, scale=0.4, shear=5,
                                  perspective=0.0005)
    assert out.shape == im.shape and len(new) == 1
    assert_boxes_on_objects(out, new)


def test_mosaic_keeps_boxes_on_objects():
    checked = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        ims, labs = [], []
        for k, colour in enumerate(COLOURS):  # each tile has one rectangle in a different colour
            w, h = (64, 48) if k % 2 else (48, 64)
            im, lab = rect_image(w, h, (8 + k, 10, 30 + k, 40), colour)
            ims.append(im)
            labs.append(lab)
        canvas, labels = mosaic4(ims, labs, 64, rng)
        assert canvas.shape == (128, 128, 3)
        out, new = random_perspective(canvas, labels, rng, translate=0.1, scale=0.5, border=(-32, -32))
        assert out.shape == (64, 64, 3)
        checked += assert_boxes_on_objects(out, new)
    assert checked >= 8  # most boxes survive the crop


def test_flips_and_hsv():
    im, label = rect_image(80, 40, (0, 0, 20, 10), COLOURS[0])
    out, lab = random_flips(im, label, np.random.default_rng(0), flipud=1.0, fliplr=1.0)
    box = xywhn2xyxy(lab[:, 1:], 80, 40)[0]
    assert tuple(box) == (60, 30, 80, 40) and pixel_box(out, COLOURS[0]) == (60, 30, 80, 40)
    same = augment_hsv(im, np.random.default_rng(0), 0, 0, 0)
    assert np.array_equal(same, im)
    jit = augment_hsv(im, np.random.default_rng(0), 0.015, 0.7, 0.4)
    assert jit.shape == im.shape and jit.dtype == np.uint8 and not np.array_equal(jit, im)


def test_training_samples_keep_boxes_on_objects(tmp_path: Path):
    """The whole training pipeline (mosaic, affine, flips) on files: labels still match pixels."""
    for i in range(6):
        w, h = (96, 64) if i % 2 else (64, 96)
        colour = COLOURS[i % 4]
        im, lab = rect_image(w, h, (10 + i, 12, 40 + i, 50), colour)
        (tmp_path / "images").mkdir(exist_ok=True)
        (tmp_path / "labels").mkdir(exist_ok=True)
        cv2.imwrite(str(tmp_path / "images" / f"{i}.png"), im)
        (tmp_path / "labels" / f"{i}.txt").write_text(" ".join(f"{v:.6f}" for v in lab[0]) + "\n")
    hyp = load_hyp().updated(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, degrees=5.0, flipud=0.5)
    data = YoloDataset([tmp_path / "images"], imgsz=64, hyp=hyp, augment=True, seed=1)
    checked = 0
    for epoch in range(3):
        for i in range(len(data)):
            im, targets, _, shapes = data[(i, epoch)]
            bgr = np.ascontiguousarray(im.numpy().transpose(1, 2, 0)[:, :, ::-1])
            lab = targets[:, 1:].numpy()
            xyxy = np.concatenate([lab[:, :1], xywhn2xyxy(lab[:, 1:], 64, 64)], 1)
            checked += assert_boxes_on_objects(bgr, xyxy, min_iou=0.75)
    assert checked >= 18
