"""Fine-tuning from a weights file: what transfers and what the log says of it (models/transfer.py), the model's
name, the share of tensors the recipe rule reads (utils/engine/optim.choose_recipe), and --freeze: what it refuses
and what it says of layers that start from scratch."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import yaml

import train
from models.transfer import transfer_weights
from models.yolo import Model, model_name
from utils.data.data_config import REPO_ROOT
from utils.hyp import load_hyp
from utils.engine.callbacks import Callbacks
from utils.engine.checkpoint import atomic_save, load_checkpoint, make_checkpoint
from utils.engine.optim import PRETRAINED_SHARE, choose_recipe

YOLOV5N = REPO_ROOT.parent / "shared" / "weights" / "yolov5n.pt"
TINY = dict(imgsz=64, batch_size=8, workers=0, noplots=True, noval=True, amp="off")


@pytest.fixture(scope="module")
def coco_like(tmp_path_factory) -> Path:
    """A yolov5n checkpoint with 80 classes (random weights), as a COCO-trained file would be."""
    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=80)
    path = tmp_path_factory.mktemp("w") / "coco_n.pt"
    atomic_save(make_checkpoint(model, model.yaml, [f"c{i}" for i in range(80)], 10), path)
    return path


@pytest.mark.slow
def test_a_checkpoints_model_is_named_by_its_architecture(coco_like):
    yaml_dict = load_checkpoint(coco_like)["yaml"]
    assert model_name(yaml_dict) == "yolov5n"
    assert Model(yaml_dict, nc=3).name == "yolov5n"
    assert Model(yaml_dict, nc=3).info(64).startswith("yolov5n summary")
    assert model_name({**yaml_dict, "width_multiple": 0.3}) == "a custom model (depth 0.33, width 0.3)"
    assert model_name({**yaml_dict, "nc": 7, "anchors": 3}) == "yolov5n"  # classes and anchors are not the model
    assert Model("yolov5s.yaml").name == "yolov5s"


@pytest.mark.slow
def test_other_class_count_reinitialises_the_head_alone(coco_like):
    model = Model("yolov5n.yaml", nc=7)
    t = transfer_weights(model, load_checkpoint(coco_like), coco_like)
    assert t.fresh == {f"model.24.m.{i}.{p}" for i in range(3) for p in ("weight", "bias")}
    assert t.share == 343 / 349
    line = t.describe()
    assert f"{coco_like} (yolov5n): 343/349 tensors transferred; 6 re-initialised" in line
    assert "80 classes in the weights, 7 in the data" in line
    src = load_checkpoint(coco_like)["model"]
    assert torch.equal(model.state_dict()["model.2.cv1.conv.weight"], src["model.2.cv1.conv.weight"].float())


@pytest.mark.slow
def test_another_models_cfg_is_not_called_a_head_swap(coco_like):
    """yolov5s.yaml with yolov5n weights keeps a handful of tensors: both models are named, the shapes are the
    reason, and the share is under the rule's threshold for fine-tuning."""
    model = Model("yolov5s.yaml", nc=80)
    t = transfer_weights(model, load_checkpoint(coco_like), coco_like)
    line = t.describe()
    assert "holds yolov5n, the model trained here is yolov5s" in line
    assert "differ in shape" in line and "pass its --cfg or drop --cfg" in line
    assert "classes" not in line  # 80 and 80: the class count is not the reason
    assert t.share < PRETRAINED_SHARE


@pytest.mark.slow
def test_same_model_and_classes_transfers_everything(coco_like):
    t = transfer_weights(Model("yolov5n.yaml", nc=80), load_checkpoint(coco_like), coco_like)
    assert not t.fresh and t.describe().endswith("all 349 tensors transferred")


@pytest.mark.slow
def test_the_real_yolov5n_file_transfers_its_body(caplog):
    if not YOLOV5N.is_file():
        pytest.skip(f"{YOLOV5N} not found")
    from types import SimpleNamespace

    opt = SimpleNamespace(weights=str(YOLOV5N), cfg="")
    with caplog.at_level(logging.INFO):
        model, t = train.create_model(opt, list("abcdefg"))
    assert t.source_model == "yolov5n" and t.share >= PRETRAINED_SHARE and len(t.fresh) == 6
    assert "(yolov5n): 343/349 tensors transferred; 6 re-initialised (the Detect head's class outputs: 80 classes " \
           "in the weights, 7 in the data)" in caplog.text
    assert "<model dict>" not in caplog.text


