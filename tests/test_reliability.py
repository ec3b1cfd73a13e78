"""Reliability, round 2 (issue 17): a real full disk, decompression bombs, YAML alias bombs, oversized models,
malformed checkpoints, overwritten detect outputs, odd sources, resume paths, temp names and run-folder locks.

Every failure here is one UserError line (exit 2 through run_cli), nothing is lost and nothing hangs.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from helpers import cli_in_process, one_error

import train
from utils.engine import checkpoint as ck
from utils.errors import UserError

REPO = Path(__file__).resolve().parents[1]



# ----------------------------------------------------------------------------------------- 1. a full disk

ZIP_WRITER_ENOSPC = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


def test_zip_writer_runtime_error_is_one_line_and_keeps_the_previous_file(tmp_path, monkeypatch):
    """What torch.save raises at close when the disk fills (it hides the OSError behind a RuntimeError)."""
    path = tmp_path / "last.pt"
    ck.atomic_save({"n": 1}, path)

    def full(obj, f):
        f.write(b"PK\x03\x04 partial")
        raise RuntimeError(ZIP_WRITER_ENOSPC)

    monkeypatch.setattr(ck.torch, "save", full)
    with pytest.raises(UserError, match="could not write .*disk is full.*previous file is kept") as e:
        ck.atomic_save({"n": 2}, path)
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"n": 1} and os.listdir(tmp_path) == ["last.pt"]


def test_any_error_inside_a_write_is_one_line(tmp_path):
    from utils.files import atomic_write

    def broken(f):
        raise ValueError("something odd\nover two lines")

    with pytest.raises(UserError, match="could not write .*something odd over two lines") as e:
        atomic_write(tmp_path / "x.txt", broken)
    assert "\n" not in str(e.value) and os.listdir(tmp_path) == []


@pytest.fixture
def small_disk(tmp_path):
    """A real 12 MB filesystem (tmpfs); skipped where mounting is not allowed (not root, no CAP_SYS_ADMIN)."""
    from helpers import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "disk", "size=12m") as d:
        yield d


def test_a_real_full_disk_keeps_the_previous_checkpoint(small_disk):
    path = small_disk / "last.pt"
    ck.atomic_save({"n": torch.ones(3)}, path)
    before = path.read_bytes()
    with pytest.raises(UserError, match="could not write .*previous file is kept") as e:
        ck.atomic_save({"big": torch.zeros(4_000_000)}, path)  # 16 MB on a 12 MB disk
    assert "\n" not in str(e.value)
    assert path.read_bytes() == before and os.listdir(small_disk) == ["last.pt"]


def test_training_onto_a_real_full_disk_exits_2_with_one_line(small_disk, tiny_data, capsys, monkeypatch):
    """yolov5n's training last.pt (~27 MB) does not fit on 12 MB: the first checkpoint write fails."""
    argv = ["--data", str(tiny_data), "--project", str(small_disk), "--epochs", "1", "--imgsz", "64",
            "--batch-size", "8", "--workers", "0", "--noplots", "--amp", "off"]
    code, lines = cli_in_process(train.main, argv, capsys, monkeypatch)
    one_error((code, lines), "could not write", "previous file is kept")
    weights = small_disk / "exp" / "weights"
    assert not any(p.name.endswith(".tmp") for p in weights.iterdir())


# ----------------------------------------------------------------------------------------- unique temp names


