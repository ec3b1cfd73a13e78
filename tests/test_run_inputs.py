"""Inputs that used to pass without a sound (issue: runs that can be trusted): a folder given as weights, the
inference size of a checkpoint, an input size no machine can hold, a checkpoint whose weights are NaN."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

import detect
import train
import validator
from models.yolo import Model
from utils.engine.checkpoint import atomic_save, load_checkpoint, make_checkpoint
from utils.errors import UserError
from utils.files import REPO_ROOT
from utils.limits import MAX_IMGSZ, check_imgsz
from helpers import one_error


@pytest.fixture(scope="module")
def trained(micro, tmp_path_factory):
    """best.pt of a tiny run at 64 px (the size it records)."""
    out = train.run(data=str(micro), epochs=1, imgsz=64, batch_size=4, workers=0, noplots=True, amp="off",
                    project=str(tmp_path_factory.mktemp("runs")))
    return out.save_dir / "weights" / "best.pt"


def one_error_line(argv: list[str]) -> str:
    r = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    return one_error(r)


# ----------------------------------------------------------------------------------------- a folder as weights
def test_a_folder_named_like_a_checkpoint_is_called_a_folder(trained, micro, tmp_path):
    folder = tmp_path / "best.pt"
    folder.mkdir()
    (folder / "inner.pt").write_bytes(trained.read_bytes())
    with pytest.raises(UserError, match=r"best.pt is a folder, not a checkpoint file nor an OpenVINO model folder; pass a .pt file, e.g. .*inner.pt"):
        detect.run(weights=str(folder), source=str(micro.parent / "val.txt"), project=str(tmp_path / "d"))
    with pytest.raises(UserError, match="is a folder, not a file"):
        load_checkpoint(folder)
    line = one_error_line(["test.py", "--weights", str(folder), "--data", str(micro)])
    assert "is a folder" in line and "not found" not in line
    line = one_error_line(["train.py", "--resume", str(folder)])
    assert "is a folder" in line


# ----------------------------------------------------------------------------------------- the checkpoint's size
def test_checkpoints_record_their_training_size_and_inference_defaults_to_it(trained, micro, tmp_path, caplog):
    assert torch.load(trained, weights_only=True)["imgsz"] == 64
    image = micro.parent / "val.txt"  # the micro split's image list
    with caplog.at_level(logging.INFO):
        res = detect.detect(detect.DetectOptions(weights=trained, source=image, project=str(tmp_path / "d")))
        validator.run(data=str(micro), weights=str(trained), project=str(tmp_path / "v"), plots=False, workers=0)
    text = caplog.text
    assert res.shape[-1] <= 64 and max(res.shape[-2:]) == 64
    assert f"detect: {trained} at 64x64 px (the size best.pt was trained at; --imgsz to change)" in text
    assert f"evaluating {trained} at 64 px (the size best.pt was trained at; --imgsz to change)" in text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        res = detect.detect(detect.DetectOptions(weights=trained, source=image, imgsz=96, project=str(tmp_path / "d")))
    assert max(res.shape[-2:]) == 96 and "at 96x96 px (--imgsz)" in caplog.text


def test_a_checkpoint_without_a_size_runs_at_640(micro, tmp_path, caplog):
    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=2)
    path = tmp_path / "old.pt"
    atomic_save(make_checkpoint(model, model.yaml, ["a", "b"], epoch=0), path)  # as written before sizes were kept
    with caplog.at_level(logging.INFO):
        res = detect.detect(detect.DetectOptions(weights=path, source=micro.parent / "val.txt",
                                                 project=str(tmp_path / "d")))
    assert max(res.shape[-2:]) == 640 and "at 640x640 px (the default; --imgsz to change)" in caplog.text


# ----------------------------------------------------------------------------------------- sizes no machine holds
def test_an_impossible_imgsz_is_refused_in_one_line_before_anything_is_allocated(micro, tmp_path):
    line = one_error_line(["train.py", "--data", str(micro), "--imgsz", "100000", "--project", str(tmp_path)])
    assert "--imgsz 100000" in line and str(MAX_IMGSZ) in line
    assert not any(tmp_path.iterdir())  # refused before the run folder was made
    line = one_error_line(["train.py", "--data", str(micro), "--imgsz", "16384", "--project", str(tmp_path)])
    assert "needs at least" in line and "GiB" in line


def test_check_imgsz_against_the_memory_there_is():
    cpu = torch.device("cpu")
    check_imgsz((640, 640), 16, training=True, device=cpu, memory=8 << 30)  # 2.4 GiB at the least: fits in 8
    with pytest.raises(UserError, match=r"a training batch of 16 image\(s\) at 1280x1280 needs at least 9.8 GiB"):
        check_imgsz((1280, 1280), 16, training=True, device=cpu, memory=8 << 30)
    check_imgsz((1280, 1280), 16, training=False, device=cpu, memory=8 << 30)  # inference needs a quarter of that
    check_imgsz((8000, 8000), 1, training=True, device=cpu, memory=None)  # unknown memory: only the hard bound
    with pytest.raises(UserError, match="over the largest input size"):
        check_imgsz((64, MAX_IMGSZ + 32), 1, training=False, device=cpu, memory=None)


# ----------------------------------------------------------------------------------------- NaN weights
def test_a_checkpoint_with_nan_weights_is_refused_in_one_line(trained, micro, tmp_path):
    ckpt = torch.load(trained, weights_only=True)
    key = next(k for k, v in ckpt["model"].items() if v.is_floating_point() and v.numel() > 1)
    ckpt["model"][key][0] = float("nan")
    bad = tmp_path / "nan.pt"
    atomic_save(ckpt, bad)
    with pytest.raises(UserError, match=rf"not finite \(NaN or inf, in 1 tensors such as {key}\)"):
        load_checkpoint(bad)
    for argv in (["detect.py", "--weights", str(bad), "--source", str(micro.parent / "val.txt")],
                 ["test.py", "--weights", str(bad), "--data", str(micro)]):
        assert "not finite" in one_error_line(argv)
