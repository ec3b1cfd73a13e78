"""The four commands' command lines: every flag explains itself, --help shows the defaults, and a wrong or
YOLOv5-only flag is one error line naming it (exit 2), not argparse's usage block."""
from __future__ import annotations

import dataclasses
import test as test_py

import pytest
from helpers import cli_in_process

import detect
import export
import train
import validator
from utils.engine.train_options import TrainOptions
from utils.options import build_parser

OPTIONS = {"train": TrainOptions, "test": validator.EvalOptions, "detect": detect.DetectOptions,
           "export": export.ExportOptions}
MAINS = {"train": train.main, "test": test_py.main, "detect": detect.main, "export": export.main}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_flag_has_help_and_help_shows_defaults(name):
    cls = OPTIONS[name]
    missing = [f.name for f in dataclasses.fields(cls) if f.metadata.get("cli", True) and not f.metadata.get("help")]
    assert missing == [], f"{name}.py flags without help: {missing}"
    text = build_parser(cls, "x").format_help()
    assert "(default: " in text or "default:" in text


def test_help_states_a_default_once():
    text = " ".join(build_parser(TrainOptions, "x").format_help().split())
    assert "--workers WORKERS max dataloader workers per process (default: 8)" in text
    assert "(default: the built-in shapes dataset)" in text and "shapes dataset) (default" not in text


@pytest.mark.parametrize("name, argv, words", [
    ("train", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("train", ["--epochs", "many"], "--epochs: invalid int value: 'many'"),
    ("test", ["--dnn"], "--dnn is a YOLOv5 option this project does not have"),
    ("detect", ["--visualize"], "--visualize is a YOLOv5 option this project does not have"),
    ("export", ["--keras"], "--keras is a YOLOv5 option this project does not have"),
])
def test_a_wrong_or_yolov5_only_flag_is_one_line(name, argv, words, capsys, monkeypatch):
    code, lines = cli_in_process(MAINS[name], argv, capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and words in lines[0] and "--help" in lines[0], lines


def test_yolov5_only_training_flags_are_one_line(capsys, monkeypatch):
    code, lines = cli_in_process(train.main, ["--quad"], capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and "--quad is a YOLOv5 option this project does not have" in lines[0]
