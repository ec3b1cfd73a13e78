"""COCO-format JSON -> YOLO labels: python -m utils.data.coco2yolo --json instances_train2017.json
--images images/train2017 --out <dataset root>

Writes, under --out (the dataset root that data/coco.yaml's `path` names):
  labels/<split>/<stem>.txt  one `cls cx cy w h` row per box, normalised (no file for a background image)
  <split>.txt                every image of the JSON that exists on disk, as ./images/<split>/<file_name>
  data.yaml                  a data file for train.py --data: path, train/val lists and the class names;
                             converting a second split (val2017) adds it to the same file
<split> is the name of the --images folder (train2017), or --split. When --images is not already
<out>/images/<split>, that path is made a symbolic link to it, so each image has its labels where the loader
looks (the last `images` folder of its path swapped for `labels`).

Classes: when every category is one of COCO's (its id among the 80 used of the 91 ids, with COCO's name),
labels use the usual 80-class order (utils.data.data_config.COCO80_TO_91). Any other COCO-format file (most labelling
tools export one) gets its category ids mapped in sorted id order, and the names come from its categories.
Crowd annotations (iscrowd=1) are skipped; images without annotations are kept as backgrounds; boxes reaching
outside the image are clipped to it and counted; boxes with no area left are dropped and counted.
The whole JSON is checked before anything is written, so a bad file leaves an earlier conversion as it was.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from utils.data.data_config import COCO80_TO_91, COCO_NAMES
from utils.errors import UserError, run_cli
from utils.files import atomic_write, load_yaml

LOGGER = logging.getLogger("coco2yolo")

CONVERTED_BY = "utils.coco2yolo"  # marks a data.yaml this tool may update (its name before utils/ had rooms)
WRITE_FIX = "free disk space or choose another --out (a writable folder)"


@dataclass
class Conversion:
    """What one JSON turned into (before writing): labels per image, the list, the names, the counts."""

    split: str
    names: list[str]
    coco80: bool  # classes in COCO's 80-class order (category ids among COCO's 91)
    files: list[str]  # file_name of every image, JSON order
    rows: dict[str, list[tuple[int, float, float, float, float]]]  # file_name -> (cls, cx, cy, w, h)
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def _fail(json_path: Path, what: str, fix: str) -> UserError:
    return UserError(f"{json_path}: {what}; {fix}")


def load_coco_json(path: str | Path) -> dict:
    """The JSON as a dict with lists `images`, `annotations` (may be absent: no labels) and `categories`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"COCO JSON {path} not found; pass the annotations file, e.g. "
                        f"annotations/instances_train2017.json")
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except RecursionError:  # json's parser recurses per level; no COCO file nests more than a few
        raise _fail(path, "nested too deeply to be COCO annotations (thousands of levels of [ or {)",
                    "pass a COCO-format annotations file") from None
    except json.JSONDecodeError as e:
        raise _fail(path, f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})",
                    "download or export it again") from None
    except UnicodeDecodeError as e:
        raise _fail(path, f"not UTF-8 JSON ({e.reason} at byte {e.start})", "download or export it again") from None
    except OSError as e:
        raise UserError(f"COCO JSON {path} cannot be read ({e.strerror or e}); check the path and permissions") from None
    if not isinstance(data, dict):
        raise _fail(path, f"the top level is a {type(data).__name__}, not an object with 'images', 'annotations' "
                    f"and 'categories'", "pass a COCO-format annotations file")
    for key in ("images", "categories"):
        if not isinstance(data.get(key), list):
            raise _fail(path, f"no '{key}' list", "pass a COCO-format annotations file (instances_*.json)")
    if not isinstance(data.get("annotations", []), list):
        raise _fail(path, "'annotations' is not a list", "pass a COCO-format annotations file (instances_*.json)")
    return data


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def category_map(categories: list, json_path: Path) -> tuple[dict[int, int], list[str], bool]:
    """category id -> class index, the class names, and whether COCO's 80-class order applies."""
    ids, names = [], {}
    for i, c in enumerate(categories):
        if not isinstance(c, dict) or not isinstance(c.get("id"), int) or isinstance(c.get("id"), bool):
            raise _fail(json_path, f"categories[{i}] has no integer 'id'", "fix the categories list")
        if c["id"] in names:
            raise _fail(json_path, f"category id {c['id']} appears twice in 'categories'", "fix the categories list")
        ids.append(c["id"])
        names[c["id"]] = _category_name(c, json_path)
    if not ids:
        raise _fail(json_path, "'categories' is empty", "a detection dataset needs at least one category")
    coco_index = {cid: k for k, cid in enumerate(COCO80_TO_91)}
    if all(cid in coco_index and names[cid] == COCO_NAMES[coco_index[cid]] for cid in ids):
        return coco_index, list(COCO_NAMES), True
    order = sorted(ids)
    return {cid: k for k, cid in enumerate(order)}, [names[cid] for cid in order], False


