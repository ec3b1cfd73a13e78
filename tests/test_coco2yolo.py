"""COCO JSON -> YOLO labels: COCO128 equality, custom category ids, crowd/background/clipping, bad input."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from utils.data.coco2yolo import run
from utils.data.data_config import COCO80_TO_91, COCO_NAMES, load_data_config
from utils.errors import UserError
from helpers import one_error

REPO = Path(__file__).resolve().parents[1]


def _images(folder: Path, names: list[str], size=(48, 64)) -> Path:
    import cv2

    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        cv2.imwrite(str(folder / n), np.full((*size, 3), 128, np.uint8))
    return folder


def _coco(tmp_path: Path, images, annotations, categories, name="ann.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return p


def _read(p: Path) -> np.ndarray:
    return np.loadtxt(p, ndmin=2) if p.is_file() and p.stat().st_size else np.zeros((0, 5))


def test_coco128_equals_its_own_labels(coco128_dir, tmp_path):
    summary = run(coco128_dir / "annotations.json", coco128_dir / "images" / "train2017", tmp_path / "coco")
    assert summary["images"] == 128 and summary["backgrounds"] == 2 and summary["boxes"] == 929
    ours_dir, theirs_dir = tmp_path / "coco" / "labels" / "train2017", coco128_dir / "labels" / "train2017"
    images = sorted((coco128_dir / "images" / "train2017").glob("*.jpg"))
    worst = 0.0
    for im in images:
        ours, theirs = _read(ours_dir / f"{im.stem}.txt"), _read(theirs_dir / f"{im.stem}.txt")
        assert len(ours) == len(theirs), im.name
        assert (ours_dir / f"{im.stem}.txt").is_file() == (theirs_dir / f"{im.stem}.txt").is_file(), im.name
        if len(ours):
            o, t = ours[np.lexsort(ours.T[::-1])], theirs[np.lexsort(theirs.T[::-1])]
            assert np.array_equal(o[:, 0], t[:, 0]), im.name
            worst = max(worst, float(np.abs(o[:, 1:] - t[:, 1:]).max()))
    assert worst <= 1e-6 + 1e-12, worst
    # the list names every image, relative to the dataset root, and the data file loads
    lines = (tmp_path / "coco" / "train2017.txt").read_text().splitlines()
    assert len(lines) == 128 and lines[0] == "./images/train2017/000000000009.jpg"
    cfg = load_data_config(tmp_path / "coco" / "data.yaml")
    assert cfg["names"] == list(COCO_NAMES) and cfg["coco91"]
    from utils.data.labels import img2label_paths, list_image_files

    files = list_image_files(cfg["train"])
    assert len(files) == 128 and Path(img2label_paths(files)[0]).is_file(), "the loader finds the labels"


def _coco_cats(ids):
    return [{"id": i, "name": COCO_NAMES[COCO80_TO_91.index(i)]} for i in ids]


def test_coco_ids_use_80_class_order_crowd_and_backgrounds(tmp_path):
    imgs = _images(tmp_path / "src" / "val2017", ["a.jpg", "b.jpg", "c.jpg"])
    images = [{"id": k, "file_name": n, "width": 64, "height": 48} for k, n in enumerate(["a.jpg", "b.jpg", "c.jpg"])]
    anns = [
        {"id": 1, "image_id": 0, "category_id": 90, "bbox": [8, 4, 16, 8], "iscrowd": 0},  # toothbrush -> 79
        {"id": 2, "image_id": 0, "category_id": 1, "bbox": [0, 0, 64, 48], "iscrowd": 0},  # person -> 0
        {"id": 3, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "iscrowd": 1},  # crowd: skipped
    ]
    js = _coco(tmp_path, images, anns, _coco_cats([1, 90]))
    out = tmp_path / "out"
    s = run(js, imgs, out)
    a = _read(out / "labels" / "val2017" / "a.txt")
    assert np.allclose(a, [[79, 0.25, 1 / 6, 0.25, 1 / 6], [0, 0.5, 0.5, 1.0, 1.0]], atol=1e-6)
    assert not (out / "labels" / "val2017" / "b.txt").exists(), "only crowd: a background"
    assert s["crowd"] == 1 and s["backgrounds"] == 2 and s["images"] == 3
    assert (out / "images" / "val2017").is_symlink()
    cfg = load_data_config(out / "data.yaml")
    assert cfg["nc"] == 80 and cfg["coco91"]
    assert cfg["annotations"] == js.resolve(), "a val split keeps its JSON for --save-json"


def test_custom_ids_sorted_order_and_names(tmp_path):
    imgs = _images(tmp_path / "images" / "train", ["x.png"])
    cats = [{"id": 7, "name": "zebra-ish"}, {"id": 0, "name": "background-thing"}, {"id": 3, "name": "cat"}]
    anns = [{"id": 1, "image_id": 5, "category_id": 7, "bbox": [0, 0, 32, 24]},
            {"id": 2, "image_id": 5, "category_id": 0, "bbox": [32, 24, 32, 24]},
            {"id": 3, "image_id": 5, "category_id": 3, "bbox": [16, 12, 32, 24]}]
    js = _coco(tmp_path, [{"id": 5, "file_name": "x.png", "width": 64, "height": 48}], anns, cats)
    run(js, imgs, tmp_path)  # --images already <out>/images/<split>: no link
    assert not (tmp_path / "images" / "train").is_symlink()
    lab = _read(tmp_path / "labels" / "train" / "x.txt")
    assert lab[:, 0].tolist() == [2, 0, 1]
    cfg = load_data_config(tmp_path / "data.yaml")
    assert cfg["names"] == ["background-thing", "cat", "zebra-ish"] and not cfg["coco91"]
    assert cfg["train"] == cfg["val"] == [tmp_path / "train.txt"]


def test_coco_ids_with_other_names_are_custom(tmp_path):
    imgs = _images(tmp_path / "src", ["x.jpg"])
    js = _coco(tmp_path, [{"id": 1, "file_name": "x.jpg", "width": 64, "height": 48}],
               [{"id": 1, "image_id": 1, "category_id": 2, "bbox": [0, 0, 8, 8]}],
               [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}])
    run(js, imgs, tmp_path / "out", split="train")
    assert _read(tmp_path / "out" / "labels" / "train" / "x.txt")[0, 0] == 1
    assert load_data_config(tmp_path / "out" / "data.yaml")["names"] == ["cat", "dog"]


def test_boxes_outside_are_clipped_and_counted(tmp_path, caplog):
    imgs = _images(tmp_path / "src" / "train", ["x.jpg"])
    anns = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [-10, -6, 42, 30]},  # clipped to 0,0,32,24
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [100, 100, 5, 5]},  # wholly outside: dropped
            {"id": 3, "image_id": 1, "category_id": 1, "bbox": [0, 0, 64, 48]}]
    js = _coco(tmp_path, [{"id": 1, "file_name": "x.jpg", "width": 64, "height": 48}], anns,
               [{"id": 1, "name": "thing"}])
    s = run(js, imgs, tmp_path / "out")
    assert s["clipped"] == 2 and s["empty"] == 1 and s["boxes"] == 2
    lab = _read(tmp_path / "out" / "labels" / "train" / "x.txt")
    assert np.allclose(lab[0], [0, 0.25, 0.25, 0.5, 0.5])
    assert (lab[:, 1:] >= 0).all() and (lab[:, 1:] <= 1).all()
    assert any("clipped" in r.getMessage() and "2 boxes" in r.getMessage() for r in caplog.records)


def test_second_split_joins_the_data_file(tmp_path):
    for split in ("train2017", "val2017"):
        imgs = _images(tmp_path / "images" / split, [f"{split}.jpg"])
        js = _coco(tmp_path, [{"id": 1, "file_name": f"{split}.jpg", "width": 64, "height": 48}],
                   [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 8, 8]}], _coco_cats([1]), f"{split}.json")
        run(js, imgs, tmp_path)
    cfg = load_data_config(tmp_path / "data.yaml")
    assert cfg["train"] == [tmp_path / "train2017.txt"] and cfg["val"] == [tmp_path / "val2017.txt"]


def test_rerun_turns_stale_labels_into_background(tmp_path):
    imgs = _images(tmp_path / "images" / "train", ["x.jpg"])
    stale = tmp_path / "labels" / "train" / "x.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("0 0.5 0.5 0.1 0.1\n")
    js = _coco(tmp_path, [{"id": 1, "file_name": "x.jpg", "width": 64, "height": 48}], [], [{"id": 1, "name": "a"}])
    run(js, imgs, tmp_path)
    assert stale.read_text() == ""


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "utils.data.coco2yolo", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_cli_malformed_json_one_line_nothing_lost(tmp_path):
    imgs = _images(tmp_path / "images" / "train", ["x.jpg"])
    good = _coco(tmp_path, [{"id": 1, "file_name": "x.jpg", "width": 64, "height": 48}],
                 [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 8, 8]}], [{"id": 1, "name": "a"}])
    assert _cli("--json", str(good), "--images", str(imgs), "--out", str(tmp_path)).returncode == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".txt", ".yaml")}
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [1, 2,')
    line = one_error(_cli("--json", str(bad), "--images", str(imgs), "--out", str(tmp_path)))
    assert str(bad) in line and "not valid JSON" in line and "line 1" in line
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".txt", ".yaml")}
    assert after == before, "a failed conversion leaves the earlier one as it was"


def test_cli_unknown_category_one_line(tmp_path):
    imgs = _images(tmp_path / "images" / "train", ["x.jpg"])
    js = _coco(tmp_path, [{"id": 1, "file_name": "x.jpg", "width": 64, "height": 48}],
               [{"id": 41, "image_id": 1, "category_id": 12, "bbox": [0, 0, 8, 8]}], _coco_cats([1, 2]))
    line = one_error(_cli("--json", str(js), "--images", str(imgs), "--out", str(tmp_path)))
    assert "annotation 41" in line and "category_id 12" in line and "x.jpg" in line and "categories" in line
    assert not (tmp_path / "labels").exists() and not (tmp_path / "data.yaml").exists()


@pytest.mark.parametrize("doc, expect", [
    ('[1, 2]', "top level is a list"),
    ('{"images": [], "annotations": []}', "no 'categories' list"),
    ('{"images": [{"id": 1, "file_name": "../x.jpg", "width": 1, "height": 1}], "categories": [{"id": 1}]}',
     "outside the images folder"),
    ('{"images": [{"id": 1, "file_name": "x.jpg"}], "categories": [{"id": 1}]}', "no positive width/height"),
    ('{"images": [{"id": 1, "file_name": "x.jpg", "width": 9, "height": 9}], "categories": [{"id": 1}], '
     '"annotations": [{"id": 5, "image_id": 2, "category_id": 1, "bbox": [0, 0, 1, 1]}]}', "image_id 2"),
    ('{"images": [{"id": 1, "file_name": "x.jpg", "width": 9, "height": 9}], "categories": [{"id": 1}], '
     '"annotations": [{"id": 5, "image_id": 1, "category_id": 1, "bbox": [0, 0, "w", 1]}]}', "not [x, y, width"),
])
def test_structural_errors(tmp_path, doc, expect):
    p = tmp_path / "a.json"
    p.write_text(doc)
    with pytest.raises(UserError, match=expect.replace("[", r"\[")):
        run(p, tmp_path, tmp_path / "out", split="train")


def test_missing_images_folder_and_wrong_folder(tmp_path):
    js = _coco(tmp_path, [{"id": 1, "file_name": "x.jpg", "width": 64, "height": 48}], [], [{"id": 1, "name": "a"}])
    with pytest.raises(UserError, match="images folder .* not found"):
        run(js, tmp_path / "nope", tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="none of the 1 images"):
        run(js, empty, tmp_path / "out")
    assert not (tmp_path / "out").exists(), "nothing written"


# ----------------------------------------------------------------------------------------- where --out cannot be written


def _convertible(tmp_path: Path) -> tuple[Path, Path]:
    """(JSON, images folder) that convert."""
    imgs = _images(tmp_path / "images" / "train", ["x.jpg"])
    js = _coco(tmp_path, [{"id": 1, "file_name": "x.jpg", "width": 64, "height": 48}],
               [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 8, 8]}], [{"id": 1, "name": "a"}])
    return js, imgs


def _cli_line(argv: list[str], capsys, monkeypatch) -> str:
    """The one error line of the CLI run in this process (exit 2, no traceback)."""
    from helpers import cli_in_process

    from utils.data.coco2yolo import main

    code, lines = cli_in_process(main, argv, capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, lines)
    return lines[0]


@pytest.mark.parametrize("where", ["a file", "under a file", "under /proc"])
def test_an_out_that_cannot_be_a_folder_is_one_line(tmp_path, where, capsys, monkeypatch):
    js, imgs = _convertible(tmp_path)
    (tmp_path / "f").write_text("x")
    out = {"a file": tmp_path / "f", "under a file": tmp_path / "f" / "data", "under /proc": Path("/proc/no/data")}[where]
    if where == "under /proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    line = _cli_line(["--json", str(js), "--images", str(imgs), "--out", str(out)], capsys, monkeypatch)
    assert "--out" in line


@pytest.fixture
def read_only_folder(tmp_path):
    """A read-only file system (tmpfs mounted ro); skipped where mounting is not allowed."""
    from helpers import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "ro", "ro,size=64k") as d:
        yield d


def test_an_out_on_a_read_only_file_system_is_one_line(tmp_path, read_only_folder, capsys, monkeypatch):
    js, imgs = _convertible(tmp_path)
    line = _cli_line(["--json", str(js), "--images", str(imgs), "--out", str(read_only_folder)], capsys, monkeypatch)
    assert "Read-only file system" in line and "--out" in line


def test_a_json_nested_100000_levels_deep_is_one_line(tmp_path, capsys, monkeypatch):
    js = tmp_path / "deep.json"
    js.write_text('{"images": ' + "[" * 100_000 + "]" * 100_000 + "}")
    line = _cli_line(["--json", str(js), "--images", str(tmp_path), "--out", str(tmp_path / "out")], capsys, monkeypatch)
    assert str(js) in line and "nested too deeply" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, shown", [(None, "null"), ({"x": 1}, "an object"), (["a"], "a list"), (True, "true"),
                                         ("  ", '"  "')])
def test_a_category_name_that_is_no_text_is_refused(tmp_path, name, shown):
    imgs = _images(tmp_path / "images" / "train", ["x.jpg"])
    js = _coco(tmp_path, [{"id": 1, "file_name": "x.jpg", "width": 64, "height": 48}], [],
               [{"id": 1, "name": "a"}, {"id": 7, "name": name}])
    with pytest.raises(UserError, match=f"{js}: category 7 has the name {re.escape(shown)}, not a text"):
        run(js, imgs, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_category_without_a_name_is_named_by_its_id(tmp_path):
    imgs = _images(tmp_path / "images" / "train", ["x.jpg"])
    js = _coco(tmp_path, [{"id": 1, "file_name": "x.jpg", "width": 64, "height": 48}], [], [{"id": 4}, {"id": 9, "name": 12}])
    run(js, imgs, tmp_path / "out")
    assert load_data_config(tmp_path / "out" / "data.yaml")["names"] == ["4", "12"]