@pytest.mark.slow
def test_a_cfg_of_another_model_trains_with_the_from_scratch_recipe(coco_like, tiny_data, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        out = train.run(data=str(tiny_data), weights=str(coco_like), cfg="yolov5s.yaml", epochs=1,
                        project=str(tmp_path), **TINY)
    saved = yaml.safe_load((out.save_dir / "hyp.yaml").read_text())
    nc = 5  # the tiny shapes set
    scratch = choose_recipe("auto", load_hyp(), 8, 24, 1, nc)
    assert saved["lr0"] == scratch.lr0 and saved["warmup_epochs"] == scratch.warmup_epochs
    assert "the model trained here is yolov5s" in caplog.text and "the short recipe: from scratch (" in caplog.text


@pytest.mark.slow
def test_many_classes_still_fine_tune(coco_like):
    """The share counts tensors, as the log line does: with 1,300 classes the new head holds most of the parameters
    (which the share once counted, sending such a fine-tune to the from-scratch recipe), but 6 of 349 tensors."""
    model = Model("yolov5n.yaml", nc=1300)
    t = transfer_weights(model, load_checkpoint(coco_like), coco_like)
    head = sum(p.numel() for k, p in model.named_parameters() if k in t.fresh)
    assert head > sum(p.numel() for p in model.parameters()) / 2
    assert t.share == 343 / 349
    assert choose_recipe("auto", load_hyp(), 16, 2000, 30, 1300, t.share).kind == "finetune"


@pytest.mark.slow
def test_freeze_10_keeps_the_backbone_as_it_came_and_trains_the_rest(coco_like, tiny_data, tmp_path):
    """--freeze N as YOLOv5's: modules 0..N-1 (yolov5n's backbone is 0-9) never change; the rest trains."""
    snapshots = []
    cb = Callbacks()
    cb.register("on_train_epoch_end", lambda t, epoch: snapshots.append(
        {k: (v.detach().clone(), v.requires_grad) for k, v in t.model.named_parameters()}))
    src = {k: v.float() for k, v in load_checkpoint(coco_like)["model"].items()}
    train.run(cb, data=str(tiny_data), weights=str(coco_like), epochs=1, freeze=[10], project=str(tmp_path), seed=0,
              **TINY)
    (after,) = snapshots
    frozen = {k for k, (_, grad) in after.items() if not grad}
    assert frozen == {k for k in after if int(k.split(".")[1]) < 10}
    assert all(torch.equal(after[k][0], src[k]) for k in frozen)
    assert not torch.equal(after["model.13.cv1.conv.weight"][0], src["model.13.cv1.conv.weight"])


# ----------------------------------------------------------------------------------------- --freeze


def test_freeze_refuses_modules_the_model_does_not_have(micro, tmp_path):
    import train
    from utils.errors import UserError

    common = dict(data=str(micro), epochs=1, imgsz=64, batch_size=4, workers=0, noplots=True, project=str(tmp_path))
    with pytest.raises(UserError, match=r"--freeze -1: modules are numbered from 0"):
        train.run(freeze=[-1], **common)
    with pytest.raises(UserError, match=r"--freeze 30 40: yolov5n has modules 0-24, not 30, 40"):
        train.run(freeze=[30, 40], **common)
    assert not (tmp_path / "exp").exists()  # refused before a run folder was made


@pytest.mark.slow
def test_freezing_layers_that_start_from_scratch_is_said(micro, tmp_path, caplog):
    """--freeze 10 without --weights freezes a random backbone: it trains, and the log says those layers never
    learn. From a checkpoint of the same model, nothing to say."""
    import logging

    import train
    from models.yolo import Model
    from utils.data.data_config import load_data_config
    from utils.engine.checkpoint import atomic_save, make_checkpoint

    common = dict(data=str(micro), epochs=1, imgsz=64, batch_size=4, workers=0, noplots=True, noval=True,
                  project=str(tmp_path), freeze=[10])
    with caplog.at_level(logging.WARNING):
        train.run(name="scratch", **common)
    assert "warning: --freeze 10 holds 99 of its 99 tensors at their random start (no --weights)" in caplog.text
    names = load_data_config(micro)["names"]
    model = Model("yolov5n.yaml", nc=len(names))
    atomic_save(make_checkpoint(model, model.yaml, list(names), epoch=-1), tmp_path / "w.pt")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train.run(name="ft", weights=str(tmp_path / "w.pt"), **common)
    assert "--freeze" not in caplog.text
