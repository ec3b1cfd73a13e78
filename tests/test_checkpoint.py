"""The checkpoint format: FP16 EMA, weights_only loading, atomic writes, clear errors for bad files (truncated,
foreign, a folder, a text file, NaN weights), and the training size a checkpoint records for inference."""
from __future__ import annotations

import logging
import os

import pytest
import torch
from helpers import one_error_line

import detect
import train
import validator
from models.yolo import Model, load_model
from utils.engine import checkpoint as ck
from utils.engine.checkpoint import atomic_save, load_checkpoint, make_checkpoint
from utils.engine.train_state import fp32_state_dict
from utils.errors import UserError


@pytest.fixture(scope="module")
def nano():
    torch.manual_seed(0)
    return Model("yolov5n.yaml", nc=3)


def _save(model, path, **kw):
    ck.atomic_save(ck.make_checkpoint(model, model.yaml, ["a", "b", "c"], 4, {"mAP_0.5": 0.5}, **kw), path)


def test_round_trip_with_weights_only_fp16_ema_and_fp32_model(nano, tmp_path):
    path = tmp_path / "best.pt"
    _save(nano, path)
    raw = torch.load(path, weights_only=True)
    assert all(v.dtype == torch.float16 for v in raw["model"].values() if v.is_floating_point())
    assert raw["names"] == ["a", "b", "c"] and raw["nc"] == 3 and raw["epoch"] == 4 and "train" not in raw
    model, meta = load_model(path)
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    for k, v in nano.state_dict().items():
        if v.is_floating_point():
            assert torch.equal(model.state_dict()[k], v.half().float()), k


def test_strip_removes_the_training_state(nano, tmp_path):
    path = tmp_path / "last.pt"
    _save(nano, path, train_state={"model": fp32_state_dict(nano), "epoch_info": [1, 2]})
    assert "train" in torch.load(path, weights_only=True)  # not a resumable 'train' part: only strip reads it
    ck.strip_checkpoint(path)
    assert "train" not in ck.load_checkpoint(path)


@pytest.mark.slow
def test_stripped_yolov5s_is_at_most_52_percent_of_fp32(tmp_path):
    model = Model("yolov5s.yaml", nc=80)
    _save(model, tmp_path / "best.pt")
    torch.save(model.state_dict(), tmp_path / "fp32.pt")
    ratio = os.path.getsize(tmp_path / "best.pt") / os.path.getsize(tmp_path / "fp32.pt")
    assert ratio <= 0.52, ratio


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED_BY_PICKLE",))


def test_code_carrying_pickle_is_refused_and_nothing_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"format": "ampyolo", "model": _Evil(), "yaml": {}}, path)
    with pytest.raises(UserError, match="refused to load"):
        ck.load_checkpoint(path)
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()


def test_truncated_foreign_and_missing_files_give_one_clear_error(nano, tmp_path):
    good = tmp_path / "good.pt"
    _save(nano, good)
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    with pytest.raises(UserError, match="truncated or corrupt"):
        ck.load_checkpoint(bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    with pytest.raises(UserError, match="not a checkpoint of this project"):
        ck.load_checkpoint(foreign)
    with pytest.raises(UserError, match="not found"):
        ck.load_checkpoint(tmp_path / "nope.pt")
    text = tmp_path / "text.pt"
    text.write_text("hello")
    with pytest.raises(UserError):
        ck.load_checkpoint(text)


@pytest.mark.slow
def test_an_exported_torchscript_file_is_named_as_such_in_one_line(nano, micro, tmp_path, capsys, monkeypatch):
    """A .torchscript from export.py where a checkpoint is expected (train.py --weights; test.py or detect.py when it
    is named .pt) was 'truncated or corrupt' with torch's text cut mid-word: now one line says what it is and
    what to pass instead."""
    import shutil

    import export
    import train
    from helpers import cli_in_process
    from models.yolo import load_for_inference

    pt = tmp_path / "best.pt"
    _save(nano, pt)
    ts = export.run(pt, include=("torchscript",), imgsz=64, device="cpu")[0]
    renamed = tmp_path / "model.pt"
    shutil.copy(ts, renamed)
    for path, load in ((ts, ck.load_checkpoint), (renamed, ck.load_checkpoint),
                       (renamed, lambda p: load_for_inference(p, torch.device("cpu")))):
        with pytest.raises(UserError) as e:
            load(path)
        msg = str(e.value)
        assert f"{path} is a TorchScript model exported by export.py, not a checkpoint" in msg, msg
        assert "the .pt it was exported from" in msg and "truncated" not in msg and "\n" not in msg, msg
    assert "test.py and detect.py run it as it is" in str(_error(ck.load_checkpoint, ts))
    assert f"named {tmp_path / 'model.torchscript'}" in str(_error(ck.load_checkpoint, renamed))
    code, lines = cli_in_process(train.main, ["--weights", str(ts), "--data", str(micro), "--epochs", "1", "--imgsz",
                                              "64", "--workers", "0", "--project", str(tmp_path / "runs")],
                                 capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and "is a TorchScript model exported by export.py" in lines[0], lines


def _error(fn, *args) -> UserError:
    with pytest.raises(UserError) as e:
        fn(*args)
    return e.value


@pytest.mark.parametrize("fail_at", ["save", "replace"])
def test_failed_write_keeps_the_previous_file_and_leaves_no_temp(nano, tmp_path, monkeypatch, fail_at):
    path = tmp_path / "last.pt"
    _save(nano, path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck.torch if fail_at == "save" else os, fail_at, boom)
    with pytest.raises(UserError, match="previous file is kept"):
        _save(nano, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


# ----------------------------------------------------------------------------------------- a trained checkpoint: its size, a folder, NaN

@pytest.fixture(scope="module")
def trained(micro, tmp_path_factory):
    """best.pt of a tiny run at 64 px (the size it records)."""
    out = train.run(data=str(micro), epochs=1, imgsz=64, batch_size=4, workers=0, noplots=True, amp="off",
                    project=str(tmp_path_factory.mktemp("runs")))
    return out.save_dir / "weights" / "best.pt"


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_checkpoint_without_a_size_runs_at_640(micro, tmp_path, caplog):
    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=2)
    path = tmp_path / "old.pt"
    atomic_save(make_checkpoint(model, model.yaml, ["a", "b"], epoch=0), path)  # as written before sizes were kept
    with caplog.at_level(logging.INFO):
        res = detect.detect(detect.DetectOptions(weights=path, source=micro.parent / "val.txt",
                                                 project=str(tmp_path / "d")))
    assert max(res.shape[-2:]) == 640 and "at 640x640 px (the default; --imgsz to change)" in caplog.text


@pytest.mark.slow
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


# ----------------------------------------------------------------------------------------- a text file as a checkpoint
# (one CPU thread from here on; module-scoped, so every test below does too)


@pytest.mark.usefixtures("one_thread")
def test_a_text_file_given_as_a_checkpoint_says_what_it_is(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("hello text\n")
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(path)
    assert str(e.value) == (f"checkpoint {path} is not a PyTorch file (it begins b'hello text\\n', where torch.save "
                            f"writes a zip archive); pass a .pt written by train.py")
