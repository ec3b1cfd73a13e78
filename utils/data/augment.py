"""Image augmentation for detection: letterbox, mosaic, random perspective, HSV, flips, mixup.

Every random choice is drawn from a `numpy.random.Generator` passed in by the caller. The loader
seeds that generator from (seed, epoch, sample index), so a sample looks the same whichever worker
process builds it; nothing here touches global random state.

Box conventions: `xyxy` is pixel corners (x1, y1, x2, y2); `xywhn` is centre/size normalised to
the image. Labels passed around are (n, 5) float32 arrays: class then four box numbers.
"""
from __future__ import annotations

from typing import NamedTuple

import cv2
import numpy as np

from utils.boxes import xywhn2xyxy

PAD_VALUE = 114  # grey used for letterbox and mosaic borders; neutral for both dark and bright images


# ---------------------------------------------------------------------------------------------
# letterbox


def letterbox(
    im: np.ndarray,
    new_shape: int | tuple[int, int] = 640,
    color: tuple[int, int, int] = (PAD_VALUE, PAD_VALUE, PAD_VALUE),
    auto: bool = True,
    scaleup: bool = True,
    stride: int = 32,
) -> tuple[np.ndarray, tuple[float, float], tuple[float, float]]:
    """Resize keeping the aspect ratio, then pad to `new_shape` (h, w).

    auto=True pads only up to the next multiple of `stride` (minimum rectangle for inference);
    scaleup=False never enlarges (enlarging blurs and does not help validation mAP).
    Returns (image, (rx, ry) resize ratios, (left, top) padding in pixels). The padding returned is
    the one actually applied, so `x0 = (x - left) / rx` maps a box back exactly.
    """
    h0, w0 = im.shape[:2]
    new_h, new_w = (new_shape, new_shape) if isinstance(new_shape, int) else new_shape
    r = min(new_h / h0, new_w / w0)
    if not scaleup:
        r = min(r, 1.0)
    w1, h1 = max(int(round(w0 * r)), 1), max(int(round(h0 * r)), 1)  # a 1x4000 strip keeps one pixel row
    dw, dh = new_w - w1, new_h - h1
    if auto:
        dw, dh = dw % stride, dh % stride
    if (w1, h1) != (w0, h0):
        im = cv2.resize(im, (w1, h1), interpolation=cv2.INTER_LINEAR)
    left, top = dw // 2, dh // 2
    im = cv2.copyMakeBorder(im, top, dh - top, left, dw - left, cv2.BORDER_CONSTANT, value=color)
    return im, (w1 / w0, h1 / h0), (float(left), float(top))


# ---------------------------------------------------------------------------------------------
# mosaic


class Tile(NamedTuple):
    """Where one mosaic image goes: its rectangle on the canvas (x1, y1, x2, y2), the top-left corner of
    the matching crop of the image, and the quarter of the canvas it sits in (x1, y1, x2, y2)."""

    dst: tuple[int, int, int, int]
    src: tuple[int, int]
    quarter: tuple[int, int, int, int]


def _mosaic_layout(shapes: list[tuple[int, ...]], size: int, rng: np.random.Generator) -> list[Tile]:
    """Draw the mosaic centre and place the four images (h, w, ...) around it on the (2*size)^2 canvas."""
    n = 2 * size
    xc, yc = (int(v) for v in rng.uniform(0.5 * size, 1.5 * size, size=2))
    tiles = []
    for k, (h, w) in enumerate(shape[:2] for shape in shapes):
        # corner of this tile touching the centre: k=0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right
        left, top = k in (0, 2), k in (0, 1)
        x1a, x2a = (max(xc - w, 0), xc) if left else (xc, min(xc + w, n))
        y1a, y2a = (max(yc - h, 0), yc) if top else (yc, min(yc + h, n))
        # the matching crop of the source: anchored on the side that touches the centre
        x1b = w - (x2a - x1a) if left else 0
        y1b = h - (y2a - y1a) if top else 0
        quarter = (0 if left else xc, 0 if top else yc, xc if left else n, yc if top else n)
        tiles.append(Tile((x1a, y1a, x2a, y2a), (x1b, y1b), quarter))
    return tiles


