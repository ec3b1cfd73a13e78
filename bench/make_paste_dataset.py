"""A real-image detection dataset built from COCO128: objects cut out by their labels and pasted at
several scales onto backgrounds of shuffled COCO128 tiles.

    python bench/make_paste_dataset.py [--coco ../shared/datasets/coco128] [--out bench/out/paste8]
    python bench/make_paste_dataset.py --classes 10 --background noise --scale 0.10 0.30 --objects 1 6 \
        --train 600 --val 150 --out bench/out/paste10n     # the kind of data the robust-training issue used

The robust-training harness (bench/fidelity.py) needs real photographs that nobody tuned on. COCO128 itself is too
small to learn from on a short schedule (71 classes, 929 boxes), so this takes the 8 classes with the most large
boxes, cuts every box of those classes that is at least MIN_SIDE px on its shorter side, and pastes 1 to 5 of them
per image, each scaled so that its longer side is 12% to 50% of the image. Instances are split between train and val
(every fourth crop of a class goes to val), so val objects were never seen in training. Backgrounds are COCO128
photos cut into 32 px tiles and shuffled: real texture and colour, no whole unlabelled objects.

`--background noise` swaps the tiles for noisy colour fields (blurred random colour blocks plus Gaussian pixel
noise), `--classes 10` adds the next two classes by the same count (carrot, cup), and `--scale` / `--objects` set the
pasted size range and the count per image.

Deterministic: one seed, one generator per image, and the same files come out every time.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from utils.data.data_config import SHARED_COCO128  # noqa: E402

CLASSES = {0: "person", 45: "bowl", 77: "teddy bear", 56: "chair", 20: "elephant", 54: "donut",
           25: "umbrella", 58: "potted plant"}  # COCO index -> name: the 8 classes with most large boxes
EXTRA = {51: "carrot", 41: "cup"}  # the next two by the same count, for --classes 10
MIN_SIDE = 24  # px on the source photo: smaller crops are too blurry once scaled up
SIZE = 256
TILE = 32
SEED = 20261201


def load_crops(coco: Path, classes: dict[int, str]) -> dict[str, list[tuple[int, np.ndarray]]]:
    """{'train'|'val': [(class, crop)]}: every usable box of the chosen classes, split by instance."""
    per_class: dict[int, list[np.ndarray]] = {c: [] for c in classes}
    for label in sorted((coco / "labels" / "train2017").glob("*.txt")):
        img = cv2.imread(str(coco / "images" / "train2017" / f"{label.stem}.jpg"))
        if img is None:
            continue
        h, w = img.shape[:2]
        for row in label.read_text().split("\n"):
            parts = row.split()
            if len(parts) != 5 or int(parts[0]) not in classes:
                continue
            cx, cy, bw, bh = (float(v) for v in parts[1:])
            x1, y1 = int(round((cx - bw / 2) * w)), int(round((cy - bh / 2) * h))
            x2, y2 = int(round((cx + bw / 2) * w)), int(round((cy + bh / 2) * h))
            x1, y1, x2, y2 = max(x1, 0), max(y1, 0), min(x2, w), min(y2, h)
            if min(x2 - x1, y2 - y1) >= MIN_SIDE:
                per_class[int(parts[0])].append(img[y1:y2, x1:x2].copy())
    split: dict[str, list[tuple[int, np.ndarray]]] = {"train": [], "val": []}
    for new_cls, (coco_cls, crops) in enumerate(per_class.items()):
        for i, crop in enumerate(crops):
            split["val" if i % 4 == 3 else "train"].append((new_cls, crop))
    return split


def background(photos: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """A SIZE x SIZE image of TILE px tiles taken from random places of random photos, shuffled."""
    n = SIZE // TILE
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    for k in range(n * n):
        photo = photos[rng.integers(len(photos))]
        y, x = rng.integers(photo.shape[0] - TILE), rng.integers(photo.shape[1] - TILE)
        r, c = divmod(k, n)
        out[r * TILE:(r + 1) * TILE, c * TILE:(c + 1) * TILE] = photo[y:y + TILE, x:x + TILE]
    return cv2.GaussianBlur(out, (5, 5), 0)


def noise_background(rng: np.random.Generator) -> np.ndarray:
    """A SIZE x SIZE field of blurred random colour blocks with Gaussian pixel noise on top."""
    blocks = rng.integers(0, 256, (SIZE // TILE, SIZE // TILE, 3)).astype(np.uint8)
    field = cv2.GaussianBlur(cv2.resize(blocks, (SIZE, SIZE), interpolation=cv2.INTER_NEAREST), (9, 9), 0)
    return np.clip(field + rng.normal(0, 25, field.shape), 0, 255).astype(np.uint8)


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Share of the smaller of two x1,y1,x2,y2 boxes that the other covers."""
    iw = max(min(a[2], b[2]) - max(a[0], b[0]), 0)
    ih = max(min(a[3], b[3]) - max(a[1], b[1]), 0)
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return iw * ih / max(smaller, 1)


