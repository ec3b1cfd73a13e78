"""bench/loader.py's modes besides its throughput table: --repeat (a dataset of linked copies, which bench/gpu_check.sh
times the loop on), --decode (cv2 vs decode_jpeg, gpu_check's decode step) and --compare-paths (both --augment-on
paths on the same batches)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import loader
from utils.data.data_config import load_data_config
from utils.data.labels import img2label_paths, list_image_files
from utils.errors import UserError


def test_repeat_links_distinct_copies_with_their_labels_and_keeps_them_when_run_again(tiny_data, tmp_path, capsys):
    out = tmp_path / "rep"
    for _ in range(2):  # the second run finds the links there and keeps them
        loader.main(["--repeat", "2", "--data", str(tiny_data), "--out", str(out)])
        printed = Path(capsys.readouterr().out.strip())
        assert printed == out / "repeat.yaml"
    src, rep = load_data_config(tiny_data), load_data_config(printed)
    files, originals = list_image_files(rep["train"]), list_image_files(src["train"])
    assert len(files) == len(set(files)) == 2 * len(originals) == 48
    assert {os.path.realpath(f) for f in files} == {os.path.realpath(f) for f in originals}
    for f, lab in zip(files, img2label_paths(files)):  # each copy's label is its own image's
        k, name = Path(f).name.split("_", 1)
        assert k in ("k00", "k01") and Path(lab).is_symlink()
        assert Path(lab).read_text() == Path(img2label_paths([os.path.realpath(f)])[0]).read_text()
    assert rep["val"] == src["val"] and rep["names"] == src["names"]


def test_modes_exclude_each_other_and_repeat_needs_out(tiny_data):
    for argv in (["--decode", "--compare-paths"], ["--repeat", "2", "--data", str(tiny_data)]):
        with pytest.raises(SystemExit) as e:
            loader.main(argv)
        assert e.value.code == 2


def test_decode_prints_and_writes_the_rates_gpu_check_reads(tiny_data, tmp_path, capsys):
    pytest.importorskip("torchvision")
    loader.main(["--decode", "--data", str(tiny_data), "--rounds", "1", "--json", str(tmp_path / "d.json")])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r == json.loads((tmp_path / "d.json").read_text())
    assert r["images"] == 24 and r["device"] == "cpu"
    assert r["cv2 img/s (1 core)"] > 0 and r["decode_jpeg img/s (cpu)"] > 0
    with pytest.raises(UserError, match="no JPEG"):
        loader.decode_rates([str(tmp_path / "a.png")], "cpu")


def test_compare_paths_finds_the_same_boxes_and_nearly_the_same_pixels(tiny_data, capsys):
    train = load_data_config(tiny_data)["train"]
    rows = loader.compare_paths(train, 64, [0, 3], 2, 4, 1, "cpu")
    assert [(r["epoch"], r["batch"]) for r in rows] == [(0, 0), (0, 1), (3, 0), (3, 1)]
    for r in rows:
        assert r["boxes"] > 0 and r["same_boxes"] and r["box_diff"] < 1e-4, r
        assert r["mean_diff"] < 0.05 and r["differ"] < 0.01 and abs(r["host_mean"] - r["device_mean"]) < 0.1, r
    loader.main(["--compare-paths", "--data", str(tiny_data), "--imgsz", "64", "--epochs", "0", "--batches", "1",
                 "--batch-size", "4"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].split()[:3] == ["imgsz", "epoch", "batch"] and lines[-1].split()[:3] == ["64", "0", "0"]
