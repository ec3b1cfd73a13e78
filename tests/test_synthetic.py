"""The built-in shapes dataset: deterministic, labels match the drawing, installed atomically."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from utils.data import synthetic
from utils.data.data_config import load_data_config
from utils.data.labels import parse_label_file
from utils.data.synthetic import CLASSES, ensure_shapes_dataset, generate_shapes, render_image, sample_images


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("AMPYOLO_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generation_is_byte_identical(tmp_path):
    generate_shapes(tmp_path / "a", n_train=6, n_val=2)
    generate_shapes(tmp_path / "b", n_train=6, n_val=2)
    a, b = files_of(tmp_path / "a"), files_of(tmp_path / "b")
    assert len(a) == 16 and a == b
    generate_shapes(tmp_path / "c", n_train=6, n_val=2, seed=1)
    assert files_of(tmp_path / "c") != a


def test_labels_match_drawn_objects():
    n_objects = 0
    for i in range(40):
        im, labels, masks = render_image(np.random.default_rng([7, i]))
        h, w = im.shape[:2]
        assert 1 <= len(labels) <= 6 and len(masks) == len(labels) and 200 <= min(h, w)
        for (cls, cx, cy, bw, bh), mask in zip(labels, masks):
            ys, xs = np.nonzero(mask)
            drawn = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], float)
            box = np.array([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2]) * [w, h, w, h]
            assert np.abs(drawn - box).max() <= 1.0, (CLASSES[int(cls)], drawn, box)
            assert 20 <= max(box[2] - box[0], box[3] - box[1]) <= 112 and 0 <= cls < len(CLASSES)
            n_objects += 1
    assert n_objects > 80


def test_saved_labels_are_the_rendered_ones(tmp_path):
    generate_shapes(tmp_path, n_train=3, n_val=1)
    for i in range(3):
        _, labels, _ = render_image(np.random.default_rng([synthetic.SEED, 0, i]))
        saved, dups, _ = parse_label_file(str(tmp_path / "labels" / "train" / f"train_{i:05d}.txt"), len(CLASSES))
        assert dups == 0
        np.testing.assert_allclose(saved, labels, atol=1e-6)


def test_interrupted_generation_leaves_nothing(home, monkeypatch):
    def boom(dest, *a, **k):
        (dest / "images").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic, "generate_shapes", boom)
    with pytest.raises(KeyboardInterrupt):
        ensure_shapes_dataset(n_train=2, n_val=1)
    assert list(home.iterdir()) == []


def test_ensure_reuses_and_regenerates_outdated(tmp_path):
    root = ensure_shapes_dataset(tmp_path / "s", n_train=3, n_val=2)
    marker = (root / "VERSION").stat().st_mtime_ns
    assert ensure_shapes_dataset(tmp_path / "s", n_train=3, n_val=2) == root
    assert (root / "VERSION").stat().st_mtime_ns == marker  # reused, not regenerated
    (root / "VERSION").write_text("old\n")
    ensure_shapes_dataset(tmp_path / "s", n_train=3, n_val=2)
    assert (root / "VERSION").read_text().startswith(synthetic.GENERATOR_VERSION)
    assert len(list((root / "images" / "train").glob("*.jpg"))) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no temp folders left


@pytest.mark.slow
def test_full_dataset_from_yaml_is_fast(home):
    t0 = time.perf_counter()
    cfg = load_data_config("shapes")
    elapsed = time.perf_counter() - t0
    assert elapsed < 20, f"generation took {elapsed:.1f}s"
    root = home / "shapes"
    assert cfg["path"] == root and cfg["names"] == list(CLASSES) and cfg["nc"] == len(CLASSES)
    assert cfg["train"] == [root / "images" / "train"] and cfg["val"] == [root / "images" / "val"]
    assert cfg["defaults"]["imgsz"] % 32 == 0 and cfg["defaults"]["epochs"] > 0
    assert len(list((root / "images" / "train").glob("*.jpg"))) == 400
    assert len(list((root / "labels" / "val").glob("*.txt"))) == 100
    pics = sample_images(home / "samples", n=3)
    assert [p.name for p in pics] == ["val_00000.jpg", "val_00001.jpg", "val_00002.jpg"]
    assert all(p.is_file() for p in pics)