def _mosaic_labels(labels: list[np.ndarray], tiles: list[Tile], shapes: list[tuple[int, ...]],
                   size: int) -> np.ndarray:
    """(m, 5) cls + pixel xyxy labels of the tiled images on the canvas, clipped to it."""
    out = []
    for lab, tile, (h, w) in zip(labels, tiles, (shape[:2] for shape in shapes)):
        if len(lab):
            boxes = xywhn2xyxy(lab[:, 1:], w, h, tile.dst[0] - tile.src[0], tile.dst[1] - tile.src[1])
            out.append(np.concatenate([lab[:, :1], boxes], axis=1))
    lab = np.concatenate(out, 0) if out else np.zeros((0, 5), np.float32)
    np.clip(lab[:, 1:], 0, 2 * size, out=lab[:, 1:])
    return lab.astype(np.float32)


def paint_mosaic(images: list[np.ndarray], tiles: list[Tile], size: int,
                  region: tuple[int, int, int, int] | None = None, canvas: np.ndarray | None = None) -> np.ndarray:
    """The (2*size)^2 canvas: each image's crop on its rectangle, grey around it in its quarter.

    Each pixel is written once (filling the whole canvas grey first costs 0.2 ms at 640). With `region`
    (x1, y1, x2, y2) only the pixels inside it are written; the others keep whatever `canvas` (default:
    new, uninitialised memory) held, so a caller passes a region that holds every pixel it reads.
    """
    n = 2 * size
    rx1, ry1, rx2, ry2 = region if region is not None else (0, 0, n, n)
    if canvas is None:
        canvas = np.empty((n, n, images[0].shape[2]), dtype=np.uint8)

    def inside(x1: int, y1: int, x2: int, y2: int) -> tuple[int, int, int, int] | None:
        x1, y1, x2, y2 = max(x1, rx1), max(y1, ry1), min(x2, rx2), min(y2, ry2)
        return (x1, y1, x2, y2) if x1 < x2 and y1 < y2 else None

    for im, tile in zip(images, tiles):
        (ax1, ay1, ax2, ay2), (bx, by), (qx1, qy1, qx2, qy2) = tile
        if r := inside(ax1, ay1, ax2, ay2):
            x1, y1, x2, y2 = r
            sx, sy = bx + x1 - ax1, by + y1 - ay1
            canvas[y1:y2, x1:x2] = im[sy : sy + y2 - y1, sx : sx + x2 - x1]
        for strip in ((qx1, qy1, qx2, ay1), (qx1, ay2, qx2, qy2), (qx1, ay1, ax1, ay2), (ax2, ay1, qx2, ay2)):
            if r := inside(*strip):  # above, below, left and right of the tile within its quarter
                x1, y1, x2, y2 = r
                canvas[y1:y2, x1:x2] = PAD_VALUE
    return canvas


