"""YOLO-format labels: listing a split's images and their label files, verifying every image and label
row, and the verified index cached beside the labels (.cache.npz, never pickled).

Layout: every image `.../images/<split>/x.jpg` has its labels in `.../labels/<split>/x.txt`
(the last `images` folder swapped for `labels`), one row `cls cx cy w h` per object, normalised
to 0..1. No label file means a background image. A row `cls x1 y1 x2 y2 x3 y3 ...` is a polygon (YOLOv5's
segmentation format, what many annotation tools export): it becomes the box around its points.
"""
from __future__ import annotations

import hashlib
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from utils.data.images import IMG_FORMATS, decode_in_threads, load_image_file, read_media_list
from utils.errors import UserError
from utils.files import atomic_write, special_file_kind
from utils.limits import max_image_pixels

LOGGER = logging.getLogger(__name__)

MIN_IMAGE_SIDE = 10  # smaller images carry no usable object at any stride
COORD_TOL = 0.01  # label coordinates may overshoot 0..1 by rounding; more than this is an error
CACHE_VERSION = "ampyolo-labels-3"  # bump when the verification rules change
STATS = ("found", "backgrounds", "left_out", "duplicates", "polygons")  # LabelIndex.stats, in the cache's order


# =============================================================================================
# listing images and labels


def list_image_files(sources: Sequence[str | Path]) -> list[str]:
    """Image paths from folders (recursive, sorted), .txt lists and single files, in source order."""
    files: list[str] = []
    for src in map(Path, sources):
        if src.is_dir():
            found = _images_under(src)
        elif src.is_file() and src.suffix.lower() == ".txt":
            found = _read_list_file(src)
        elif src.is_file() and src.suffix[1:].lower() in IMG_FORMATS:
            found = [str(src)]
        else:
            kind = special_file_kind(src)
            raise UserError(f"image source {src} " + (f"is {kind}, not an image, folder or list" if kind else "not found") +
                            "; pass an image folder, a .txt list of images or an image")
        if not found:
            raise UserError(f"no images ({', '.join(IMG_FORMATS)}) found in {src}; check the data YAML's train/val")
        files += found
    return files


def _images_under(folder: Path) -> list[str]:
    """Paths with an image extension under a folder, sorted. Links to folders are followed, each real folder
    listed once (a link cycle ends); an entry that is no readable file (a dangling link, a FIFO) is kept, so that
    verification leaves it out with its reason and counts it. A subfolder that cannot be listed is one warning."""
    found, seen = [], set()

    def unlisted(e: OSError) -> None:
        LOGGER.warning(f"warning: cannot list {e.filename} ({e.strerror or e}); its pictures are left out")

    for root, dirs, files in os.walk(folder, onerror=unlisted, followlinks=True):
        try:
            st = os.stat(root)
        except OSError as e:
            unlisted(e)
            dirs[:] = []
            continue
        dirs.sort()  # the same walk every time: where a folder is reached twice, the same path lists it
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        found += [os.path.join(root, f) for f in files if Path(f).suffix[1:].lower() in IMG_FORMATS]
    return sorted(found)


def _read_list_file(txt: Path) -> list[str]:
    """The image paths of a .txt list (utils.data.images.read_media_list, shared with detect.py's --source)."""
    return [str(p) for p in read_media_list(txt, "image list", IMG_FORMATS)[0]]


def _swap_images_dir(path: Path) -> Path:
    """Replace the last `images` component of a path with `labels` (unchanged if there is none)."""
    parts = list(path.parts)
    for k in range(len(parts) - 1, -1, -1):
        if parts[k] == "images":
            parts[k] = "labels"
            return Path(*parts)
    return path


def img2label_paths(im_files: Sequence[str]) -> list[str]:
    """Label file of each image: .../images/.../x.jpg -> .../labels/.../x.txt."""
    return [str(_swap_images_dir(Path(f).parent) / (Path(f).stem + ".txt")) for f in im_files]


