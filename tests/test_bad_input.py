"""A user's mistake in an option or a file's value is one line, never a traceback: options of the wrong type or out of
range (from the command line or from Python), data YAML values of the wrong kind, a folder given as --data, an
image size no machine can hold; a batch larger than the dataset is cut to it with one line."""
from __future__ import annotations

import logging
import test as test_cli

import numpy as np
import pytest
import torch
import yaml
from helpers import cli_in_process, log_lines as _lines, one_error, one_error_line

import train
from utils.errors import UserError
from utils.limits import MAX_IMGSZ, check_imgsz
from utils.options import to_argv

ARGS = dict(imgsz=64, batch_size=8, workers=0, noplots=True, amp="bf16", seed=3)
TINY = dict(imgsz=64, batch_size=4, workers=0, noplots=True, amp="off", seed=0)


# ----------------------------------------------------------------------------------------- data YAML values

@pytest.mark.parametrize("text, words", [
    ("names: {0: a, b: c}\n", "keys must be the class indices"),
    ("names: [[a, b], c]\n", "plain text"),
    ("names: [a]\ndefaults: {epochs: abc}\n", "defaults.epochs"),
    ("names: [a]\npath: \"a\\0b\"\n", "cannot be used"),
    ("names: [a]\npath: " + "x" * 5000 + "\n", "cannot be used"),
])
def test_data_yaml_values_of_the_wrong_kind_are_one_line(tmp_path, text, words):
    from utils.data.data_config import load_data_config

    f = tmp_path / "d.yaml"
    f.write_text("train: .\nval: .\n" + text)
    with pytest.raises(UserError, match=words) as e:
        load_data_config(f)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------- sizes no machine holds

@pytest.mark.slow
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


# ----------------------------------------------------------------------------------------- numbers out of range
# (one CPU thread from here on; module-scoped, so every test below does too; bad_files: tests/conftest.py)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("args", ["--batch-size 0", "--epochs 0", "--imgsz -64", "--workers -1", "--freeze 99",
                                  "--label-smoothing 5", "--patience -1"])
def test_train_refuses_bad_numbers_with_one_line(args, micro, tmp_path, capsys, monkeypatch):
    argv = ["--data", str(micro), "--project", str(tmp_path), *to_argv({**ARGS, "epochs": 1}), *args.split()]
    one_error(cli_in_process(train.main, argv, capsys, monkeypatch), args.split()[0])


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("args", ["--batch-size 0", "--imgsz 0", "--conf-thres 2", "--iou-thres -1", "--max-det 0"])
def test_test_refuses_bad_numbers_with_one_line(args, bad_files, micro, tmp_path, capsys, monkeypatch):
    argv = ["--weights", str(bad_files["good.pt"]), "--data", str(micro), "--workers", "0", "--project", str(tmp_path),
            *args.split()]
    one_error(cli_in_process(test_cli.main, argv, capsys, monkeypatch), args.split()[0])


# ----------------------------------------------------------------------------------------- the texts of mistakes


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("options, text", [
    (dict(batch_size=4.5), "batch_size='4.5' must be a whole number (the command line's --batch-size)"),
    (dict(epochs="three"), "epochs='three' must be a whole number (the command line's --epochs)"),
    (dict(imgsz=[64, 64]), "imgsz=[64, 64]: training takes one size, the side of its square batches, e.g. imgsz=64"),
    (dict(freeze=10), "freeze='10' must be a list of whole numbers (the command line's --freeze)"),
], ids=["batch_size", "epochs", "imgsz", "freeze"])
def test_options_of_the_wrong_type_from_python_are_one_line(options, text, micro, tmp_path, capsys, monkeypatch):
    """(A pathlib.Path or a NumPy number is taken as the command line's text or number.)"""
    code, lines = cli_in_process(lambda argv: train.run(data=micro, project=tmp_path, seed=np.int64(0), **options), [],
                                 capsys, monkeypatch)
    assert code == 2 and lines == [f"error: {text}"]
    assert not any(tmp_path.iterdir())


@pytest.mark.usefixtures("one_thread")
def test_a_size_given_as_text_is_one_line():
    from models.api import create

    detector = create("yolov5n.yaml", 2, "cpu")
    with pytest.raises(UserError, match=r"^size='320' must be a number of pixels or \(height, width\)"):
        detector(torch.zeros(3, 64, 64), size="320")


@pytest.mark.usefixtures("one_thread")
def test_data_given_as_a_folder_says_so(micro, tmp_path, capsys, monkeypatch):
    code, lines = cli_in_process(train.main, ["--data", str(micro.parent)], capsys, monkeypatch)
    assert code == 2 and lines == [f"error: --data {micro.parent} is a folder, not a dataset YAML; pass the YAML that "
                                   f"describes it, e.g. {micro}"]


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_batch_larger_than_the_dataset_is_cut_to_it(micro, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        out = train.run(data=str(micro), project=str(tmp_path), epochs=1, **{**TINY, "batch_size": 100_000})
    assert "--batch-size 100000 is more than the 8 training images; training at batch 8, the whole set in each step" \
        in _lines(caplog)
    assert yaml.safe_load((out.save_dir / "opt.yaml").read_text())["batch_size"] == 8
