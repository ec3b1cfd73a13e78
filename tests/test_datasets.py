"""Data YAML resolution, image decoding, label verification and its cache, loaders."""
from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from utils.data import data_config, datasets as ds, images, labels as label_files
from utils.data.data_config import COCO80_TO_91, SHARED_COCO128, load_data_config
from utils.hyp import load_hyp
from utils.data.datasets import SeededSampler, create_dataloader
from utils.data.images import load_image_file
from utils.data.labels import parse_label_file
from utils.errors import UserError
from utils.files import load_yaml

REPO = Path(__file__).resolve().parents[1]
COCO128 = SHARED_COCO128


# ---------------------------------------------------------------------------------------------
# helpers


def write_image(path: Path, w: int = 64, h: int = 48, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    im = np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)
    assert cv2.imwrite(str(path), im)
    return path


def write_labels(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def make_split(root: Path, split: str = "train", n: int = 4, sizes=((64, 48),)) -> list[Path]:
    """n images with one box each under root/images/<split>, labels under root/labels/<split>."""
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        im = write_image(root / "images" / split / f"im{i}.jpg", w, h, seed=i)
        write_labels(root / "labels" / split / f"im{i}.txt", f"{i % 2} 0.5 0.5 0.4 0.3\n")
        out.append(im)
    return out


def write_yaml(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def exif_jpeg(im: np.ndarray, orientation: int) -> bytes:
    """JPEG bytes with a hand-made APP1 EXIF segment holding only the orientation tag."""
    ok, enc = cv2.imencode(".jpg", im, [cv2.IMWRITE_JPEG_QUALITY, 100])
    assert ok
    ifd = struct.pack(">H", 1) + struct.pack(">HHI", 0x0112, 3, 1) + struct.pack(">HH", orientation, 0)
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + ifd + struct.pack(">I", 0)
    seg = b"Exif\x00\x00" + tiff
    b = enc.tobytes()
    return b[:2] + b"\xff\xe1" + struct.pack(">H", len(seg) + 2) + seg + b[2:]


# ---------------------------------------------------------------------------------------------
# data YAML


def test_yaml_folder_relative_to_yaml_and_names_dict(tmp_path):
    make_split(tmp_path / "data" / "ds", "train")
    make_split(tmp_path / "data" / "ds", "val")
    y = write_yaml(tmp_path / "data" / "my.yaml",
                   "path: ds\ntrain: images/train\nval: images/val\nnames: {0: cat, 1: dog}\n")
    cfg = load_data_config(y)
    root = (tmp_path / "data" / "ds").resolve()
    assert cfg["path"] == root and cfg["yaml_file"] == y.resolve()
    assert cfg["train"] == [root / "images" / "train"] and cfg["val"] == [root / "images" / "val"]
    assert cfg["test"] is None and cfg["names"] == ["cat", "dog"] and cfg["nc"] == 2
    assert cfg["annotations"] is None and cfg["coco91"] is False and cfg["defaults"] == {}


def test_yaml_txt_list_and_list_of_both(tmp_path):
    ims = make_split(tmp_path, "a", n=3)
    make_split(tmp_path, "b", n=2)
    (tmp_path / "lists").mkdir()
    # relative lines resolve against the list's own folder
    (tmp_path / "lists" / "a.txt").write_text("\n".join(f"../images/a/{p.name}" for p in ims[:2]) + "\n\n")
    (tmp_path / "annotations.json").write_text("{}")
    y = write_yaml(tmp_path / "d.yaml", f"path: {tmp_path}\ntrain: [lists/a.txt, images/b]\nval: lists/a.txt\n"
                                        f"names: [x, y]\nnc: 2\ndefaults: {{imgsz: 64}}\n")
    cfg = load_data_config(y)
    assert cfg["train"] == [tmp_path / "lists" / "a.txt", tmp_path / "images" / "b"]
    assert cfg["annotations"] == tmp_path / "annotations.json" and cfg["defaults"] == {"imgsz": 64}
    _, d = create_dataloader(cfg["train"], 64, 2, 32, workers=0)
    assert len(d) == 4 and d.im_files[0] == str(ims[0]) and d.im_files[-1].endswith("images/b/im1.jpg")


@pytest.mark.parametrize("text, expect", [
    ("train: a\nval: a\nnames: [x]\nnc: 2\n", "nc is 2"),
    ("train: a\nval: a\n", "missing 'names'"),
    ("val: a\nnames: [x]\n", "missing 'train'"),
    ("train: [a\nval: b\n", "not valid plain YAML"),
    ("!!python/object/apply:os.system ['echo hi']\n", "not valid plain YAML"),
    ("- just\n- a list\n", "must be a YAML mapping"),
    ("train: nowhere\nval: nowhere\nnames: [x]\n", "train images not found"),
    ("train: nowhere\nval: nowhere\nnames: [x]\ndownload_info: 'get it from X into <path>/images'\n", "get it from X"),
    ("train: a\nval: a\nnames: {0: x, 2: y}\n", "without gaps"),
])
def test_yaml_errors_are_one_line(tmp_path, text, expect):
    (tmp_path / "a").mkdir()
    y = write_yaml(tmp_path / "bad.yaml", text)
    with pytest.raises(UserError) as e:
        load_data_config(y)
    msg = str(e.value)
    assert expect in msg and "\n" not in msg and "bad.yaml" in msg


def test_a_key_set_twice_is_one_warning_line_and_the_last_value_wins(tmp_path, caplog):
    """A hyp file with lr0 twice trained the last value without a word: it still does (as YOLOv5, whose
    yaml.safe_load keeps the last), and one warning line names the file, the key, its lines and the value used."""
    default = (REPO / "data" / "hyps" / "hyp.scratch.yaml").read_text()
    hyp = write_yaml(tmp_path / "hyp.yaml", default + "lr0: 0.05\n")
    first = 1 + next(i for i, ln in enumerate(default.splitlines()) if ln.startswith("lr0:"))
    last = len(default.splitlines()) + 1
    caplog.set_level(logging.WARNING)
    assert load_hyp(hyp).lr0 == 0.05
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert str(hyp) in lines[0] and f"lr0 twice (lines {first} and {last})" in lines[0] and "lr0: 0.05" in lines[0]
    caplog.clear()
    images = write_image(tmp_path / "images" / "a.jpg").parent  # a data YAML: the same loader, the same line
    data = write_yaml(tmp_path / "data.yaml", f"train: {images}\nval: nowhere\nval: {images}\nnames: {{0: a, 0: b}}\n")
    cfg = load_data_config(data)
    assert cfg["val"] == [images] and cfg["names"] == ["b"]
    lines = sorted(r.getMessage() for r in caplog.records)
    assert len(lines) == 2 and "0 twice (line 4)" in lines[0] and "val twice (lines 2 and 3)" in lines[1], lines
    assert "0: b" in lines[0] and f"val: {images}" in lines[1] and all(str(data) in ln for ln in lines)
    caplog.clear()  # a merge key's entries overridden on purpose are no duplicate
    merged = write_yaml(tmp_path / "m.yaml", "base: &b {lr0: 0.01, lrf: 0.1}\nrun: {<<: *b, lrf: 0.2}\n")
    assert load_yaml(merged)["run"] == {"lr0": 0.01, "lrf": 0.2} and not caplog.records


def test_yaml_missing_file_and_builtin_coco_message(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_data_config(tmp_path / "none.yaml")
    for name in ("coco", "voc"):  # the real datasets are not here: the message says where to get them
        if (data_config.DATA_DIR / "../datasets").exists():
            pytest.skip("a datasets folder exists beside data/")
        with pytest.raises(UserError) as e:
            load_data_config(name)
        assert "images not found" in str(e.value) and "/images/" in str(e.value) and "\n" not in str(e.value)


def test_coco_yaml_names_map_to_coco91():
    cfg_names = load_yaml(data_config.DATA_DIR / "coco.yaml")["names"]
    assert [cfg_names[i] for i in range(80)] == list(data_config.COCO_NAMES)
    assert len(COCO80_TO_91) == 80 and len(set(COCO80_TO_91)) == 80 and max(COCO80_TO_91) == 90
    table = COCO128 / "yolo80_to_coco91.json"
    if table.is_file():
        assert list(COCO80_TO_91) == json.loads(table.read_text())


# ---------------------------------------------------------------------------------------------
# image decoding


def test_grey_rgba_16bit_png_load_as_bgr8(tmp_path):
    grey = np.full((20, 30), 77, np.uint8)
    rgba = np.zeros((20, 30, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 10  # blue, almost transparent
    deep = np.full((20, 30, 3), 0x1234, np.uint16)
    deep_grey = np.full((20, 30), 0xFF00, np.uint16)
    for name, im in (("g.png", grey), ("a.png", rgba), ("d.png", deep), ("dg.png", deep_grey)):
        assert cv2.imwrite(str(tmp_path / name), im)
    for name, value in (("g.png", (77, 77, 77)), ("a.png", (200, 0, 0)), ("d.png", (0x12,) * 3),
                        ("dg.png", (0xFF,) * 3)):
        out = load_image_file(tmp_path / name)
        assert out.shape == (20, 30, 3) and out.dtype == np.uint8
        assert tuple(int(v) for v in out[5, 5]) == value


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(tmp_path, orientation):
    im = np.zeros((24, 40, 3), np.uint8)
    im[:8, :8] = (0, 0, 255)  # red marker in the stored top-left corner
    im[:, 32:] = (255, 0, 0)  # blue band on the stored right side
    data = exif_jpeg(im, orientation)
    f = tmp_path / "o.jpg"
    f.write_bytes(data)
    assert images.exif_orientation(data) == orientation
    ours = load_image_file(f)
    reference = cv2.imread(str(f), cv2.IMREAD_COLOR)  # OpenCV applies EXIF with this flag
    assert ours.shape == reference.shape == ((24, 40, 3) if orientation <= 4 else (40, 24, 3))
    assert np.abs(ours.astype(int) - reference.astype(int)).max() <= 2


def test_exif_orientation_in_png(tmp_path):
    im = np.zeros((10, 30, 3), np.uint8)
    im[:, :5] = 255
    png = cv2.imencode(".png", im)[1].tobytes()
    tiff = b"II\x2a\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + struct.pack("<HHIHH", 0x0112, 3, 1, 8, 0)
    chunk = struct.pack(">I", len(tiff)) + b"eXIf" + tiff + struct.pack(">I", zlib.crc32(b"eXIf" + tiff))
    (tmp_path / "o.png").write_bytes(png[:33] + chunk + png[33:])  # after the signature and IHDR
    out = load_image_file(tmp_path / "o.png")
    assert np.array_equal(out, cv2.rotate(im, cv2.ROTATE_90_COUNTERCLOCKWISE))


def test_bad_file_raises_value_error(tmp_path):
    (tmp_path / "x.jpg").write_bytes(b"not an image at all")
    with pytest.raises(ValueError):
        load_image_file(tmp_path / "x.jpg")


# ---------------------------------------------------------------------------------------------
# verification


def _spoil(root: Path, case: str) -> Path:
    """Make image 'bad' under root in the given way; returns the file the warning must name."""
    im = root / "images" / "train" / "bad.jpg"
    lb = root / "labels" / "train" / "bad.txt"
    write_image(im, 64, 48, seed=9)
    write_labels(lb, "0 0.5 0.5 0.2 0.2\n")
    if case == "zero-byte":
        im.write_bytes(b"")
    elif case == "truncated":
        im.write_bytes(im.read_bytes()[:-200])
    elif case == "corrupt":
        im.write_bytes(b"\xff\xd8" + os.urandom(500) + b"\xff\xd9")
    elif case == "tiny":
        write_image(im, 9, 30)
    else:
        lb.write_text({"columns": "0 0.5 0.5 0.2\n", "non-numeric": "0 0.5 abc 0.2 0.2\n",
                       "range": "0 0.5 0.5 1.5 0.2\n", "class": "0 0.5 0.5 0.2 0.2\n2 0.5 0.5 0.1 0.1\n",
                       "negative-class": "-1 0.5 0.5 0.2 0.2\n", "nan": "0 nan 0.5 0.2 0.2\n"}[case])
        return lb
    return im


@pytest.mark.parametrize("case, reason", [
    ("zero-byte", "zero-byte"), ("truncated", "truncated"), ("corrupt", "decodable"), ("tiny", "too small"),
    ("columns", "columns"), ("non-numeric", "non-numeric"), ("range", "outside 0..1"), ("class", "0..1"),
    ("negative-class", "class -1"), ("nan", "non-numeric"),
])
def test_bad_image_or_label_is_left_out_with_one_warning(tmp_path, caplog, case, reason):
    good = make_split(tmp_path, n=3)
    bad = _spoil(tmp_path, case)
    with caplog.at_level(logging.INFO):
        _, d = create_dataloader(tmp_path / "images" / "train", 64, 2, 32, workers=0, nc=2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and str(bad) in r.getMessage()]
    assert len(warnings) == 1 and reason in warnings[0] and "left out" in warnings[0]
    assert d.im_files == [str(p) for p in good]
    assert any("4 images found, 0 backgrounds, 1 left out" in r.getMessage() for r in caplog.records)


def test_duplicates_dropped_backgrounds_counted(tmp_path, caplog):
    make_split(tmp_path, n=2)
    write_image(tmp_path / "images" / "train" / "bg.jpg")  # no label file: background
    write_image(tmp_path / "images" / "train" / "empty.jpg")
    write_labels(tmp_path / "labels" / "train" / "empty.txt", "\n")  # empty file: background
    write_labels(tmp_path / "labels" / "train" / "im0.txt", "0 0.5 0.5 0.4 0.3\n1 0.2 0.2 0.1 0.1\n0 0.5 0.5 0.4 0.3\n")
    with caplog.at_level(logging.INFO):
        _, d = create_dataloader(tmp_path / "images" / "train", 64, 2, 32, workers=0, single_cls=True)
    text = caplog.text
    assert "1 duplicate rows dropped" in text and "4 images found, 2 backgrounds, 0 left out" in text
    labels = dict(zip((Path(f).name for f in d.im_files), d.labels))
    np.testing.assert_allclose(labels["im0.jpg"], [[0, 0.5, 0.5, 0.4, 0.3], [0, 0.2, 0.2, 0.1, 0.1]], atol=1e-6)
    assert labels["bg.jpg"].shape == (0, 5) and labels["empty.jpg"].shape == (0, 5)


def test_polygon_rows_become_their_boxes_and_are_counted(tmp_path, caplog):
    """YOLOv5's segmentation rows (cls x1 y1 x2 y2 x3 y3 ...), mixed with box rows in one file: each polygon is the
    box around its points, the image stays in, and the summary says how many rows were polygons."""
    make_split(tmp_path, n=2)
    write_labels(tmp_path / "labels" / "train" / "im0.txt",
                 "1 0.1 0.2 0.5 0.2 0.5 0.6 0.1 0.6\n"  # a rectangle as 4 points
                 "0 0.7 0.7 0.9 0.75 0.8 0.95\n"  # a triangle
                 "1 0.3 0.3 0.2 0.2\n")  # an ordinary box
    with caplog.at_level(logging.INFO):
        _, d = create_dataloader(tmp_path / "images" / "train", 64, 2, 32, workers=0, nc=2)
    assert "left out" not in caplog.text.replace("0 left out", "")
    assert "2 images found, 0 backgrounds, 0 left out" in caplog.text and "2 of them from polygons" in caplog.text
    labels = dict(zip((Path(f).name for f in d.im_files), d.labels))
    np.testing.assert_allclose(labels["im0.jpg"], [[1, 0.3, 0.4, 0.4, 0.4], [0, 0.8, 0.825, 0.2, 0.25],
                                                   [1, 0.3, 0.3, 0.2, 0.2]], atol=1e-6)


@pytest.mark.parametrize("row, reason", [("0 0.1 0.2 0.3 0.4 0.5 0.6 0.7\n", "8 columns"),  # even: not x,y pairs
                                         ("0 0.1 0.2 0.3 0.4 0.5\n", "6 columns"),
                                         ("0 0.1 0.2 1.5 0.2 0.5 0.6\n", "outside 0..1")])
def test_malformed_polygons_are_still_refused(tmp_path, row, reason):
    f = write_labels(tmp_path / "l.txt", row)
    with pytest.raises(ValueError, match=reason):
        parse_label_file(str(f), nc=None)


def test_label_rows_slightly_outside_are_clipped(tmp_path):
    f = write_labels(tmp_path / "l.txt", "3 0.1 0.5 0.205 0.2\n")  # left edge at -0.0025: rounding
    x, dups, _ = parse_label_file(str(f), nc=None)
    assert dups == 0 and x[0, 1] - x[0, 3] / 2 == pytest.approx(0.0, abs=1e-6) and x[0, 0] == 3


def test_cache_is_used_and_rebuilt_when_a_label_changes(tmp_path, caplog):
    make_split(tmp_path, n=3)
    src = tmp_path / "images" / "train"
    cache = tmp_path / "labels" / "train.cache.npz"
    with caplog.at_level(logging.INFO):
        create_dataloader(src, 64, 2, 32, workers=0)
    assert cache.is_file() and "(verified:" in caplog.text
    with np.load(cache, allow_pickle=False) as z:  # plain arrays: loads without pickle
        assert len(z["im_files"]) == 3
    caplog.clear()
    with caplog.at_level(logging.INFO):
        create_dataloader(src, 64, 2, 32, workers=0)
    assert "(cache:" in caplog.text
    write_labels(tmp_path / "labels" / "train" / "im1.txt", "1 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _, d = create_dataloader(src, 64, 2, 32, workers=0)
    assert "(verified:" in caplog.text and len(d.labels[1]) == 2

def _damage(cache: Path, how: str) -> None:
    """The label cache spoilt in one way a crash, a full disk, a bad copy or another program can leave it."""
    data = cache.read_bytes()
    if how == "truncated":
        cache.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        mid = len(data) // 2
        cache.write_bytes(data[:mid] + os.urandom(64) + data[mid + 64:])
    elif how == "zero-length":
        cache.write_bytes(b"")
    elif how == "folder":
        cache.unlink()
        (cache / "x").mkdir(parents=True)
    else:  # the key matches, the arrays do not: each one wrong in turn
        with np.load(cache, allow_pickle=False) as z:
            arrays = dict(z)
        name, value = {"labels-shape": ("labels", arrays["labels"][:, :4]),
                       "labels-dtype": ("labels", arrays["labels"].astype(str)),
                       "counts": ("counts", arrays["counts"] + 1),
                       "negative-counts": ("counts", -arrays["counts"]),
                       "shapes": ("shapes", arrays["shapes"][:1]),
                       "stats": ("stats", arrays["stats"][:2]),
                       "im_files": ("im_files", np.array([1.5, 2.5, 3.5])),
                       "missing": ("messages", None)}[how]
        if value is None:
            del arrays[name]
        else:
            arrays[name] = value
        with open(cache, "wb") as f:
            np.savez(f, **arrays)


@pytest.mark.parametrize("how", ["truncated", "garbage", "zero-length", "folder", "labels-shape", "labels-dtype",
                                 "counts", "negative-counts", "shapes", "stats", "im_files", "missing"])
def test_a_damaged_label_cache_is_rebuilt_with_one_warning(tmp_path, caplog, how):
    """Before: a cut or overwritten cache raised zipfile.BadZipFile (a traceback, exit 1) in every run until the
    user deleted it, and wrong arrays behind a matching key went into training. The cache is untrusted: whatever
    is wrong with it, one warning line names it and the labels are verified again (and the cache written anew
    where a file can be)."""
    make_split(tmp_path, n=3)
    src = tmp_path / "images" / "train"
    cache = tmp_path / "labels" / "train.cache.npz"
    _, first = create_dataloader(src, 64, 2, 32, workers=0)
    _damage(cache, how)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _, d = create_dataloader(src, 64, 2, 32, workers=0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(cache) in warnings[0], warnings
    assert "(verified:" in caplog.text and ("folder" in warnings[0] if how == "folder" else "rebuilt" in warnings[0])
    assert d.im_files == first.im_files and all(np.array_equal(a, b) for a, b in zip(d.labels, first.labels))
    assert np.array_equal(d.shapes, first.shapes)
    if how != "folder":
        caplog.clear()
        with caplog.at_level(logging.INFO):
            create_dataloader(src, 64, 2, 32, workers=0)
        assert "(cache:" in caplog.text and "warning" not in caplog.text


def test_read_only_labels_folder_warns_once_and_writes_nothing(tmp_path, caplog):
    make_split(tmp_path, n=2)
    labels = tmp_path / "labels"
    os.chmod(labels, 0o555)
    try:
        with caplog.at_level(logging.INFO):
            create_dataloader(tmp_path / "images" / "train", 64, 2, 32, workers=0)
            create_dataloader(tmp_path / "images" / "train", 64, 2, 32, workers=0)
        assert sorted(p.name for p in labels.iterdir()) == ["train"]
        assert caplog.text.count("cannot write label cache") == 1
    finally:
        os.chmod(labels, 0o755)


@pytest.mark.parametrize("case", ["misnamed-folder", "empty-files"])
def test_a_training_set_without_boxes_says_where_it_looked_in_one_line(tmp_path, caplog, case):
    """Before: the labels in a misnamed folder, or only empty label files, trained silently on '12 backgrounds, 0
    boxes' (AutoAnchor even reported a recall of 1.0000). test.py warns in that case; a training set does too, with
    the labels folder it looked in."""
    make_split(tmp_path, n=3)
    labels = tmp_path / "labels" / "train"
    if case == "misnamed-folder":
        (tmp_path / "labels").rename(tmp_path / "label")
    else:
        for f in labels.iterdir():
            f.write_text("")
    with caplog.at_level(logging.INFO):
        create_dataloader(tmp_path / "images" / "train", 64, 2, 32, hyp=load_hyp(), augment=True, workers=0,
                          prefix="train: ")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "no boxes" in warnings[0] and str(labels) in warnings[0], warnings
    assert ("no label file" if case == "misnamed-folder" else "empty") in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.INFO):  # validation sets are test.py's to warn about, once it has scored them
        create_dataloader(tmp_path / "images" / "train", 64, 2, 32, rect=True, workers=0, prefix="val: ")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_linked_subfolder_is_followed_once_even_in_a_cycle(tmp_path, caplog):
    """Before: a symlinked subfolder of images/train was skipped silently ('4 images found' instead of 16). Links
    to folders are followed; a link cycle (a folder linking to its parent) lists each real folder once."""
    make_split(tmp_path, n=4)
    elsewhere = tmp_path / "more"
    for i in range(12):
        write_image(elsewhere / "images" / f"m{i}.jpg", seed=20 + i)
    train = tmp_path / "images" / "train"
    (train / "more").symlink_to(elsewhere / "images", target_is_directory=True)
    (elsewhere / "images" / "loop").symlink_to(train, target_is_directory=True)  # back up: a cycle
    with caplog.at_level(logging.INFO):
        _, d = create_dataloader(train, 64, 2, 32, workers=0)
    assert len(d) == 16 and len(set(map(os.path.realpath, d.im_files))) == 16
    assert "16 images found, 12 backgrounds, 0 left out" in caplog.text


def test_dangling_links_among_the_pictures_are_counted_and_named(tmp_path, caplog):
    """Before: '6 images found, 0 left out' with two dangling links among eight entries: neither counted nor named.
    Each is left out with one warning naming it, as an unreadable picture is."""
    make_split(tmp_path, n=6)
    train = tmp_path / "images" / "train"
    dangling = [train / "gone1.jpg", train / "gone2.png"]
    for link in dangling:
        link.symlink_to(tmp_path / "nowhere" / link.name)
    with caplog.at_level(logging.INFO):
        _, d = create_dataloader(train, 64, 2, 32, workers=0)
    assert len(d) == 6 and "8 images found, 0 backgrounds, 2 left out" in caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2 and all(str(f) in w and "link" in w for f, w in zip(dangling, warnings)), warnings


def test_an_unreadable_subfolder_is_named(tmp_path, caplog, monkeypatch):
    """A subfolder the walk cannot list (no permission, a dead mount) was passed over in silence. (As root no
    permission stops a listing, so the listing fails on purpose.)"""
    make_split(tmp_path, n=2)
    locked = tmp_path / "images" / "train" / "locked"
    write_image(locked / "x.jpg")
    scandir = os.scandir

    def refuse(path="."):
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refuse)
    with caplog.at_level(logging.INFO):
        _, d = create_dataloader(tmp_path / "images" / "train", 64, 2, 32, workers=0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(d) == 2 and len(warnings) == 1 and str(locked) in warnings[0] and "Permission denied" in warnings[0]


def test_empty_folder_and_all_bad_are_user_errors(tmp_path):
    (tmp_path / "images" / "x").mkdir(parents=True)
    with pytest.raises(UserError, match="no images"):
        create_dataloader(tmp_path / "images" / "x", 64, 2, 32, workers=0)
    (tmp_path / "images" / "x" / "a.jpg").write_bytes(b"")
    with pytest.raises(UserError, match="no usable images"):
        create_dataloader(tmp_path / "images" / "x", 64, 2, 32, workers=0)


# ---------------------------------------------------------------------------------------------
# loaders


def _batches(loader, epoch: int) -> list:
    loader.sampler.set_epoch(epoch)
    return [(im.clone(), t.clone(), p) for im, t, p, _ in loader]


def test_same_seed_and_epoch_give_same_batches_with_workers(tmp_path):
    make_split(tmp_path, n=10, sizes=((64, 48), (40, 72), (80, 80)))
    kw = dict(hyp=load_hyp(), augment=True, shuffle=True, seed=3, workers=2)
    loader_a, _ = create_dataloader(tmp_path / "images" / "train", 64, 4, 32, **kw)
    loader_b, _ = create_dataloader(tmp_path / "images" / "train", 64, 4, 32, **{**kw, "workers": 0})
    a1, a2 = _batches(loader_a, 1), _batches(loader_a, 2)
    b1 = _batches(loader_b, 1)
    assert len(a1) == 3
    for (ia, ta, pa), (ib, tb, pb) in zip(a1, b1):
        assert pa == pb and torch.equal(ia, ib) and torch.equal(ta, tb)
    assert [p for _, _, p in a1] != [p for _, _, p in a2]
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a1, a2))
    assert torch.equal(_batches(loader_a, 1)[0][0], a1[0][0])  # back to epoch 1: the same again


def test_mosaic_stops_at_mosaic_epochs_even_in_persistent_workers(tmp_path):
    """--close-mosaic: the epoch each sample carries decides, so live workers switch without a rebuild."""
    make_split(tmp_path, n=8, sizes=((64, 48), (40, 72)))
    hyp = load_hyp().updated(mosaic=1.0)
    loader, dataset = create_dataloader(tmp_path / "images" / "train", 64, 4, 32, hyp=hyp, augment=True,
                                        shuffle=True, workers=2, mosaic_epochs=2)
    kinds = []
    for epoch in range(4):
        loader.sampler.set_epoch(epoch)
        kinds.append({shape is None for _, _, _, shapes in loader for shape in shapes})  # None = a mosaic
    assert kinds == [{True}, {True}, {False}, {False}]
    assert [dataset.mosaic_in(e) for e in range(4)] == [True, True, False, False]


_EPOCH_DIGEST = """
import hashlib, sys
from utils.hyp import load_hyp
from utils.data.datasets import create_dataloader
loader, _ = create_dataloader(sys.argv[1], 64, 4, 32, hyp=load_hyp(), augment=True, shuffle=True, seed=5, workers=2)
loader.sampler.set_epoch(7)
h = hashlib.sha256()
for ims, targets, paths, _ in loader:
    h.update(ims.numpy().tobytes()); h.update(targets.numpy().tobytes()); h.update("|".join(paths).encode())
print(h.hexdigest())
"""


@pytest.mark.slow
def test_same_batches_after_a_process_restart(tmp_path):
    """Exact resume: a fresh interpreter rebuilds the very same epoch."""
    make_split(tmp_path, n=8, sizes=((64, 48), (40, 72)))
    run = [sys.executable, "-c", _EPOCH_DIGEST, str(tmp_path / "images" / "train")]
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    digests = {subprocess.run(run, capture_output=True, text=True, cwd=REPO, env=env, check=True).stdout.split()[-1]
               for _ in range(2)}
    assert len(digests) == 1


def test_loading_leaves_global_rng_alone(tmp_path):
    """The trainer's RNG state (saved for exact resume) must not depend on how data was loaded."""
    make_split(tmp_path, n=6)
    loader, _ = create_dataloader(tmp_path / "images" / "train", 64, 2, 32, hyp=load_hyp(), augment=True,
                                  shuffle=True, workers=2)
    torch.manual_seed(0)
    np.random.seed(0)
    t_state, n_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    for epoch in range(2):
        _batches(loader, epoch)
    assert torch.equal(t_state, torch.get_rng_state()) and np.array_equal(n_state, np.random.get_state()[1])


def test_ddp_shards_are_disjoint_and_cover_the_data():
    for n, ws in ((12, 3), (10, 4), (5, 2)):
        shards = []
        for rank in range(ws):
            s = SeededSampler(n, shuffle=True, seed=1, rank=rank, world_size=ws)
            s.set_epoch(4)
            shards.append([i for i, e in s])
            assert all(e == 4 for _, e in s) and len(s) == len(shards[-1])
        assert len({len(x) for x in shards}) == 1  # equal steps on every rank
        flat = [i for x in shards for i in x]
        assert set(flat) == set(range(n)) and len(flat) - n == (-n) % ws  # only padding repeats
        if n % ws == 0:
            assert len(set(flat)) == len(flat)
    # rectangular batches: each rank gets whole blocks
    s0, s1 = (SeededSampler(10, rank=r, world_size=2, block=4) for r in (0, 1))
    assert [i for i, _ in s0] == [0, 1, 2, 3, 8, 9] and [i for i, _ in s1] == [4, 5, 6, 7, 0, 1, 2, 3]


def test_rect_val_batches_map_back_to_original(tmp_path):
    make_split(tmp_path, n=6, sizes=((100, 50), (60, 90), (100, 40)))
    loader, d = create_dataloader(tmp_path / "images" / "train", 64, 2, 32, rect=True, pad=0.5, workers=0)
    ars = d.shapes[:, 1] / d.shapes[:, 0]
    assert list(ars) == sorted(ars)
    for ims, targets, paths, shapes in loader:
        assert ims.dtype == torch.uint8 and ims.shape[2] % 32 == 0 and ims.shape[3] % 32 == 0
        for j, ((h0, w0), ((ry, rx), (padw, padh))) in enumerate(shapes):
            t = targets[targets[:, 0] == j, 2:].numpy()
            H, W = ims.shape[2:]
            x = (t[:, 0] * W - padw) / rx / w0  # back to the original, normalised
            y = (t[:, 1] * H - padh) / ry / h0
            np.testing.assert_allclose(np.stack([x, y], 1), [[0.5, 0.5]], atol=0.02)
            np.testing.assert_allclose(t[:, 2] * W / rx / w0, [0.4], atol=0.03)


@pytest.mark.parametrize("augment_on", [None, "host", "device"])
def test_a_picture_gone_from_a_rectangular_batch_is_replaced_at_the_batch_shape(tmp_path, caplog, augment_on):
    """Validation (train and val in one folder, --cache off) after a picture was deleted. Before: its stand-in,
    the next sample, came at the shape of the next batch, and collating failed ('stack expects each tensor to be
    equal size'), losing the epoch. The stand-in is letterboxed to the batch's own rectangle."""
    make_split(tmp_path, n=6, sizes=((100, 25), (60, 90), (100, 60)))
    kw = dict(hyp=load_hyp(), augment=True, augment_on=augment_on) if augment_on else {}
    loader, d = create_dataloader(tmp_path / "images" / "train", 128, 2, 32, rect=True, workers=0, **kw)
    assert len({tuple(s) for s in d.batch_shapes}) == 3
    gone = Path(d.im_files[3])  # the last of batch 1: its stand-in, picture 4, belongs to batch 2
    gone.unlink()
    batches = list(loader)
    assert [len(b[2]) for b in batches] == [2, 2, 2] and str(gone) not in [p for b in batches for p in b[2]]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(gone) in warnings[0]
    if not augment_on:  # the stand-in's boxes map back onto its own picture
        ims, targets, paths, shapes = batches[1]
        (h0, w0), ((ry, rx), (padw, padh)) = shapes[1]
        t = targets[targets[:, 0] == 1, 2:].numpy()
        H, W = ims.shape[2:]
        np.testing.assert_allclose([(t[0, 0] * W - padw) / rx / w0, (t[0, 1] * H - padh) / ry / h0], [0.5, 0.5],
                                   atol=0.02)


def test_ram_cache_gives_same_samples(tmp_path):
    make_split(tmp_path, n=4)
    kw = dict(hyp=load_hyp(), augment=True, seed=0, workers=0)
    _, d1 = create_dataloader(tmp_path / "images" / "train", 64, 2, 32, **kw)
    _, d2 = create_dataloader(tmp_path / "images" / "train", 64, 2, 32, cache="ram", **kw)
    assert all(im is not None for im in d2.ims)
    for i in range(4):
        assert torch.equal(d1[(i, 2)][0], d2[(i, 2)][0])
    with pytest.raises(UserError, match="--cache"):
        create_dataloader(tmp_path / "images" / "train", 64, 2, 32, cache="disk", workers=0)


def test_auto_cache_caches_what_fits_and_reads_the_rest_from_disk(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    make_split(tmp_path, n=4, sizes=((64, 48), (40, 80)))
    src = tmp_path / "images" / "train"
    _, d = create_dataloader(src, 64, 2, 32, cache="auto", workers=0)
    assert d.cached_bytes() == 2 * (64 * 48 + 32 * 64) * 3  # long side resized to 64
    assert all(im is not None for im in d.ims) and "--cache auto" in caplog.text
    monkeypatch.setattr(ds, "AUTO_CACHE_MAX_BYTES", d.cached_bytes() - 1)
    _, d = create_dataloader(src, 64, 2, 32, cache="auto", workers=0)
    assert all(im is None for im in d.ims)
    _, d = create_dataloader(src, 64, 2, 32, cache="off", workers=0)
    assert all(im is None for im in d.ims)


def test_ram_cache_leaves_an_image_unreadable_at_caching_time_to_the_usual_fallback(tmp_path, monkeypatch, caplog):
    make_split(tmp_path, n=3)
    real, calls = ds.load_image_file, []

    def flaky(path, **kw):  # im1.jpg passes verification, then breaks (replaced on disk, say) before caching
        calls.append(str(path))
        if str(path).endswith("im1.jpg") and calls.count(str(path)) > 1:
            raise ValueError("truncated")
        return real(path, **kw)

    monkeypatch.setattr(label_files, "load_image_file", flaky)  # verification (utils/data/labels.py) ...
    monkeypatch.setattr(ds, "load_image_file", flaky)  # ... then caching (utils/data/datasets.py)
    _, d = create_dataloader(tmp_path / "images" / "train", 64, 2, 32, cache="ram", workers=0)
    assert d.ims[1] is None and d.ims[0] is not None
    _, _, path, _ = d[1]  # the next sample stands in, with one warning naming the file
    assert path.endswith("im2.jpg") and "im1.jpg" in caplog.text


def test_coco128_counts():
    yaml_file = COCO128 / "coco128.yaml"
    if not yaml_file.is_file():
        pytest.skip(f"COCO128 not present at {COCO128}")
    cfg = load_data_config(yaml_file)
    assert cfg["nc"] == 80 and cfg["coco91"] and cfg["annotations"].resolve() == (COCO128 / "annotations.json").resolve()
    loader, d = create_dataloader(cfg["train"], 320, 16, 32, workers=0, nc=cfg["nc"])
    assert len(d) == 128 and sum(len(x) == 0 for x in d.labels) == 2 and sum(len(x) for x in d.labels) == 929
    assert d.shapes.shape == (128, 2)
    assert not list((COCO128 / "labels").glob("*.npz"))  # the read-only shared copy is left untouched
    ims, targets, paths, shapes = next(iter(loader))
    assert ims.shape == (16, 3, 320, 320) and targets.shape[1] == 6 and len(paths) == len(shapes) == 16


def test_coco_yaml_without_coco_names_the_bundled_converter():
    from utils.data.data_config import load_data_config
    from utils.files import REPO_ROOT

    if (REPO_ROOT.parent / "datasets" / "coco" / "train2017.txt").exists():
        pytest.skip("COCO is installed beside the checkout")
    with pytest.raises(UserError) as e:
        load_data_config(REPO_ROOT / "data" / "coco.yaml")
    assert "train images not found" in str(e.value) and "python -m utils.data.coco2yolo --json" in str(e.value)


# (one CPU thread from here on; module-scoped, so every test below does too)
@pytest.mark.usefixtures("one_thread")
def test_training_loader_on_a_folder_of_background_images(tmp_path):
    folder = tmp_path / "images" / "train"
    folder.mkdir(parents=True)
    for k in range(6):
        cv2.imwrite(str(folder / f"{k}.jpg"), np.full((40 + 10 * k, 60, 3), 30 * k, np.uint8))
    loader, ds = create_dataloader(folder, 64, 4, 32, augment=True, workers=0, shuffle=True)
    assert ds.hyp.mosaic > 0
    for imgs, targets, _, _ in loader:
        assert imgs.shape[1:] == (3, 64, 64) and targets.shape == (0, 6)