def compose(crops: list[tuple[int, np.ndarray]], photos: list[np.ndarray] | None, rng: np.random.Generator,
            scale: tuple[float, float] = (0.12, 0.5), objects: tuple[int, int] = (1, 5)):
    """One image and its YOLO label rows (photos None: a noise background)."""
    img = background(photos, rng) if photos is not None else noise_background(rng)
    boxes: list[np.ndarray] = []
    rows = []
    for _ in range(int(rng.integers(objects[0], objects[1] + 1))):
        cls, crop = crops[rng.integers(len(crops))]
        side = rng.uniform(*scale) * SIZE
        s = side / max(crop.shape[:2])
        w, h = max(int(round(crop.shape[1] * s)), 4), max(int(round(crop.shape[0] * s)), 4)
        for _try in range(10):
            x, y = int(rng.integers(0, SIZE - w + 1)), int(rng.integers(0, SIZE - h + 1))
            box = np.array([x, y, x + w, y + h])
            if all(overlap(box, b) < 0.3 for b in boxes):
                break
        else:
            continue
        patch = cv2.resize(crop, (w, h), interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_LINEAR)
        if rng.random() < 0.5:
            patch = patch[:, ::-1]
        gain = rng.uniform(0.75, 1.25)
        img[y:y + h, x:x + w] = np.clip(patch.astype(np.float32) * gain, 0, 255).astype(np.uint8)
        boxes.append(box)
        rows.append(f"{cls} {(x + w / 2) / SIZE:.6f} {(y + h / 2) / SIZE:.6f} {w / SIZE:.6f} {h / SIZE:.6f}")
    return img, rows


def make(coco: Path, out: Path, n_train: int, n_val: int, n_classes: int = 8, noise: bool = False,
         scale: tuple[float, float] = (0.12, 0.5), objects: tuple[int, int] = (1, 5)) -> Path:
    classes = {**CLASSES, **EXTRA} if n_classes == 10 else CLASSES
    photos = None if noise else [cv2.resize(im, (SIZE, SIZE)) for im in (
        cv2.imread(str(p)) for p in sorted((coco / "images" / "train2017").glob("*.jpg"))) if im is not None]
    crops = load_crops(coco, classes)
    for split, n in (("train", n_train), ("val", n_val)):
        (out / "images" / split).mkdir(parents=True, exist_ok=True)
        (out / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            rng = np.random.default_rng([SEED, 0 if split == "train" else 1, i])
            img, rows = compose(crops[split], photos, rng, scale, objects)
            cv2.imwrite(str(out / "images" / split / f"{i:05d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 92])
            (out / "labels" / split / f"{i:05d}.txt").write_text("\n".join(rows) + "\n")
    yaml = out / f"{out.name}.yaml"
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(classes.values()))
    what = "noisy colour fields" if noise else "shuffled COCO128 tiles"
    yaml.write_text(f"# COCO128 objects pasted on {what} (bench/make_paste_dataset.py)\n"
                    f"path: .\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    counts = {k: len(v) for k, v in crops.items()}
    print(f"{yaml}: {n_train} train + {n_val} val images, {len(classes)} classes, crops {counts}")
    return yaml


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coco", default=str(SHARED_COCO128))
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "paste8"))
    p.add_argument("--train", type=int, default=400)
    p.add_argument("--val", type=int, default=120)
    p.add_argument("--classes", type=int, default=8, choices=[8, 10])
    p.add_argument("--background", default="tiles", choices=["tiles", "noise"])
    p.add_argument("--scale", type=float, nargs=2, default=[0.12, 0.5], help="pasted longer side, share of the image")
    p.add_argument("--objects", type=int, nargs=2, default=[1, 5], help="objects per image, min and max")
    a = p.parse_args(argv)
    if not (Path(a.coco) / "images" / "train2017").is_dir():
        sys.exit(f"{a.coco}: no images/train2017 folder; pass --coco path/to/coco128")
    make(Path(a.coco), Path(a.out), a.train, a.val, a.classes, a.background == "noise", tuple(a.scale),
         tuple(a.objects))


if __name__ == "__main__":
    main()