# =============================================================================================
# verification of images and label rows


@dataclass
class _Checked:
    """Outcome for one image: kept (labels may be empty = background) or left out with a reason."""
    shape: tuple[int, int] = (0, 0)  # (w, h) after EXIF
    labels: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), np.float32))
    problem: str = ""
    duplicates: int = 0
    polygons: int = 0  # rows that were polygons, now boxes


def _check_image(path: str) -> tuple[int, int]:
    """Decode fully (the only way to catch corrupt data) and return (w, h); ValueError if unusable."""
    if not os.path.isfile(path):
        if os.path.islink(path) and not os.path.exists(path):
            raise ValueError(f"is a broken link (to {os.readlink(path)}, which does not exist)")
        kind = special_file_kind(path)
        raise ValueError(f"is {kind}, not an image file" if kind else "no such file")
    if os.path.getsize(path) == 0:
        raise ValueError("zero-byte file")
    if Path(path).suffix.lower() in (".jpg", ".jpeg"):
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(max(os.path.getsize(path) - 64, 0))
            tail = f.read().rstrip(b"\x00\r\n ")
        # decoders fill a cut-off JPEG with grey silently; a file that is no JPEG at all (a text file, a PNG under
        # a .jpg name) is left to the decoder below, which says what it is not
        if head == b"\xff\xd8" and not tail.endswith(b"\xff\xd9"):
            raise ValueError("truncated JPEG (no end-of-image marker)")
    h, w = load_image_file(path, verify=True).shape[:2]
    if min(h, w) < MIN_IMAGE_SIDE:
        raise ValueError(f"image too small ({w}x{h} px, minimum {MIN_IMAGE_SIDE} px)")
    return w, h


def parse_label_file(path: str, nc: int | None) -> tuple[np.ndarray, int, int]:
    """Rows (n, 5) cls,cx,cy,w,h from a label file (missing = background), the duplicate count, and how many
    rows were polygons (cls x1 y1 x2 y2 x3 y3 ..., turned into the box around their points).

    Raises ValueError naming the first bad line.
    """
    if not os.path.isfile(path):
        if os.path.lexists(path):  # a folder, a FIFO, a dangling link...: not "no labels", a mistake
            kind = special_file_kind(path) or ("a folder" if os.path.isdir(path) else "not a readable file")
            raise ValueError(f"the label path is {kind}, not a label file; fix or remove it")
        return np.zeros((0, 5), np.float32), 0, 0
    with open(path, encoding="utf-8-sig", errors="replace") as f:  # utf-8-sig: editors that add a BOM
        rows = [(i + 1, ln.split()) for i, ln in enumerate(f) if ln.strip()]
    if not rows:
        return np.zeros((0, 5), np.float32), 0, 0
    for line, cols in rows:
        if len(cols) != 5 and (len(cols) < 7 or len(cols) % 2 == 0):
            raise ValueError(f"line {line} has {len(cols)} columns, expected 5 (cls cx cy w h) or a polygon "
                             f"(cls x1 y1 x2 y2 x3 y3 ...: an odd number, at least 7)")
    lines = np.array([r[0] for r in rows])
    try:
        values = [np.array(cols, dtype=np.float64) for _, cols in rows]
    except ValueError:
        line, tok = next((ln, t) for ln, cols in rows for t in cols if not _is_number(t))
        raise ValueError(f"non-numeric value {tok!r} on line {line}") from None
    x = np.stack([v if len(v) == 5 else _polygon_box(v) for v in values])
    _check_rows(x, lines, nc)
    x = _clip_rows(x)
    _, first = np.unique(x, axis=0, return_index=True)
    keep = np.sort(first)  # keep first occurrences in file order
    return x[keep].astype(np.float32), len(x) - len(keep), sum(len(v) != 5 for v in values)


