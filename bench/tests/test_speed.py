"""bench/speed.py: each mode at its smallest setting on the CPU, and the loader's --repeat (the dataset of linked
copies the GPU check times the loop on) and --decode."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import speed
from utils.data.data_config import SHARED_COCO128, load_data_config
from utils.data.labels import img2label_paths, list_image_files
from utils.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_step_rows_per_candidate_and_cuda_only_ones_say_so(tmp_path, capsys):
    speed.main(["step", "--cfg", "yolov5n.yaml", "--imgsz", "64", "--batch", "2", "--steps", "1", "--candidates",
                "fp32", "fp16-graphs", "fp32-nchw", "--json", str(tmp_path / "s.json")])
    rows = json.loads((tmp_path / "s.json").read_text())
    assert [r["candidate"] for r in rows] == ["fp32", "fp16-graphs", "fp32-nchw"]
    assert rows[0]["img/s"] > 0 and rows[2]["img/s"] > 0 and rows[1]["skipped"] == "needs CUDA"
    assert "needs CUDA" in capsys.readouterr().out


@pytest.mark.slow
def test_loop_and_same_run_on_the_tiny_set(tiny_data, tmp_path):
    speed.main(["loop", "--data", str(tiny_data), "--imgsz", "64", "--batch-size", "8", "--epochs", "2", "--workers",
                "0", "--deterministic", "on", "off", "--json", str(tmp_path / "loop.json")])
    rows = json.loads((tmp_path / "loop.json").read_text())
    assert [r["deterministic"] for r in rows] == ["on", "off"]
    assert all(r["img/s"] > 0 and r["images_per_epoch"] == 24 and r["batches_per_epoch"] == 3 for r in rows)
    speed.main(["same-run", "--data", str(tiny_data), "--imgsz", "64", "--epochs", "1", "--workers", "0", "--json",
                str(tmp_path / "same.json")])
    assert json.loads((tmp_path / "same.json").read_text())["identical_weights"] is True


@pytest.mark.slow
def test_detect_and_its_forward_pass(tiny_data, tmp_path):
    source = load_data_config(tiny_data)["val"][0]
    speed.main(["detect", "--cfg", "yolov5n.yaml", "--source", str(source), "--imgsz", "64", "--precisions", "fp32",
                "--save-txt", "--project", str(tmp_path / "runs"), "--json", str(tmp_path / "d.json")])
    (row,) = json.loads((tmp_path / "d.json").read_text())
    assert row["images"] == 8 and row["img/s"] > 0 and {"pre-process ms", "inference ms", "NMS ms"} <= set(row)
    assert Path(row["save_dir"]) == tmp_path / "runs" / "fp32-b1"
    speed.main(["detect", "--cfg", "yolov5n.yaml", "--imgsz", "64", "--forward", "--precisions", "fp32", "fp16",
                "--batch-sizes", "1", "2", "--json", str(tmp_path / "f.json")])
    rows = json.loads((tmp_path / "f.json").read_text())
    assert [(r["precision"], r["batch"]) for r in rows] == [("fp32", 1), ("fp32", 2), ("fp16", 1), ("fp16", 2)]


@pytest.mark.slow
def test_export_against_pytorch(tiny_data, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    source = load_data_config(tiny_data)["val"][0]
    backends = ["pytorch", "onnxruntime"]  # openvino stays out of the suite's process (tests/test_openvino.py notes)
    speed.main(["export", "--cfg", "yolov5n.yaml", "--imgsz", "64", "--rounds", "1", "--source", str(source), "--out",
                str(tmp_path / "e.txt"), "--backends", *backends])
    text = (tmp_path / "e.txt").read_text()
    assert "CPU: " in text and "1 thread(s), 8 images:" in text
    rows = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln.split() and ln.split()[0] in backends}
    assert list(rows) == backends and rows["pytorch"][6:8] == ["1.00", "1.00"]  # x e2e, x infer against PyTorch
    assert all(float(r[1]) > 0 and float(r[6]) > 0 for r in rows.values())


def test_metrics_agree_with_pycocotools(capsys):
    pytest.importorskip("pycocotools")
    if not (SHARED_COCO128 / "annotations.json").is_file():
        pytest.skip("COCO128 not found")
    speed.main(["metrics", "--repeat", "1"])
    diff = capsys.readouterr().out.splitlines()[4].split()
    assert diff[0] == "difference" and abs(float(diff[1])) < 1e-6 and abs(float(diff[2])) < 1e-6


def test_loader_table(tiny_data, capsys):
    speed.main(["loader", "--data", str(tiny_data), "--imgsz", "64", "--workers", "0", "--cache", "ram", "--batches",
                "1", "--augment-on", "host", "device"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-3].split()[:5] == ["imgsz", "cache", "workers", "augment", "images/s"]
    host, device = (ln.split() for ln in lines[-2:])
    assert host[3] == "host" and host[5] == "-" and device[3] == "device" and float(device[5]) > 0


def test_repeat_links_distinct_copies_with_their_labels_and_keeps_them_when_run_again(tiny_data, tmp_path, capsys):
    out = tmp_path / "rep"
    for _ in range(2):  # the second run finds the links there and keeps them
        speed.main(["loader", "--repeat", "2", "--data", str(tiny_data), "--out", str(out)])
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


def test_loader_modes_exclude_each_other_and_repeat_needs_out(tiny_data):
    for argv in (["loader", "--decode", "--repeat", "2"], ["loader", "--repeat", "2", "--data", str(tiny_data)]):
        with pytest.raises(SystemExit) as e:
            speed.main(argv)
        assert e.value.code == 2


def test_decode_prints_and_writes_the_rates_the_gpu_check_reads(tiny_data, tmp_path, capsys):
    pytest.importorskip("torchvision")
    speed.main(["loader", "--decode", "--data", str(tiny_data), "--rounds", "1", "--json", str(tmp_path / "d.json")])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r == json.loads((tmp_path / "d.json").read_text())
    assert r["images"] == 24 and r["device"] == "cpu"
    assert r["cv2 img/s (1 core)"] > 0 and r["decode_jpeg img/s (cpu)"] > 0
    with pytest.raises(UserError, match="no JPEG"):
        speed.decode_rates([str(tmp_path / "a.png")], "cpu")