def _category_name(c: dict, json_path: Path) -> str:
    """A category's name as the class name (its id when it has none); null, an object or blank is refused: it
    would become the class name 'None' or "{'x': 1}" in data.yaml and in every picture's labels."""
    name = c.get("name", c["id"])
    if isinstance(name, bool) or not isinstance(name, (str, int)) or not str(name).strip():
        shown = {dict: "an object", list: "a list"}.get(type(name)) or json.dumps(name)[:60]
        raise _fail(json_path, f"category {c['id']} has the name {shown}, not a text", "give it a name in 'categories'")
    return str(name)


def _safe_file_name(name: Any, json_path: Path, image_id: Any) -> str:
    """file_name as a relative POSIX path inside the images folder (no absolute paths, no '..')."""
    if not isinstance(name, str) or not name.strip():
        raise _fail(json_path, f"image {image_id} has no file_name", "fix its 'images' entry")
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or "\x00" in name:
        raise _fail(json_path, f"image {image_id} has file_name {name!r}, which points outside the images folder",
                    "file names must be relative to --images")
    return str(p)


def convert(data: dict, json_path: Path, split: str) -> Conversion:
    """Check the whole JSON and compute every label row; nothing is written here."""
    cat_map, names, coco80 = category_map(data["categories"], json_path)
    images: dict[Any, dict] = {}
    stems: dict[str, str] = {}
    files = []
    for i, im in enumerate(data["images"]):
        if not isinstance(im, dict) or "id" not in im:
            raise _fail(json_path, f"images[{i}] has no 'id'", "fix the images list")
        iid = im["id"]
        if iid in images:
            raise _fail(json_path, f"image id {iid} appears twice in 'images'", "fix the images list")
        name = _safe_file_name(im.get("file_name"), json_path, iid)
        w, h = im.get("width"), im.get("height")
        if not (_is_number(w) and _is_number(h) and w > 0 and h > 0):
            raise _fail(json_path, f"image {iid} ({name}) has no positive width/height (width={w!r}, height={h!r})",
                        "add the image size to its 'images' entry")
        stem = str(PurePosixPath(name).with_suffix(""))
        if stem in stems:
            raise _fail(json_path, f"images {stems[stem]} and {name} would share the label file {stem}.txt",
                        "rename one of them")
        stems[stem] = name
        images[iid] = {"name": name, "w": float(w), "h": float(h)}
        files.append(name)
    conv = Conversion(split, names, coco80, files, {})
    for i, a in enumerate(data.get("annotations", [])):
        _add_annotation(conv, a, i, images, cat_map, json_path)
    return conv