def _polygon_box(row: np.ndarray) -> np.ndarray:
    """cls, cx, cy, w, h of the box around a polygon row (cls x1 y1 x2 y2 ...); its checks follow in _check_rows."""
    xs, ys = row[1::2], row[2::2]
    x1, x2, y1, y2 = xs.min(), xs.max(), ys.min(), ys.max()
    return np.array([row[0], (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1])


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _check_rows(x: np.ndarray, lines: np.ndarray, nc: int | None) -> None:
    """Class and coordinate rules; raises ValueError naming the first offending line."""
    def first(bad: np.ndarray) -> int:
        return int(lines[np.argmax(bad)])

    if not np.isfinite(x).all():
        raise ValueError(f"non-numeric value (nan/inf) on line {first(~np.isfinite(x).all(1))}")
    cls = x[:, 0]
    bad = (cls < 0) | (cls != np.round(cls)) | ((cls >= nc) if nc else False)
    if bad.any():
        k = np.argmax(bad)
        limit = f"0..{nc - 1} (the data YAML has nc={nc})" if nc else "a non-negative integer"
        raise ValueError(f"class {x[k, 0]:g} on line {lines[k]} is not in {limit}")
    xyxy = np.concatenate([x[:, 1:3] - x[:, 3:5] / 2, x[:, 1:3] + x[:, 3:5] / 2], axis=1)
    bad = (xyxy < -COORD_TOL).any(1) | (xyxy > 1 + COORD_TOL).any(1) | (x[:, 3:5] <= 0).any(1)
    if bad.any():
        raise ValueError(f"box on line {first(bad)} is outside 0..1 or has no size; labels must be cx cy w h "
                         f"divided by the image width/height")


def _clip_rows(x: np.ndarray) -> np.ndarray:
    """Pull boxes that overshoot by rounding back inside the image."""
    x1y1 = np.clip(x[:, 1:3] - x[:, 3:5] / 2, 0, 1)
    x2y2 = np.clip(x[:, 1:3] + x[:, 3:5] / 2, 0, 1)
    return np.concatenate([x[:, :1], (x1y1 + x2y2) / 2, x2y2 - x1y1], axis=1)


def _check_one(args: tuple[str, str, int | None]) -> _Checked:
    im_file, lb_file, nc = args
    try:
        shape = _check_image(im_file)
    except UserError:  # a setting the user must fix (AMPYOLO_MAX_PIXELS): stop, not leave every image out
        raise
    except Exception as e:  # noqa: BLE001 - whatever a decoder raises, the image is left out with its reason
        return _Checked(problem=f"{im_file}: {_one_line(e)}")
    try:
        labels, dups, polygons = parse_label_file(lb_file, nc)
    except Exception as e:  # noqa: BLE001
        return _Checked(problem=f"{lb_file}: {_one_line(e)}")
    return _Checked(shape=shape, labels=labels, duplicates=dups, polygons=polygons)


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, (ValueError, OSError)) and text:
        return text[:200]
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


# =============================================================================================
# the verified index and its cache


@dataclass
class LabelIndex:
    """Images that passed verification, their sizes and labels, and what was reported."""
    im_files: list[str]
    shapes: np.ndarray  # (N, 2) int w, h
    labels: list[np.ndarray]  # (n, 5) float32 cls, cx, cy, w, h
    messages: list[str]  # warnings (left out) and notes (duplicates), in file order
    stats: dict[str, int]  # STATS: found, backgrounds, left_out, duplicates, polygons


_UNWRITABLE_MEMO: dict[str, LabelIndex] = {}  # index of read-only datasets, so one process verifies once