def test_opt_hyp_and_results_use_unique_temp_names_through_one_writer(tmp_path, monkeypatch):
    from utils.files import save_yaml
    from utils.report.results import truncate_after

    other = tmp_path / ".opt.yaml.tmp"  # the fixed name an older or a concurrent writer may be using
    other.write_text("in flight")
    real, temps = os.replace, []

    def spy(src, dst):
        temps.append(Path(src).name)
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    save_yaml({"a": 1}, tmp_path / "opt.yaml")
    save_yaml({"a": 2}, tmp_path / "opt.yaml")
    (tmp_path / "results.csv").write_text("epoch,x\n0,1\n1,2\n2,3\n")
    truncate_after(tmp_path / "results.csv", 0)
    assert other.read_text() == "in flight"  # never touched
    assert len(set(temps)) == 3 and all(t.startswith((".opt.yaml.", ".results.csv.")) for t in temps), temps
    assert (tmp_path / "results.csv").read_text().splitlines() == ["epoch,x", "0,1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".opt.yaml.tmp", "opt.yaml", "results.csv"]


# ----------------------------------------------------------------------------------------- 3. YAML alias bombs

def _alias_bomb(key: str, levels: int = 12, fan: int = 9, merge: bool = False) -> str:
    """Nine-way aliases twelve levels deep: a few hundred bytes that stand for 9**12 values."""
    lines = ["b0: &b0 [x]" if not merge else "b0: &b0 {k: 1}"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*b{i - 1}"] * fan)
        lines.append(f"b{i}: &b{i} " + ("{<<: [" + refs + "]}" if merge else f"[{refs}]"))
    return "\n".join(lines) + f"\n{key}: *b{levels}\n"


@pytest.mark.parametrize("where", ["names", "train", "merge"])
def test_alias_bomb_in_a_data_yaml_is_refused_in_one_line_at_once(where, tiny_data, tmp_path, capsys, monkeypatch):
    import time

    base = tiny_data.read_text()
    text = (base.replace("names:", "old_names:") + _alias_bomb("names")) if where == "names" else \
        (base.replace("train:", "old_train:") + _alias_bomb("train")) if where == "train" else \
        (base + _alias_bomb("extra", merge=True))
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(text)
    t0 = time.time()
    code, lines = cli_in_process(train.main, ["--data", str(bomb), "--project", str(tmp_path / "runs")], capsys, monkeypatch)
    one_error((code, lines), str(bomb), "expands to more than")
    assert time.time() - t0 < 10


def test_alias_bomb_in_hyp_and_model_yaml_and_a_recursive_alias(tiny_data, tmp_path, capsys, monkeypatch):
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text((REPO / "data" / "hyps" / "hyp.scratch.yaml").read_text() + _alias_bomb("extra"))
    cfg = tmp_path / "model.yaml"
    cfg.write_text((REPO / "models" / "yolov5n.yaml").read_text() + _alias_bomb("extra"))
    loop = tmp_path / "loop.yaml"
    loop.write_text((REPO / "data" / "hyps" / "hyp.scratch.yaml").read_text() + "x: &a [1, *a]\n")
    common = ["--data", str(tiny_data), "--project", str(tmp_path / "runs")]
    for flag, path, words in (("--hyp", hyp, "expands to more than"), ("--cfg", cfg, "expands to more than"),
                              ("--hyp", loop, "contains itself")):
        code, lines = cli_in_process(train.main, [*common, flag, str(path)], capsys, monkeypatch)
        one_error((code, lines), str(path), words)


def test_plain_aliases_and_merge_keys_still_load(tmp_path):
    from utils.files import load_yaml

    f = tmp_path / "ok.yaml"
    f.write_text("base: &b {lr0: 0.01, lrf: 0.1}\nrun: {<<: *b, lrf: 0.2}\nlist: &l [1, 2]\nagain: *l\n")
    assert load_yaml(f) == {"base": {"lr0": 0.01, "lrf": 0.1}, "run": {"lr0": 0.01, "lrf": 0.2},
                            "list": [1, 2], "again": [1, 2]}


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


@pytest.mark.parametrize("edit, words", [({"lrf": "abc"}, "lrf must be a number"), ({"anchor_t": None}, "anchor_t"),
                                         ({"scale": 5.0}, "scale must be a number"), ({"mosaic": float("nan")}, "mosaic"),
                                         ({"lr0": True}, "lr0")])
def test_hyp_values_are_checked_in_one_line(tmp_path, edit, words):
    import yaml

    from utils.hyp import load_hyp

    hyp = yaml.safe_load((REPO / "data" / "hyps" / "hyp.scratch.yaml").read_text())
    f = tmp_path / "hyp.yaml"
    f.write_text(yaml.safe_dump({**hyp, **edit}))
    with pytest.raises(UserError, match=words) as e:
        load_hyp(f)
    assert "\n" not in str(e.value)
    missing = {k: v for k, v in hyp.items() if k != "lr0"}
    f.write_text(yaml.safe_dump(missing))
    with pytest.raises(UserError, match="missing 'lr0'"):
        load_hyp(f)


# ----------------------------------------------------------------------------------------- 4. model size limits

def _nano_dict() -> dict:
    import yaml

    return yaml.safe_load((REPO / "models" / "yolov5n.yaml").read_text())


def _edit_row(d: dict, i: int, row: list) -> dict:
    d["backbone"][i] = row
    return d


OVERSIZED = {
    "depth": (lambda d: {**d, "depth_multiple": 1e7}, "depth_multiple must be a number above 0 and at most 10"),
    "depth_inf": (lambda d: {**d, "depth_multiple": float("inf")}, "depth_multiple"),
    "width": (lambda d: {**d, "width_multiple": 1e4}, "width_multiple"),
    "width_nan": (lambda d: {**d, "width_multiple": float("nan")}, "width_multiple"),
    "nc": (lambda d: {**d, "nc": 10**9}, "nc must be a whole number from 1 to"),
    "ch": (lambda d: {**d, "ch": 10**6}, r"ch \(input channels\)"),
    "channels": (lambda d: _edit_row(d, 1, [-1, 1, "Conv", [10**7, 3, 2]]), "output channels x width_multiple"),
    "repeats": (lambda d: _edit_row(d, 2, [-1, 10**6, "C3", [128]]), "repeats"),
    "layers": (lambda d: {**d, "backbone": d["backbone"] + [[-1, 1, "Conv", [64, 1, 1]]] * 5000}, "layers; at most"),
    "blocks": (lambda d: {**d, "backbone": d["backbone"][:8] + [[-1, 90, "Bottleneck", [16]]] * 100 + d["backbone"][8:]},
               "blocks in all"),
    "upsample": (lambda d: _edit_row(d, 1, [-1, 1, "nn.Upsample", ["None", 10000, "nearest"]]), "grow too large"),
    "padding": (lambda d: _edit_row(d, 1, [-1, 1, "Conv", [32, 3, 2, 100000]]), "grow too large"),
    "kernel": (lambda d: _edit_row(d, 1, [-1, 1, "Conv", [4096, 1023, 2]]), "parameters; at most"),  # maps as with k=3
}


@pytest.mark.parametrize("case", sorted(OVERSIZED))
def test_oversized_model_yaml_is_refused_before_anything_is_built(case, tmp_path, monkeypatch):
    import time

    import yaml

    from models.yolo import Model

    edit, words = OVERSIZED[case]
    cfg = tmp_path / "big.yaml"
    cfg.write_text(yaml.safe_dump(edit(_nano_dict())))
    built = []
    monkeypatch.setattr(torch.nn.Conv2d, "reset_parameters", lambda self: built.append(self))  # real init = built
    t0 = time.time()
    with pytest.raises(UserError, match=words) as e:
        Model(cfg)
    assert "\n" not in str(e.value) and time.time() - t0 < 60  # no hang; "nothing built" is the check below
    assert not [c for c in built if c.weight.device.type != "meta"]  # no real layer was made


def test_oversized_model_inside_a_checkpoint_is_one_line(tmp_path, capsys, monkeypatch):
    import detect
    from models.yolo import Model

    model = Model("yolov5n.yaml", nc=2)
    ckpt = ck.make_checkpoint(model, {**model.yaml, "depth_multiple": 1e7}, ["a", "b"], 0)
    path = tmp_path / "big.pt"
    ck.atomic_save(ckpt, path)
    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    code, lines = cli_in_process(detect.main, ["--weights", str(path), "--source", str(image)], capsys, monkeypatch)
    one_error((code, lines), "depth_multiple")


def test_a_concat_of_unequal_maps_is_one_line_not_a_traceback(tmp_path):
    import yaml

    from models.yolo import Model

    d = _nano_dict()
    d["head"][2] = [[-1, 0], 1, "Concat", [1]]  # layer 12 joins the upsampled P4 map with the stem's P1 map
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(d))
    with pytest.raises(UserError, match="Concat of maps of different sizes"):
        Model(cfg)


# ----------------------------------------------------------------------------------------- 5. malformed checkpoints

TINY_RUN = dict(epochs=1, imgsz=64, batch_size=8, workers=0, noplots=True, amp="off", noval=True, seed=1)


@pytest.fixture(scope="module")
def training_last(tiny_data, tmp_path_factory) -> dict:
    """A last.pt as a run leaves it mid-training (with its 'train' part): one epoch, finish() skipped."""
    project = tmp_path_factory.mktemp("runs")
    real = train.finish
    train.finish = lambda t: None
    try:
        out = train.run(data=str(tiny_data), project=str(project), **TINY_RUN)
    finally:
        train.finish = real
    return torch.load(out.save_dir / "weights" / "last.pt", map_location="cpu", weights_only=True)


def _write_last(ckpt: dict, folder: Path) -> Path:
    path = folder / "run" / "weights" / "last.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, path)
    return path


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


MALFORMED = {
    "nc missing": (lambda c: _without(c, "nc"), "'nc' must be"),
    "model as a list": (lambda c: {**c, "model": list(c["model"].values())}, "'model' must be a non-empty dict"),
    "train as a string": (lambda c: {**c, "train": "resume me"}, "'train' must be a mapping"),
    "names too short": (lambda c: {**c, "names": c["names"][:1]}, "'names' has 1 entries"),
    "names of numbers": (lambda c: {**c, "names": list(range(c["nc"]))}, "'names' must be"),
    "metrics of text": (lambda c: {**c, "metrics": {"mAP": "high"}}, "'metrics' must be"),
    "newer version": (lambda c: {**c, "version": 99}, "newer than this code"),
    "ema of another model": (lambda c: {**c, "train": {**c["train"], "ema": {**c["train"]["ema"], "ema": {
        k: torch.zeros(1) for k in c["model"]}}}}, "'train.ema.ema' does not hold the same tensors"),
    "optimizer as a list": (lambda c: {**c, "train": {**c["train"], "optimizer": []}}, "'train.optimizer' must be"),
    "rng cut": (lambda c: {**c, "train": {**c["train"], "rng": {**c["train"]["rng"], "python": [1, 2]}}}, "'train.rng'"),
    "train.opt as text": (lambda c: {**c, "train": {**c["train"], "opt": "fast"}}, "'train.opt' must be a mapping"),
    "epoch as text": (lambda c: {**c, "train": {**c["train"], "completed_epoch": "3"}}, "'train.completed_epoch'"),
    "shared-list bomb": (lambda c: {**c, "metrics": {}, "yaml": {**c["yaml"], "x": _shared_bomb()}}, "expands to more than"),
}


def _shared_bomb() -> list:
    x: list = ["x"]
    for _ in range(20):
        x = [x, x, x]  # pickle's memo keeps these shared: 3**20 values once expanded
    return x


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_checkpoint_with_the_marker_is_one_line(case, training_last, tmp_path, capsys, monkeypatch):
    import detect

    edit, words = MALFORMED[case]
    path = _write_last(edit(training_last), tmp_path)
    with pytest.raises(UserError, match=words) as e:
        ck.load_checkpoint(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    for main, argv in ((train.main, ["--resume", str(path)]), (detect.main, ["--weights", str(path), "--source", str(image)])):
        one_error(cli_in_process(main, argv, capsys, monkeypatch), words.strip("'").split("'")[0])


@pytest.mark.parametrize("opt, words", [({}, "lack data"),
                                        ({"epochs": "ten"}, "epochs='ten'"), ({"amp": "fp64"}, "amp='fp64'"),
                                        ({"freeze": "all"}, "freeze='all'")])
def test_resume_refuses_saved_options_it_cannot_use(opt, words, training_last, tmp_path, capsys, monkeypatch):
    saved = training_last["train"]["opt"]
    opt = {**saved, **opt} if opt else opt
    path = _write_last({**training_last, "train": {**training_last["train"], "opt": opt}}, tmp_path)
    ck.load_checkpoint(path)  # the schema allows any mapping; the resume rules are train.py's
    one_error(cli_in_process(train.main, ["--resume", str(path)], capsys, monkeypatch), "--resume", words)


def test_resume_writes_into_the_folder_holding_last_pt_not_a_saved_save_dir(training_last, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    opt = {**training_last["train"]["opt"], "save_dir": str(elsewhere), "project": str(elsewhere), "name": "x"}
    path = _write_last({**training_last, "train": {**training_last["train"], "opt": opt}}, tmp_path)
    out = train.run(resume=str(path), workers=0)  # its one epoch is done: the resume only finishes the run
    assert out.save_dir == path.parent.parent and not elsewhere.exists()
    assert (path.parent.parent / "opt.yaml").is_file() and "train" not in ck.load_checkpoint(path)


def test_resume_of_a_last_pt_outside_a_weights_folder_is_one_line(training_last, tmp_path, capsys, monkeypatch):
    path = tmp_path / "last.pt"
    torch.save(training_last, path)
    one_error(cli_in_process(train.main, ["--resume", str(path)], capsys, monkeypatch), "<run folder>/weights/")


# ----------------------------------------------------------------------------------------- 2. image bombs, odd images and labels

def _png_header_only(w: int, h: int) -> bytes:
    """A PNG that declares w x h pixels: a valid IHDR, one tiny IDAT, IEND. Never decoded here."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def _split(root: Path, n: int = 3) -> list[Path]:
    rng = np.random.default_rng(0)
    (root / "images" / "train").mkdir(parents=True, exist_ok=True)
    (root / "labels" / "train").mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(n):
        im = cv2.GaussianBlur((rng.random((48, 64, 3)) * 255).astype(np.uint8), (5, 5), 2)
        f = root / "images" / "train" / f"im{k}.jpg"
        cv2.imwrite(str(f), im)
        (root / "labels" / "train" / f"im{k}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
        out.append(f)
    return out


def _verify(root: Path, caplog) -> tuple[list[str], list[str]]:
    """(kept image names, warning lines) of verifying root/images/train."""
    import logging

    from utils.data.datasets import create_dataloader

    caplog.clear()
    with caplog.at_level(logging.INFO):
        _, ds = create_dataloader(root / "images" / "train", 64, 2, 32, workers=0, nc=2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    return sorted(Path(f).name for f in ds.im_files), warnings


def test_decompression_bomb_is_left_out_from_its_header_without_decoding(tmp_path, caplog, monkeypatch):
    from utils.data import datasets

    _split(tmp_path)
    bomb = tmp_path / "images" / "train" / "bomb.png"
    bomb.write_bytes(_png_header_only(30000, 30000))  # 900 MP declared in 100 bytes
    real, decoded = cv2.imdecode, []

    def watch(buf, flags):
        decoded.append(len(buf))
        return real(buf, flags)

    monkeypatch.setattr(datasets.cv2, "imdecode", watch)
    kept, warnings = _verify(tmp_path, caplog)
    assert kept == ["im0.jpg", "im1.jpg", "im2.jpg"]
    lines = [w for w in warnings if "bomb.png" in w]
    assert len(lines) == 1 and "30000x30000" in lines[0] and "AMPYOLO_MAX_PIXELS" in lines[0] and "left out" in lines[0]
    assert len(bomb.read_bytes()) not in decoded  # refused before any decoder saw it


def test_pixel_limit_is_configurable(tmp_path, caplog, monkeypatch):
    from utils.data.images import load_image_file

    f = _split(tmp_path, n=1)[0]
    monkeypatch.setenv("AMPYOLO_MAX_PIXELS", "1000")  # the 64x48 images are 3072 px
    with pytest.raises(ValueError, match="64x48 pixels is over the 1,000-pixel limit"):
        load_image_file(f)
    monkeypatch.setenv("AMPYOLO_MAX_PIXELS", "lots")
    with pytest.raises(UserError, match="AMPYOLO_MAX_PIXELS"):
        load_image_file(f)
    monkeypatch.delenv("AMPYOLO_MAX_PIXELS")
    assert load_image_file(f).shape == (48, 64, 3)


def test_any_decoder_error_leaves_the_image_out(tmp_path, caplog, monkeypatch):
    from utils.data import datasets

    _split(tmp_path)
    real = cv2.imdecode

    def oom(buf, flags):
        if len(buf) == len((tmp_path / "images" / "train" / "im1.jpg").read_bytes()):
            raise cv2.error("OpenCV(5.0.0) alloc.cpp:73: error: (-4:Insufficient memory) Failed to allocate 5.8 GB")
        return real(buf, flags)

    monkeypatch.setattr(datasets.cv2, "imdecode", oom)
    kept, warnings = _verify(tmp_path, caplog)
    assert kept == ["im0.jpg", "im2.jpg"]
    assert any("im1.jpg" in w and "Insufficient memory" in w and "left out" in w for w in warnings)


def test_jpeg_cut_short_with_an_end_marker_is_left_out_but_a_grey_picture_is_kept(tmp_path, caplog):
    files = _split(tmp_path)
    data = files[1].read_bytes()
    files[1].write_bytes(data[: len(data) // 2] + b"\xff\xd9")  # cut mid-scan, end marker appended
    grey = tmp_path / "images" / "train" / "grey.jpg"
    cv2.imwrite(str(grey), np.full((48, 64, 3), 128, np.uint8))  # really grey: decodes to 128 everywhere
    (tmp_path / "labels" / "train" / "grey.txt").write_text("")
    kept, warnings = _verify(tmp_path, caplog)
    assert kept == ["grey.jpg", "im0.jpg", "im2.jpg"]
    assert any("im1.jpg" in w and "truncated JPEG" in w for w in warnings)


def test_label_file_with_a_bom_keeps_its_image(tmp_path, caplog):
    _split(tmp_path)
    (tmp_path / "labels" / "train" / "im0.txt").write_bytes("\ufeff0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n".encode())
    kept, warnings = _verify(tmp_path, caplog)
    assert kept == ["im0.jpg", "im1.jpg", "im2.jpg"] and not warnings


def test_label_path_that_is_a_folder_or_fifo_leaves_the_image_out(tmp_path, caplog):
    _split(tmp_path)
    labels = tmp_path / "labels" / "train"
    (labels / "im0.txt").unlink()
    (labels / "im0.txt").mkdir()
    (labels / "im2.txt").unlink()
    os.mkfifo(labels / "im2.txt")  # opening it would block forever
    kept, warnings = _verify(tmp_path, caplog)
    assert kept == ["im1.jpg"]
    assert any("im0.txt" in w and "a folder" in w and "left out" in w for w in warnings)
    assert any("im2.txt" in w and "FIFO" in w and "left out" in w for w in warnings)


# ----------------------------------------------------------------------------------------- 6, 7. detect outputs, lists, odd sources

@pytest.fixture(scope="module")
def nano_weights(tmp_path_factory) -> Path:
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=2)
    path = tmp_path_factory.mktemp("w") / "nano.pt"
    ck.atomic_save(ck.make_checkpoint(model, model.yaml, ["a", "b"], 0), path)
    return path


def test_two_inputs_with_one_base_name_get_their_own_outputs(nano_weights, tmp_path, caplog):
    import logging

    import detect

    rng = np.random.default_rng(1)
    for sub in ("a", "b"):
        (tmp_path / "in" / sub).mkdir(parents=True)
        cv2.imwrite(str(tmp_path / "in" / sub / "same.jpg"), (rng.random((40, 56, 3)) * 255).astype(np.uint8))
    listing = tmp_path / "list.txt"
    listing.write_text("in/a/same.jpg\nin/b/same.jpg\n")
    for source in (str(tmp_path / "in" / "[ab]" / "*.jpg"), str(listing)):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            save_dir = detect.run(nano_weights, source, imgsz=64, conf_thres=0.0, max_det=3, save_txt=True,
                                  save_crop=True, project=tmp_path / "runs")
        assert sorted(p.name for p in save_dir.glob("*.jpg")) == ["same.jpg", "same_2.jpg"]
        assert sorted(p.name for p in (save_dir / "labels").iterdir()) == ["same.txt", "same_2.txt"]
        crops = sorted(p.name for p in (save_dir / "crops").rglob("*.jpg"))
        assert len(crops) == 6 and len(set(crops)) == 6
        summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Results saved"))
        assert "2 label files" in summary and "6 crops" in summary and "with a suffix" in summary


def test_binary_txt_list_is_one_line_in_detect_and_in_training(nano_weights, tmp_path, capsys, monkeypatch):
    import detect
    from utils.data.labels import list_image_files

    binary = tmp_path / "list.txt"
    binary.write_bytes(bytes(range(256)) * 4)
    one_error(cli_in_process(detect.main, ["--weights", str(nano_weights), "--source", str(binary)], capsys, monkeypatch),
               "is not a text list of paths")
    with pytest.raises(UserError, match="is not a text list of paths"):
        list_image_files([binary])
    utf8 = tmp_path / "utf8.txt"
    utf8.write_bytes("\ufeff# comment\n  \nin/x.jpg\n".encode())
    from utils.files import read_path_list

    assert read_path_list(utf8) == [tmp_path / "in" / "x.jpg"]


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_source_that_is_no_regular_file_says_what_it_is(kind, nano_weights, tmp_path, capsys, monkeypatch):
    import detect
    from utils.data.labels import list_image_files

    if kind == "fifo":
        source = tmp_path / "pipe.txt"
        os.mkfifo(source)
        words = "is a FIFO"
    else:
        source = Path("/dev/zero")
        if not source.exists():
            pytest.skip("no /dev/zero here")
        words = "is a character device"
    one_error(cli_in_process(detect.main, ["--weights", str(nano_weights), "--source", str(source)], capsys, monkeypatch),
               words)
    with pytest.raises(UserError, match=words):
        list_image_files([source])
    with pytest.raises(UserError, match=words):
        ck.load_checkpoint(source)


# ----------------------------------------------------------------------------------------- two runs, one folder

def test_a_second_run_in_a_locked_run_folder_is_one_line_and_a_stale_lock_is_taken_over(tiny_data, tmp_path, capsys,
                                                                                        monkeypatch):
    from utils.files import LOCK_NAME, lock_record

    folder = tmp_path / "exp"
    folder.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # stands for a live train.py
    try:
        (folder / LOCK_NAME).write_text(lock_record(other.pid))
        argv = ["--data", str(tiny_data), "--project", str(tmp_path), "--exist-ok", *_flags(TINY_RUN)]
        code, lines = cli_in_process(train.main, argv, capsys, monkeypatch)
        one_error((code, lines), f"run folder {folder} is in use by another train.py (pid {other.pid})")
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # nothing written into its folder
    finally:
        other.kill()
        other.wait()
    # the holder died without removing its lock (SIGKILL): the next run takes the folder over
    out = train.run(data=str(tiny_data), project=str(tmp_path), exist_ok=True, **TINY_RUN)
    assert out.save_dir == folder and (folder / "weights" / "best.pt").is_file()
    assert not (folder / LOCK_NAME).exists()  # released when the run ended


def test_the_lock_is_released_when_a_run_fails_and_the_same_process_may_run_again(tiny_data, tmp_path):
    from utils.files import LOCK_NAME

    with pytest.raises(UserError, match="--freeze"):
        train.run(data=str(tiny_data), project=str(tmp_path), freeze=[100], **TINY_RUN)
    assert not (tmp_path / "exp" / LOCK_NAME).exists()


def test_runs_started_at_once_without_exist_ok_get_their_own_folders(tmp_path, monkeypatch):
    from utils import files

    real, made = Path.mkdir, []

    def racing(self, *a, **k):  # another process creates exp2 between our check and our mkdir
        if self.name == "exp2" and not made:
            made.append(self)
            real(self, parents=True)
        return real(self, *a, **k)

    (tmp_path / "exp").mkdir()
    monkeypatch.setattr(Path, "mkdir", racing)
    assert files.increment_path(tmp_path, "exp") == tmp_path / "exp3"


def _flags(opts: dict) -> list[str]:
    out = []
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else [] if v is False else [flag, str(v)]
    return out
