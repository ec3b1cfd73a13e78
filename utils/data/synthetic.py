"""The built-in dataset: coloured geometric shapes on textured backgrounds, generated on first use.

Nothing downloads, so `python train.py` works on a fresh machine. Images are drawn from a fixed
seed, one generator per image, so the same files (byte for byte, with the same OpenCV) come out
every time. Classes differ by outline, not colour: a shape's colour is random, so the detector
must learn the shape. Objects are 22-110 px on ~256 px images, large enough for a nano model to
learn in a few minutes of CPU training.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import cv2
import numpy as np

from utils.errors import UserError
from utils.files import cache_dir

LOGGER = logging.getLogger(__name__)

CLASSES = ("circle", "square", "triangle", "star", "cross")
GENERATOR_VERSION = "shapes-v3"  # bump when drawing changes, so cached copies are regenerated
SEED = 20240601
SIDES = (224, 256, 288, 320)  # image widths/heights; varied so rectangular batching is exercised
SUB = 16  # fillPoly sub-pixel factor (shift=4): boxes and drawn pixels agree to 1/16 px
MAX_OVERLAP = 0.2  # share of the smaller box another may cover: a little overlap, never hidden


def ensure_shapes_dataset(root: Path | None = None, n_train: int = 400, n_val: int = 100) -> Path:
    """The dataset folder (default cache_dir()/shapes), generated first if missing or outdated.

    Generation writes into a temporary sibling folder and renames it into place, so an interrupted
    run never leaves half a dataset, and concurrent processes (DDP ranks) agree on one copy.
    """
    root = Path(root) if root is not None else cache_dir() / "shapes"
    stamp = f"{GENERATOR_VERSION} seed={SEED} train={n_train} val={n_val}"
    old = _read_stamp(root)
    if old == stamp:
        return root
    if root.is_dir() and any(root.iterdir()) and not (old is not None and _only_our_layout(root)):
        # only a copy this generator made (a VERSION stamp beside images/ and labels/) is ever replaced and deleted
        raise UserError(f"{root} exists and is not a generated shapes dataset; move it away or set "
                        f"AMPYOLO_HOME to another folder")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    LOGGER.info(f"generating the built-in shapes dataset ({n_train} train + {n_val} val images) in {root}")
    try:
        generate_shapes(tmp, n_train, n_val)
        (tmp / "VERSION").write_text(stamp + "\n")
        _move_into_place(tmp, root, stamp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    LOGGER.info(f"shapes dataset ready in {time.perf_counter() - t0:.1f}s")
    return root


def tiny_shapes(folder: Path, n_train: int = 24, n_val: int = 8) -> Path:
    """A small copy of the built-in dataset in `folder` and its data YAML (tests, the kill campaign)."""
    root = ensure_shapes_dataset(Path(folder) / "shapes", n_train=n_train, n_val=n_val)
    yaml_path = Path(folder) / "tiny.yaml"
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(CLASSES))
    yaml_path.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return yaml_path


def _read_stamp(root: Path) -> str | None:
    try:
        return (root / "VERSION").read_text().strip()
    except OSError:
        return None


def _only_our_layout(root: Path) -> bool:
    return {p.name for p in root.iterdir()} <= {"VERSION", "images", "labels"}


def _move_into_place(tmp: Path, root: Path, stamp: str) -> None:
    """Rename tmp -> root; an outdated root is moved aside first; a concurrent winner is kept."""
    if root.exists() and _read_stamp(root) != stamp:
        old = root.parent / f".{root.name}.old-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(root, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(tmp, root)
    except OSError:
        if _read_stamp(root) != stamp:  # not someone else's finished copy: a real failure
            raise


def generate_shapes(dest: Path, n_train: int = 400, n_val: int = 100, seed: int = SEED) -> None:
    """Write images/{train,val}/*.jpg and labels/{train,val}/*.txt under dest."""
    for split, n, split_id in (("train", n_train, 0), ("val", n_val, 1)):
        im_dir, lb_dir = dest / "images" / split, dest / "labels" / split
        im_dir.mkdir(parents=True, exist_ok=True)
        lb_dir.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            im, labels, _ = render_image(np.random.default_rng([seed, split_id, i]))
            name = f"{split}_{i:05d}"
            if not cv2.imwrite(str(im_dir / f"{name}.jpg"), im, [cv2.IMWRITE_JPEG_QUALITY, 92]):
                raise OSError(f"cannot write {im_dir / name}.jpg")
            rows = [f"{int(c)} {x:.6f} {y:.6f} {w:.6f} {h:.6f}" for c, x, y, w, h in labels]
            (lb_dir / f"{name}.txt").write_text("\n".join(rows) + ("\n" if rows else ""))


def sample_images(dest: Path, n: int = 4) -> list[Path]:
    """Copy the first n validation pictures into dest (detect.py's default source)."""
    src = sorted((ensure_shapes_dataset() / "images" / "val").glob("*.jpg"))[:n]
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for f in src:
        shutil.copyfile(f, dest / f.name)
        out.append(dest / f.name)
    return out


# ---------------------------------------------------------------------------------------------
# drawing


def render_image(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """One picture: (BGR image, (n, 5) labels cls cx cy w h normalised, per-object masks).

    Masks show where each object's pixels were drawn (before later objects covered any), so tests
    can check that the label boxes match the drawing.
    """
    w, h = (int(v) for v in rng.choice(SIDES, size=2))
    im = _background(rng, w, h)
    boxes, labels, masks = [], [], []
    for _ in range(int(rng.integers(1, 7))):
        cls = int(rng.integers(len(CLASSES)))
        pts = _place(rng, cls, w, h, boxes)
        if pts is None:
            continue
        mask = np.zeros((h, w), np.uint8)
        _draw(mask, cls, pts, 255)
        _draw(im, cls, pts, _object_colour(rng))
        x1, y1 = pts.min(0)
        x2, y2 = pts.max(0)
        boxes.append((x1, y1, x2, y2))
        labels.append((cls, (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h))
        masks.append(mask)
    return im, np.array(labels, dtype=np.float64).reshape(-1, 5), masks


def _background(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """Muted texture (noise, gradient or stripes) so objects must be found, yet stand out."""
    kind = int(rng.integers(3))
    c1, c2 = rng.uniform(50, 190, size=(2, 3))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    if kind == 0:  # blotchy noise: low-res noise blown up
        small = rng.uniform(-1, 1, size=(max(h // 16, 2), max(w // 16, 2), 1)).astype(np.float32)
        t = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)[..., None] * 0.5 + 0.5
    elif kind == 1:  # linear gradient in a random direction
        a = rng.uniform(0, np.pi)
        proj = xx * np.cos(a) + yy * np.sin(a)
        t = ((proj - proj.min()) / (np.ptp(proj) + 1e-6))[..., None]
    else:  # sinusoidal stripes
        a, period = rng.uniform(0, np.pi), rng.uniform(8, 40)
        t = (np.sin((xx * np.cos(a) + yy * np.sin(a)) * 2 * np.pi / period) * 0.5 + 0.5)[..., None]
    im = c1 * (1 - t) + c2 * t + rng.normal(0, 8, size=(h, w, 1))
    return np.clip(im, 0, 255).astype(np.uint8)


def _object_colour(rng: np.random.Generator) -> tuple[int, int, int]:
    """Saturated random colour (any hue): colour says nothing about the class."""
    hsv = np.array([[[rng.integers(180), rng.integers(170, 256), rng.integers(170, 256)]]], np.uint8)
    return tuple(int(v) for v in cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0])


def _outline(cls: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-size outline (radius ~1, centred at 0) of a class, randomly rotated and stretched."""
    name = CLASSES[cls]
    if name == "circle":
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        pts = np.stack([np.cos(t), np.sin(t)], 1)
    elif name == "square":
        pts = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], float) * 0.8
    elif name == "triangle":
        t = np.pi / 2 + np.arange(3) * 2 * np.pi / 3
        pts = np.stack([np.cos(t), -np.sin(t)], 1)
    elif name == "star":
        t = -np.pi / 2 + np.arange(10) * np.pi / 5
        r = np.where(np.arange(10) % 2 == 0, 1.0, 0.42)
        pts = np.stack([np.cos(t) * r, np.sin(t) * r], 1)
    else:  # cross (plus sign), arms 0.36 wide
        a, b = 0.36, 1.0
        pts = np.array([[-a, -b], [a, -b], [a, -a], [b, -a], [b, a], [a, a], [a, b], [-a, b], [-a, a],
                        [-b, a], [-b, -a], [-a, -a]], float)
    stretch = np.array([1.0, rng.uniform(0.8, 1.2)])
    angle = rng.uniform(-np.pi, np.pi) if name in ("circle", "star") else rng.uniform(-0.4, 0.4)
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return (pts * stretch) @ rot.T


def _place(rng: np.random.Generator, cls: int, w: int, h: int, boxes: list) -> np.ndarray | None:
    """Outline points in pixels, fully inside the image and overlapping earlier boxes only a little."""
    for _ in range(20):
        size = rng.uniform(22, 110)
        pts = _outline(cls, rng)
        pts = pts / np.ptp(pts, axis=0).max() * size  # longest box side = size
        lo, hi = pts.min(0), pts.max(0)
        if (hi - lo)[0] >= w - 2 or (hi - lo)[1] >= h - 2:
            continue
        centre = rng.uniform(1 - lo, np.array([w, h]) - 1 - hi)
        pts = np.round((pts + centre) * SUB) / SUB  # exactly the points fillPoly will draw
        box = (*pts.min(0), *pts.max(0))
        if all(_overlap(box, b) < MAX_OVERLAP for b in boxes):
            return pts
    return None


def _overlap(a: tuple, b: tuple) -> float:
    """Intersection over the smaller box: near 1 when one box would hide inside the other."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return iw * ih / smaller if smaller > 0 else 0.0


def _draw(im: np.ndarray, cls: int, pts: np.ndarray, colour: int | tuple[int, int, int]) -> None:
    """Fill the outline. Labels treat pixel i as [i, i+1) while OpenCV puts pixel i's centre at i,
    hence the half-pixel shift; no anti-aliasing, so exactly the pixels whose centres are inside."""
    poly = [np.round((pts - 0.5) * SUB).astype(np.int32)]
    cv2.fillPoly(im, poly, colour, lineType=cv2.LINE_8, shift=4)