def verify_dataset(im_files: list[str], label_files: list[str], nc: int | None, cache_file: Path,
                   prefix: str = "") -> LabelIndex:
    """Verified index from the cache when it matches the files, else built (threads) and cached."""
    key = _files_hash(im_files, label_files, nc)
    index, damage, source = _UNWRITABLE_MEMO.get(key), "", "cache"
    if index is None:
        index, damage = _load_cache(cache_file, key, im_files, nc)
    if index is None:
        index, source = _build_index(im_files, label_files, nc, prefix), "verified"
        _store_cache(cache_file, key, index, damage, prefix)
    for msg in index.messages:
        (LOGGER.warning if "left out" in msg else LOGGER.info)(f"{prefix}{msg}")
    s = index.stats
    polygons = f", {s['polygons']} of them from polygons" if s["polygons"] else ""
    LOGGER.info(f"{prefix}{s['found']} images found, {s['backgrounds']} backgrounds, {s['left_out']} left out, "
                f"{sum(len(x) for x in index.labels)} boxes{polygons} ({source}: {cache_file.name})")
    return index


def _store_cache(cache_file: Path, key: str, index: LabelIndex, damage: str, prefix: str) -> None:
    """Cache a new index; one warning line when the old cache was unusable (`damage`) or the new one cannot be
    written (then this process keeps the index, so it verifies once)."""
    problem = _save_cache(cache_file, key, index)
    if problem:
        _UNWRITABLE_MEMO[key] = index
    if damage:
        done = (f" and cannot be replaced ({problem}); the labels are verified each run until it is removed"
                if problem else "; rebuilt from the labels")
        LOGGER.warning(f"{prefix}warning: label cache {cache_file} was unusable ({damage}){done}")
    elif problem and cache_file.parent.is_dir():  # no labels folder at all: the no-boxes warning names it
        LOGGER.warning(f"{prefix}warning: cannot write label cache {cache_file} ({problem}); "
                       f"labels will be verified again next run")


def _build_index(im_files: list[str], label_files: list[str], nc: int | None, prefix: str) -> LabelIndex:
    checked = decode_in_threads(_check_one, [(f, lf, nc) for f, lf in zip(im_files, label_files)])
    kept = [(f, c) for f, c in zip(im_files, checked) if not c.problem]
    messages = []
    for f, c in zip(im_files, checked):
        if c.problem:
            messages.append(f"warning: {c.problem}; image left out")
        elif c.duplicates:
            messages.append(f"note: {img2label_paths([f])[0]}: {c.duplicates} duplicate rows dropped")
    stats = {"found": len(im_files), "backgrounds": sum(len(c.labels) == 0 for _, c in kept),
             "left_out": len(im_files) - len(kept), "duplicates": sum(c.duplicates for c in checked),
             "polygons": sum(c.polygons for _, c in kept)}
    shapes = np.array([c.shape for _, c in kept], dtype=np.int64).reshape(-1, 2)
    return LabelIndex([f for f, _ in kept], shapes, [c.labels for _, c in kept], messages, stats)


def _files_hash(im_files: list[str], label_files: list[str], nc: int | None) -> str:
    """Hash of paths, sizes and modification times: any added/removed/edited file changes it."""
    h = hashlib.sha256(f"{CACHE_VERSION}|nc={nc}|max_pixels={max_image_pixels()}".encode())
    for f in (*im_files, *label_files):
        try:
            st = os.stat(f)
            h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{f}|missing\n".encode())
    return h.hexdigest()


def cache_file_for(sources: Sequence[Path]) -> Path:
    """Where the label cache of these sources lives: beside their labels folder (or list file)."""
    src = Path(sources[0])
    base = src if src.suffix.lower() == ".txt" else _swap_images_dir(src)
    stem = base.stem if src.suffix.lower() == ".txt" else base.name
    if len(sources) > 1:  # a combination of sources gets its own file, so it never thrashes with the single
        stem += "." + hashlib.sha1("|".join(map(str, sources)).encode()).hexdigest()[:8]
    return base.parent / f"{stem}.cache.npz"