def _add_annotation(conv: Conversion, a: Any, i: int, images: dict, cat_map: dict[int, int], json_path: Path) -> None:
    if not isinstance(a, dict):
        raise _fail(json_path, f"annotations[{i}] is not an object", "fix the annotations list")
    aid = a.get("id", f"#{i}")
    if a.get("iscrowd", 0):
        conv.counts["crowd"] += 1
        return
    im = images.get(a.get("image_id"))
    if im is None:
        raise _fail(json_path, f"annotation {aid} refers to image_id {a.get('image_id')!r}, which is not in 'images'",
                    "fix the annotation or add the image")
    cid = a.get("category_id")
    if cid not in cat_map or isinstance(cid, bool):
        known = sorted(cat_map)
        raise _fail(json_path, f"annotation {aid} (image {im['name']}) has category_id {cid!r}, which is not in "
                    f"'categories' (ids {known[0]}..{known[-1]}, {len(known)} in all)",
                    "add the category to 'categories' or fix the annotation")
    bbox = a.get("bbox")
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)):
        raise _fail(json_path, f"annotation {aid} (image {im['name']}) has bbox {bbox!r}, not [x, y, width, height]",
                    "fix the annotation")
    x, y, bw, bh = (float(v) for v in bbox)
    W, H = im["w"], im["h"]
    x1, y1, x2, y2 = max(x, 0.0), max(y, 0.0), min(x + bw, W), min(y + bh, H)
    if (x1, y1, x2, y2) != (x, y, x + bw, y + bh):
        conv.counts["clipped"] += 1
    if x2 <= x1 or y2 <= y1:
        conv.counts["empty"] += 1
        return
    conv.rows.setdefault(im["name"], []).append(
        (cat_map[cid], (x1 + x2) / 2 / W, (y1 + y2) / 2 / H, (x2 - x1) / W, (y2 - y1) / H))


# ------------------------------------------------------------------------------------------------- writing


def link_images(images: Path, out: Path, split: str) -> Path:
    """<out>/images/<split>, made a symbolic link to `images` when they are not the same folder."""
    if not images.is_dir():
        raise UserError(f"images folder {images} not found; pass the folder holding the JSON's images with --images")
    target = out / "images" / split
    if target.exists() or target.is_symlink():
        if target.resolve() != images.resolve():
            raise UserError(f"{target} already exists and is not {images}; move the images there, or choose another "
                            f"--out or --split")
        return target
    make_folder(target.parent)
    try:
        target.symlink_to(images.resolve(), target_is_directory=True)
    except OSError as e:
        raise UserError(f"cannot link {target} to {images} ({e.strerror or e}); move the images to {target} "
                        f"and pass --images {target}") from None
    LOGGER.info(f"linked {target} -> {images.resolve()}")
    return target


def write_labels(conv: Conversion, out: Path, image_dir: Path) -> tuple[list[str], int]:
    """Label files for the images found on disk; returns (list lines, number of images missing on disk)."""
    label_dir = out / "labels" / conv.split
    lines, missing = [], 0
    for name in conv.files:
        if not (image_dir / name).is_file():
            missing += 1
            continue
        lines.append(f"./images/{conv.split}/{name}")
        txt = (label_dir / name).with_suffix(".txt")
        rows = conv.rows.get(name)
        if rows:
            make_folder(txt.parent)
            _write_text(txt, "".join(f"{c} {' '.join(map(_num, xywh))}\n" for c, *xywh in rows))
        elif txt.is_file():  # a background now: an earlier conversion's labels would be wrong
            _write_text(txt, "")
    return lines, missing


def _write_text(path: Path, text: str) -> None:
    """One label file, whole or not at all; not fsynced: a COCO split has a hundred thousand."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), fix=WRITE_FIX, durable=False)


def make_folder(folder: Path) -> None:
    """mkdir -p, or one line saying why not (a file of that name, a read-only file system, /proc...)."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file, not a folder; {WRITE_FIX}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create folder {folder}: {e.strerror or e}; {WRITE_FIX}") from None


def _num(v: float) -> str:
    """6 significant digits (%g, as COCO128's and YOLOv5's label files have): a thousandth of a pixel at 1000 px."""
    return f"{v:g}"


def split_role(split: str) -> str:
    s = split.lower()
    return "val" if "val" in s else "test" if "test" in s else "train"


def write_data_yaml(conv: Conversion, out: Path, list_name: str, json_path: Path) -> Path:
    """data.yaml for train.py --data: a new one, or this split added to one this tool wrote before."""
    path = out / "data.yaml"
    names = dict(enumerate(conv.names))
    data: dict = {}
    if path.is_file():
        data = load_yaml(path, "data file")
        if data.get("converted_by") != CONVERTED_BY:
            raise UserError(f"{path} exists and was not written by utils.data.coco2yolo; move it away or choose another "
                            f"--out")
        old = data.get("names")
        if old is not None and {int(k): str(v) for k, v in dict(old).items()} != names:
            raise UserError(f"{path} has other class names than {json_path}; convert this JSON into another --out")
    data.update({"converted_by": CONVERTED_BY, "path": "."})
    role = split_role(conv.split)
    data[role] = list_name
    if role == "val" and conv.coco80:
        data["annotations"] = str(json_path.resolve())  # COCO ground truth for test.py --save-json
    if "val" not in data and role == "train":
        data["val"] = list_name  # until a val split is converted, validate on the training images
    if role == "val" and "train" not in data:
        data["train"] = list_name
    data["nc"] = len(conv.names)
    data["names"] = names
    ordered = {k: data[k] for k in ("converted_by", "path", "train", "val", "test", "annotations", "nc", "names")
               if k in data}
    text = yaml.safe_dump(ordered, sort_keys=False)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), fix=WRITE_FIX)
    return path