def mosaic4(
    images: list[np.ndarray], labels: list[np.ndarray], size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Tile four images around a random centre on a (2*size, 2*size) canvas.

    `labels[i]` is (n, 5) cls + xywhn for `images[i]`. Returns the canvas and (m, 5) cls + pixel
    xyxy labels on it (clipped). The caller crops the canvas back to `size` with random_perspective
    (random_mosaic does both at once, faster).
    """
    shapes = [im.shape for im in images]
    tiles = _mosaic_layout(shapes, size, rng)
    return paint_mosaic(images, tiles, size), _mosaic_labels(labels, tiles, shapes, size)


class MosaicPlan(NamedTuple):
    """A mosaic before any pixel is painted: where the four images go, their labels on the (2*size)^2 canvas
    (cls + pixel xyxy), the warp (canvas -> output) with its scale draw, and the part of the canvas it reads
    (x1, y1, x2, y2)."""

    tiles: list[Tile]
    labels: np.ndarray
    matrix: np.ndarray
    scale: float
    region: tuple[int, int, int, int]


def plan_mosaic(
    shapes: list[tuple[int, ...]], labels: list[np.ndarray], size: int, rng: np.random.Generator,
    degrees: float = 0.0, translate: float = 0.1, scale: float = 0.5, shear: float = 0.0, perspective: float = 0.0,
) -> MosaicPlan:
    """random_mosaic's draws and geometry without its pixels: the loader's device mode (--augment-on device)
    paints `region` and the training device warps it (utils/data/device_augment.py), from the same draws."""
    n, border = 2 * size, -(size // 2)
    out_wh = (n + 2 * border, n + 2 * border)
    tiles = _mosaic_layout(shapes, size, rng)
    labels = _mosaic_labels(labels, tiles, shapes, size)
    m, s, region = plan_warp(rng, (n, n), out_wh, degrees, translate, scale, shear, perspective)
    return MosaicPlan(tiles, labels, m, s, region)


def plan_warp(
    rng: np.random.Generator, in_wh: tuple[int, int], out_wh: tuple[int, int],
    degrees: float = 0.0, translate: float = 0.1, scale: float = 0.5, shear: float = 0.0, perspective: float = 0.0,
) -> tuple[np.ndarray, float, tuple[int, int, int, int]]:
    """random_perspective's draws for the device path: (3x3 matrix, scale, the rectangle of the in_wh source the
    warp reads: all of it under a perspective warp)."""
    m, s = _perspective_matrix(rng, in_wh, out_wh, degrees, translate, scale, shear, perspective)
    region = None if perspective > 0 else _affine_read_region(m, out_wh, in_wh)
    return m, s, region or (0, 0, *in_wh)


def random_mosaic(
    images: list[np.ndarray], labels: list[np.ndarray], size: int, rng: np.random.Generator,
    degrees: float = 0.0, translate: float = 0.1, scale: float = 0.5, shear: float = 0.0, perspective: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """mosaic4 then random_perspective cropping the canvas back to size (border -(size // 2)): the same
    draws, pixels and labels, but only the part of the canvas that the warp reads is painted (on average
    a third of it at scale 0.5), which saves most of the canvas's cost.

    Returns the image and (m, 5) cls + pixel xyxy labels, as random_perspective does.
    """
    n, border = 2 * size, -(size // 2)
    out_wh = (n + 2 * border, n + 2 * border)
    plan = plan_mosaic([im.shape for im in images], labels, size, rng, degrees, translate, scale, shear, perspective)
    projective = perspective > 0
    canvas = paint_mosaic(images, plan.tiles, size, None if projective else plan.region)
    return _warp(canvas, plan.matrix, out_wh, projective), _warp_labels(plan.labels, plan.matrix, plan.scale, out_wh,
                                                                        projective)


# ---------------------------------------------------------------------------------------------
# random perspective / affine


def _perspective_matrix(
    rng: np.random.Generator, in_wh: tuple[int, int], out_wh: tuple[int, int],
    degrees: float, translate: float, scale: float, shear: float, perspective: float,
) -> tuple[np.ndarray, float]:
    """Compose centre -> perspective -> rotate/scale -> shear -> translate; returns (3x3, scale).

    Draws are made in a fixed order whatever the values, so changing one hyperparameter does not
    reshuffle the others.
    """
    (w, h), (ow, oh) = in_wh, out_wh
    centre = np.eye(3)
    centre[0, 2], centre[1, 2] = -w / 2, -h / 2
    persp = np.eye(3)
    persp[2, 0], persp[2, 1] = rng.uniform(-perspective, perspective, size=2)
    angle = rng.uniform(-degrees, degrees)
    s = rng.uniform(1 - scale, 1 + scale)
    rot = np.eye(3)
    rot[:2] = cv2.getRotationMatrix2D(center=(0, 0), angle=angle, scale=s)
    sh = np.eye(3)
    sh[0, 1], sh[1, 0] = np.tan(np.deg2rad(rng.uniform(-shear, shear, size=2)))
    move = np.eye(3)
    move[0, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * ow
    move[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * oh
    return move @ sh @ rot @ persp @ centre, s


def box_candidates(
    before: np.ndarray, after: np.ndarray, wh_thr: float = 2, ar_thr: float = 100, area_thr: float = 0.1,
    eps: float = 1e-16,
) -> np.ndarray:
    """Boolean mask of boxes worth keeping after a transform (xyxy arrays, `before` pre-scaled).

    Drops slivers (< wh_thr px), boxes that kept less than area_thr of their area (mostly cropped
    away) and extreme aspect ratios (> ar_thr), which are label noise rather than objects.
    """
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def _transform_boxes(boxes: np.ndarray, m: np.ndarray, projective: bool) -> np.ndarray:
    """Map xyxy boxes through a 3x3 matrix; the result is the box around the four moved corners."""
    n = len(boxes)
    corners = np.ones((n * 4, 3))
    corners[:, :2] = boxes[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n * 4, 2)  # tl, br, bl, tr
    moved = corners @ m.T
    xy = moved[:, :2] / moved[:, 2:3] if projective else moved[:, :2]
    xy = xy.reshape(n, 8)
    x, y = xy[:, 0::2], xy[:, 1::2]
    return np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], axis=1)


def _affine_read_region(m: np.ndarray, out_wh: tuple[int, int], n: int | tuple[int, int], margin: int = 2
                        ) -> tuple[int, int, int, int] | None:
    """The rectangle (x1, y1, x2, y2) of an n x n (or n = (w, h)) source that cv2.warpAffine(m, out_wh) reads,
    or None (read it all) when m cannot be inverted.

    Bilinear sampling reads the 2x2 pixels at floor(x), floor(y) of each output pixel's source point;
    an affine map sends the output's corner pixels to the extremes of those points. OpenCV computes the
    points in fixed or single-precision float, off by far less than a pixel: `margin` pixels cover it.
    """
    try:
        inv = np.linalg.inv(m)
    except np.linalg.LinAlgError:
        return None
    ow, oh = out_wh
    corners = np.array([[0, 0, 1], [ow - 1, 0, 1], [0, oh - 1, 1], [ow - 1, oh - 1, 1]], dtype=np.float64) @ inv.T
    if not np.isfinite(corners).all() or np.abs(corners[:, :2]).max() > 1e9:
        return None
    lo = np.floor(corners[:, :2].min(0)).astype(np.int64) - margin
    hi = np.floor(corners[:, :2].max(0)).astype(np.int64) + 2 + margin
    wh = np.array((n, n) if isinstance(n, int) else n)
    x1, y1 = (int(v) for v in np.clip(lo, 0, wh))
    x2, y2 = (int(v) for v in np.clip(hi, 0, wh))
    return x1, y1, x2, y2


def _warp(im: np.ndarray, m: np.ndarray, out_wh: tuple[int, int], projective: bool) -> np.ndarray:
    fill = (PAD_VALUE, PAD_VALUE, PAD_VALUE)
    if projective:
        return cv2.warpPerspective(im, m, dsize=out_wh, borderValue=fill)
    return cv2.warpAffine(im, m[:2], dsize=out_wh, borderValue=fill)


def _warp_labels(labels: np.ndarray, m: np.ndarray, s: float, out_wh: tuple[int, int], projective: bool
                 ) -> np.ndarray:
    """(n, 5) cls + xyxy labels through m, clipped to the output and filtered with box_candidates."""
    if not len(labels):
        return labels
    ow, oh = out_wh
    new = _transform_boxes(labels[:, 1:5], m, projective)
    new[:, [0, 2]] = new[:, [0, 2]].clip(0, ow)
    new[:, [1, 3]] = new[:, [1, 3]].clip(0, oh)
    keep = box_candidates(labels[:, 1:5] * s, new)
    return np.concatenate([labels[keep, :1], new[keep]], axis=1).astype(np.float32)


def warp_labels_batched(labels: np.ndarray, layer: np.ndarray, mats: np.ndarray, scales: np.ndarray,
                        out_wh: tuple[int, int], projective: bool) -> tuple[np.ndarray, np.ndarray]:
    """_warp_labels for the boxes of many pictures at once: box i goes through mats[layer[i]] with scale
    scales[layer[i]], the same float64 arithmetic and the same rules (clip, box_candidates). Returns the kept
    (m, 5) cls + xyxy labels (float32) and the picture index of each."""
    if not len(labels):
        return np.zeros((0, 5), np.float32), np.zeros(0, np.int64)
    ow, oh = out_wh
    n, boxes = len(labels), labels[:, 1:5]
    corners = np.ones((n, 4, 3))
    corners[:, :, :2] = boxes[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n, 4, 2)  # tl, br, bl, tr
    moved = corners @ mats[layer].transpose(0, 2, 1)
    xy = moved[..., :2] / moved[..., 2:3] if projective else moved[..., :2]
    x, y = xy[..., 0], xy[..., 1]
    new = np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], axis=1)
    new[:, [0, 2]] = new[:, [0, 2]].clip(0, ow)
    new[:, [1, 3]] = new[:, [1, 3]].clip(0, oh)
    # labels (float32) times a Python float stays float32 on the host path: the same here
    keep = box_candidates(boxes * scales[layer].astype(np.float32)[:, None], new)
    return np.concatenate([labels[keep, :1], new[keep]], axis=1).astype(np.float32), layer[keep]


def random_perspective(
    im: np.ndarray, labels: np.ndarray, rng: np.random.Generator, degrees: float = 0.0,
    translate: float = 0.1, scale: float = 0.5, shear: float = 0.0, perspective: float = 0.0,
    border: tuple[int, int] = (0, 0),
) -> tuple[np.ndarray, np.ndarray]:
    """Random rotation/scale/shear/translation/perspective of an image and its (n, 5) cls+xyxy labels.

    `border` (bh, bw) grows (positive) or crops (negative) the output; mosaic uses -size/2 to
    cut its 2x canvas back to size. Boxes are clipped and filtered with box_candidates.
    """
    h_in, w_in = im.shape[:2]
    out_wh = (w_in + 2 * border[1], h_in + 2 * border[0])
    m, s = _perspective_matrix(rng, (w_in, h_in), out_wh, degrees, translate, scale, shear, perspective)
    projective = perspective > 0
    if border != (0, 0) or not np.allclose(m, np.eye(3)):
        im = _warp(im, m, out_wh, projective)
    return im, _warp_labels(labels, m, s, out_wh, projective)


# ---------------------------------------------------------------------------------------------
# colour and flips


def hsv_gains(rng: np.random.Generator, hgain: float = 0.5, sgain: float = 0.5, vgain: float = 0.5) -> np.ndarray:
    """augment_hsv's draw: the (3,) hue, saturation and value gains."""
    return rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1


def hsv_luts(gains: np.ndarray) -> np.ndarray:
    """(..., 3) gains -> (..., 3, 256) uint8 lookup tables for the H (0..179, wrapping), S and V channels. The
    tables are computed in float64 (float32 values times float64 gains), as augment_hsv always did."""
    x = np.arange(256, dtype=np.float32)
    g = gains[..., None]
    return np.stack([((x * g[..., 0, :]) % 180).astype(np.uint8),  # OpenCV hue is 0..179 and wraps around
                     np.clip(x * g[..., 1, :], 0, 255).astype(np.uint8),
                     np.clip(x * g[..., 2, :], 0, 255).astype(np.uint8)], axis=-2)


def augment_hsv(im: np.ndarray, rng: np.random.Generator, hgain: float = 0.5, sgain: float = 0.5,
                vgain: float = 0.5) -> np.ndarray:
    """Random hue/saturation/value gains applied through lookup tables (fast, BGR uint8 in/out)."""
    gains = hsv_gains(rng, hgain, sgain, vgain)
    if not (hgain or sgain or vgain):
        return im
    luts = hsv_luts(gains)
    hsv = cv2.cvtColor(im, cv2.COLOR_BGR2HSV)
    # one three-channel table applied in place: in the loader this beats split, three LUTs and merge (1.5 vs
    # 2.0 ms per 640x640 image), though each of those alone is faster on a warm cache
    cv2.LUT(hsv, np.ascontiguousarray(luts.T).reshape(256, 1, 3), dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR, dst=hsv)  # in place: each pixel is converted on its own


def flip_draws(rng: np.random.Generator, flipud: float = 0.0, fliplr: float = 0.5) -> tuple[bool, bool]:
    """random_flips' draw: (up-down, left-right)."""
    do_ud, do_lr = rng.random(2) < (flipud, fliplr)
    return bool(do_ud), bool(do_lr)


def random_flips(im: np.ndarray, labels: np.ndarray, rng: np.random.Generator, flipud: float = 0.0,
                 fliplr: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Up-down then left-right flip with the given probabilities; labels are cls + xywhn."""
    do_ud, do_lr = flip_draws(rng, flipud, fliplr)
    labels = labels.copy()
    if do_ud:
        labels[:, 2] = 1 - labels[:, 2]
    if do_lr:
        labels[:, 1] = 1 - labels[:, 1]
    if not (do_ud or do_lr):
        return np.ascontiguousarray(im), labels  # no copy of a contiguous image
    # cv2.flip writes the flipped copy with SIMD row moves: 0.1 ms at 640x640, where copying numpy's
    # reversed-stride view (np.fliplr + ascontiguousarray) takes 1.5 ms
    return cv2.flip(im, -1 if do_ud and do_lr else int(do_lr)), labels


def mixup_ratio(rng: np.random.Generator) -> float:
    """mixup's draw: the first image's weight."""
    return float(rng.beta(32.0, 32.0))


def mixup(im1: np.ndarray, labels1: np.ndarray, im2: np.ndarray, labels2: np.ndarray,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Blend two same-size images with a Beta(32, 32) ratio (close to 0.5) and keep both label sets."""
    r = mixup_ratio(rng)
    im = (im1.astype(np.float32) * r + im2.astype(np.float32) * (1 - r)).round().astype(np.uint8)
    return im, np.concatenate([labels1, labels2], 0)