def _save_cache(path: Path, key: str, index: LabelIndex) -> str:
    """Atomic write (temp file + rename); '' when written, else why not (a read-only folder, a full disk...)."""
    counts = np.array([len(x) for x in index.labels], dtype=np.int64)
    labels = np.concatenate(index.labels, 0) if index.labels else np.zeros((0, 5), np.float32)
    if not path.parent.is_dir():  # never create folders inside a dataset
        return "no labels folder"
    if not _folder_writable(path.parent):
        return "the folder is read-only"

    def write(f) -> None:
        np.savez(f, key=np.array(key), im_files=np.array(index.im_files, dtype=str), shapes=index.shapes,
                 counts=counts, labels=labels.astype(np.float32), messages=np.array(index.messages, dtype=str),
                 stats=np.array([index.stats[k] for k in STATS]))

    try:
        atomic_write(path, write)
        return ""
    except UserError as e:  # full, read-only, a folder in the way: the labels are verified again next time
        return str(e).split("; the previous file")[0].removeprefix(f"could not write {path}: ")


def _folder_writable(folder: Path) -> bool:
    """Writable, and not marked read-only: root could write anyway, but a dataset folder without
    write bits (a shared copy) is meant to stay untouched."""
    try:
        mode = folder.stat().st_mode
    except OSError:
        return False
    return os.access(folder, os.W_OK) and bool(stat.S_IMODE(mode) & 0o222)


def _load_cache(path: Path, key: str, im_files: list[str], nc: int | None) -> tuple[LabelIndex | None, str]:
    """The cached index if the file's key matches, else None; and what is wrong with the file if it is unusable
    ('' when it is missing or simply outdated). Never unpickles anything. A cache is only a copy, which a crash, a
    full disk or another program may have spoilt: every array is checked before the index is trusted."""
    if not os.path.lexists(path):
        return None, ""
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None, ""
            return _index_from_cache({k: z[k] for k in ("im_files", "shapes", "counts", "labels", "messages",
                                                         "stats")}, im_files, nc), ""
    except Exception as e:  # noqa: BLE001 - zipfile, zlib, numpy and the checks below each raise their own
        kind = special_file_kind(path) or ("a folder" if os.path.isdir(path) else "")
        return None, (f"it is {kind}" if kind else _one_line(e))


def _index_from_cache(z: dict[str, np.ndarray], im_files: list[str], nc: int | None) -> LabelIndex:
    """The LabelIndex a cache's arrays describe; ValueError naming the first array that is not what
    _save_cache writes for these image files."""
    names, shapes, counts, labels, messages, stats = (z[k] for k in ("im_files", "shapes", "counts", "labels",
                                                                      "messages", "stats"))
    n = len(names)
    _expect(names.dtype.kind == "U" and names.ndim == 1 and set(names.tolist()) <= set(im_files), "im_files")
    _expect(shapes.dtype.kind in "iu" and shapes.shape == (n, 2) and (shapes >= MIN_IMAGE_SIDE).all(), "shapes")
    _expect(counts.dtype.kind in "iu" and counts.shape == (n,) and (counts >= 0).all(), "counts")
    _expect(labels.dtype == np.float32 and labels.shape == (int(counts.sum()), 5), "labels")
    _expect(messages.dtype.kind == "U" and messages.ndim == 1, "messages")
    _expect(stats.dtype.kind in "iu" and stats.shape == (len(STATS),) and (stats >= 0).all(), "stats")
    counted = dict(zip(STATS, map(int, stats)))
    _expect(counted["found"] == len(im_files) and counted["found"] - counted["left_out"] == n, "stats")
    try:
        _check_rows(labels.astype(np.float64), np.arange(1, len(labels) + 1), nc)
    except ValueError:
        _expect(False, "labels")
    split = np.split(labels, np.cumsum(counts)[:-1]) if n else []
    return LabelIndex(names.tolist(), shapes.astype(np.int64), list(split), messages.tolist(), counted)


def _expect(ok: bool, array: str) -> None:
    if not ok:
        raise ValueError(f"its {array} array is not what a label cache holds")