def run(json_file: str | Path, images: str | Path, out: str | Path, split: str | None = None) -> dict:
    """Convert one COCO JSON; returns the counts and paths written."""
    json_path, images, out = Path(json_file), Path(images), Path(out)
    split = split or images.name
    if not split or split in (".", "..") or "/" in split:
        raise UserError(f"cannot name a split after {images}; pass --split, e.g. --split train2017")
    data = load_coco_json(json_path)
    conv = convert(data, json_path, split)  # everything checked before anything is written
    if not images.is_dir():
        raise UserError(f"images folder {images} not found; pass the folder holding the JSON's images with --images")
    if not any((images / name).is_file() for name in conv.files):
        raise UserError(f"none of the {len(conv.files)} images named in {json_path} is in {images} "
                        f"(first: {conv.files[0] if conv.files else '-'}); pass the matching --images folder")
    make_folder(out)
    image_dir = link_images(images, out, split)
    lines, missing = write_labels(conv, out, image_dir)
    list_file = out / f"{split}.txt"
    text = "".join(f"{ln}\n" for ln in lines)
    atomic_write(list_file, lambda f: f.write(text.encode("utf-8")), fix=WRITE_FIX)
    yaml_path = write_data_yaml(conv, out, list_file.name, json_path)
    kept = set(ln.split("/", 3)[3] for ln in lines)
    n_boxes = sum(len(r) for n, r in conv.rows.items() if n in kept)
    classes = {c for n, r in conv.rows.items() if n in kept for c, *_ in r}
    backgrounds = sum(1 for n in kept if not conv.rows.get(n))
    summary = {"images": len(lines), "backgrounds": backgrounds, "boxes": n_boxes, "classes": len(classes),
               "crowd": conv.counts["crowd"], "clipped": conv.counts["clipped"], "empty": conv.counts["empty"],
               "missing": missing, "list": list_file, "yaml": yaml_path, "labels": out / "labels" / split}
    LOGGER.info(f"{split}: {len(lines)} images ({backgrounds} backgrounds), {n_boxes} boxes in {len(classes)} classes"
                f"{' (COCO 80-class order)' if conv.coco80 else f' ({len(conv.names)} categories, sorted id order)'}; "
                f"{conv.counts['crowd']} crowd annotations skipped")
    if conv.counts["clipped"] or conv.counts["empty"]:
        LOGGER.warning(f"warning: {json_path}: {conv.counts['clipped']} boxes reached outside their image and were "
                       f"clipped to it; {conv.counts['empty']} had no area left and were dropped")
    if missing:
        LOGGER.warning(f"warning: {missing} images named in {json_path} are not in {images}; left out of {list_file}")
    LOGGER.info(f"labels in {out / 'labels' / split}, image list {list_file}, data file {yaml_path} "
                f"(train with: python train.py --data {yaml_path})")
    return summary


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m utils.data.coco2yolo",
                                description="Convert COCO-format JSON annotations into YOLO label files.")
    p.add_argument("--json", required=True, help="COCO annotations, e.g. annotations/instances_train2017.json")
    p.add_argument("--images", required=True, help="folder of the JSON's images, e.g. images/train2017")
    p.add_argument("--out", required=True, help="dataset root: labels/<split>/, <split>.txt and data.yaml go here")
    p.add_argument("--split", default=None, help="split name (default: the --images folder's name)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    opt = parse_opt(argv)
    run(opt.json, opt.images, opt.out, opt.split)


if __name__ == "__main__":
    run_cli(main)
