"""Image augmentation for detection: letterbox, mosaic, random perspective, HSV, flips, mixup.

Every random choice is drawn from a `numpy.random.Generator` passed in by the caller. The loader
seeds that generator from (seed, epoch, sample index), so a sample looks the same whichever worker
process builds it; nothing here touches global random state.

Box conventions: `xyxy` is pixel corners (x1, y1, x2, y2); `xywhn` is centre/size normalised to
the image. Labels passed around are (n, 5) float32 arrays: class then four box numbers.
"""
from __future__ import annotations

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


def mosaic4(
    images: list[np.ndarray], labels: list[np.ndarray], size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Tile four images around a random centre on a (2*size, 2*size) canvas.

    `labels[i]` is (n, 5) cls + xywhn for `images[i]`. Returns the canvas and (m, 5) cls + pixel
    xyxy labels on it (clipped). The caller crops the canvas back to `size` with random_perspective.
    """
    s = size
    xc, yc = (int(v) for v in rng.uniform(0.5 * s, 1.5 * s, size=2))
    canvas = np.full((2 * s, 2 * s, images[0].shape[2]), PAD_VALUE, dtype=np.uint8)
    out = []
    for k, (im, lab) in enumerate(zip(images, labels)):
        h, w = im.shape[:2]
        # corner of this tile touching the centre: k=0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right
        x1a, x2a = (max(xc - w, 0), xc) if k in (0, 2) else (xc, min(xc + w, 2 * s))
        y1a, y2a = (max(yc - h, 0), yc) if k in (0, 1) else (yc, min(yc + h, 2 * s))
        # the matching crop of the source: anchored on the side that touches the centre
        x1b = w - (x2a - x1a) if k in (0, 2) else 0
        y1b = h - (y2a - y1a) if k in (0, 1) else 0
        canvas[y1a:y2a, x1a:x2a] = im[y1b : y1b + (y2a - y1a), x1b : x1b + (x2a - x1a)]
        if len(lab):
            boxes = xywhn2xyxy(lab[:, 1:], w, h, x1a - x1b, y1a - y1b)
            out.append(np.concatenate([lab[:, :1], boxes], axis=1))
    lab = np.concatenate(out, 0) if out else np.zeros((0, 5), np.float32)
    np.clip(lab[:, 1:], 0, 2 * s, out=lab[:, 1:])
    return canvas, lab.astype(np.float32)


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
    oh, ow = h_in + 2 * border[0], w_in + 2 * border[1]
    m, s = _perspective_matrix(rng, (w_in, h_in), (ow, oh), degrees, translate, scale, shear, perspective)
    projective = perspective > 0
    if border != (0, 0) or not np.allclose(m, np.eye(3)):
        fill = (PAD_VALUE, PAD_VALUE, PAD_VALUE)
        if projective:
            im = cv2.warpPerspective(im, m, dsize=(ow, oh), borderValue=fill)
        else:
            im = cv2.warpAffine(im, m[:2], dsize=(ow, oh), borderValue=fill)
    if len(labels):
        new = _transform_boxes(labels[:, 1:5], m, projective)
        new[:, [0, 2]] = new[:, [0, 2]].clip(0, ow)
        new[:, [1, 3]] = new[:, [1, 3]].clip(0, oh)
        keep = box_candidates(labels[:, 1:5] * s, new)
        labels = np.concatenate([labels[keep, :1], new[keep]], axis=1).astype(np.float32)
    return im, labels


# ---------------------------------------------------------------------------------------------
# colour and flips


def augment_hsv(im: np.ndarray, rng: np.random.Generator, hgain: float = 0.5, sgain: float = 0.5,
                vgain: float = 0.5) -> np.ndarray:
    """Random hue/saturation/value gains applied through lookup tables (fast, BGR uint8 in/out)."""
    gains = rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1
    if not (hgain or sgain or vgain):
        return im
    x = np.arange(256, dtype=np.float32)
    luts = (((x * gains[0]) % 180).astype(np.uint8),  # OpenCV hue is 0..179 and wraps around
            np.clip(x * gains[1], 0, 255).astype(np.uint8),
            np.clip(x * gains[2], 0, 255).astype(np.uint8))
    hsv = cv2.cvtColor(im, cv2.COLOR_BGR2HSV)
    # the tables run on planes: OpenCV's one-channel LUT is vectorised, its three-channel one is not (2x slower);
    # splitting into arrays we allocate is 3x faster than letting cv2.split allocate them
    planes = np.empty((3, *hsv.shape[:2]), np.uint8)
    cv2.split(hsv, mv=list(planes))
    for plane, lut in zip(planes, luts):
        cv2.LUT(plane, lut, dst=plane)
    cv2.merge(list(planes), dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR, dst=hsv)  # in place: each pixel is converted on its own


def random_flips(im: np.ndarray, labels: np.ndarray, rng: np.random.Generator, flipud: float = 0.0,
                 fliplr: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Up-down then left-right flip with the given probabilities; labels are cls + xywhn."""
    do_ud, do_lr = rng.random(2) < (flipud, fliplr)
    labels = labels.copy()
    if do_ud:
        labels[:, 2] = 1 - labels[:, 2]
    if do_lr:
        labels[:, 1] = 1 - labels[:, 1]
    if not (do_ud or do_lr):
        return im, labels
    # cv2.flip writes the flipped copy with SIMD row moves: 0.1 ms at 640x640, where copying numpy's
    # reversed-stride view (np.fliplr + ascontiguousarray) takes 1.5 ms
    return cv2.flip(im, -1 if do_ud and do_lr else int(do_lr)), labels


def mixup(im1: np.ndarray, labels1: np.ndarray, im2: np.ndarray, labels2: np.ndarray,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Blend two same-size images with a Beta(32, 32) ratio (close to 0.5) and keep both label sets."""
    r = rng.beta(32.0, 32.0)
    im = (im1.astype(np.float32) * r + im2.astype(np.float32) * (1 - r)).round().astype(np.uint8)
    return im, np.concatenate([labels1, labels2], 0)

