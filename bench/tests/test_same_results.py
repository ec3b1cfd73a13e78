"""bench/same_results.py: what it compares and how it reports a difference (its full run trains eight times in two
source trees, a maintainer's check run by hand)."""
from __future__ import annotations

import yaml
import pytest
import torch

from bench import same_results as sr


def test_a_checkpoint_is_compared_entry_by_entry_and_the_entry_that_differs_is_named():
    ckpt = {"model": {"w": torch.ones(2), "b": torch.zeros(1)}, "train": {"hyp": {"lr0": 0.01}, "rng": [1, 2]},
            "date": "today"}
    flat = sr.tensors(ckpt)
    assert set(flat) == {"model.w", "model.b", "train.hyp.lr0", "train.rng.0", "train.rng.1"}  # the date left out
    other = sr.tensors({**ckpt, "model": {"w": torch.ones(2), "b": torch.full((1,), 1e-9)}, "date": "tomorrow"})
    assert sr.differences(flat, other) == ["model.b"]
    assert sr.differences(flat, sr.tensors(ckpt)) == []
    half = sr.tensors({**ckpt, "model": {"w": torch.ones(2, dtype=torch.float16), "b": torch.zeros(1)}})
    assert sr.differences(flat, half) == ["model.w"]  # the same values in another dtype differ


def test_rows_and_label_files_differ_by_position_and_name():
    assert sr.differences([{"a": "1"}, {"a": "2"}], [{"a": "1"}, {"a": "3"}]) == ["item 1"]
    assert sr.differences([{"a": "1"}], [{"a": "1"}, {"a": "2"}]) == ["item 1"]
    assert sr.differences({"x.txt": "0 0.5"}, {"x.txt": "0 0.5", "y.txt": ""}) == ["y.txt"]


@pytest.mark.skipif(not sr.COCO128.is_dir(), reason="needs ../shared/datasets/coco128")
def test_the_subset_links_the_first_pictures_and_their_labels(tmp_path):
    data = sr.subset(tmp_path / "d", 5)
    cfg = yaml.safe_load(data.read_text())
    assert cfg["nc"] == 80 and len(cfg["names"]) == 80
    pictures = sorted((tmp_path / "d" / "images").iterdir())
    assert len(pictures) == 5 and all(p.is_symlink() and p.resolve().is_file() for p in pictures)
    assert {p.stem for p in (tmp_path / "d" / "labels").iterdir()} <= {p.stem for p in pictures}
