"""Fine-tuning from a weights file: what transfers and what the log says of it (models/transfer.py), the model's
name, and the recipe's options for the transferred tensors (lr_body_gain, head_only_epochs)."""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

import train
from models.transfer import Transfer, transfer_weights
from models.yolo import Model, model_name
from utils.data.data_config import REPO_ROOT, load_hyp
from utils.engine.callbacks import Callbacks
from utils.engine.checkpoint import atomic_save, load_checkpoint, make_checkpoint
from utils.engine.optim import (GROUP_KINDS, apply_warmup, build_optimizer, choose_recipe, group_lr_lambdas,
                                is_bias_group, lr_lambda, resolved_hyp)

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


def test_a_checkpoints_model_is_named_by_its_architecture(coco_like):
    yaml_dict = load_checkpoint(coco_like)["yaml"]
    assert model_name(yaml_dict) == "yolov5n"
    assert Model(yaml_dict, nc=3).name == "yolov5n"
    assert Model(yaml_dict, nc=3).info(64).startswith("yolov5n summary")
    assert model_name({**yaml_dict, "width_multiple": 0.3}) == "a custom model (depth 0.33, width 0.3)"
    assert model_name({**yaml_dict, "nc": 7, "anchors": 3}) == "yolov5n"  # classes and anchors are not the model
    assert Model("yolov5s.yaml").name == "yolov5s"


def test_other_class_count_reinitialises_the_head_alone(coco_like):
    model = Model("yolov5n.yaml", nc=7)
    t = transfer_weights(model, load_checkpoint(coco_like), coco_like)
    assert t.fresh == {f"model.24.m.{i}.{p}" for i in range(3) for p in ("weight", "bias")}
    assert t.pretrained and t.share > 0.95
    line = t.describe()
    assert f"{coco_like} (yolov5n): 343/349 tensors transferred; 6 re-initialised" in line
    assert "80 classes in the weights, 7 in the data" in line
    src = load_checkpoint(coco_like)["model"]
    assert torch.equal(model.state_dict()["model.2.cv1.conv.weight"], src["model.2.cv1.conv.weight"].float())


def test_another_models_cfg_is_not_called_a_head_swap(coco_like):
    """yolov5s.yaml with yolov5n weights keeps a handful of tensors: both models are named, the shapes are the
    reason, and the run is trained as from scratch."""
    model = Model("yolov5s.yaml", nc=80)
    t = transfer_weights(model, load_checkpoint(coco_like), coco_like)
    line = t.describe()
    assert "holds yolov5n, the model trained here is yolov5s" in line
    assert "differ in shape" in line and "from-scratch recipe" in line
    assert "classes" not in line  # 80 and 80: the class count is not the reason
    assert not t.pretrained and t.share < 0.5


def test_same_model_and_classes_transfers_everything(coco_like):
    t = transfer_weights(Model("yolov5n.yaml", nc=80), load_checkpoint(coco_like), coco_like)
    assert not t.fresh and t.describe().endswith("all 349 tensors transferred")


def test_the_real_yolov5n_file_transfers_its_body(caplog):
    if not YOLOV5N.is_file():
        pytest.skip(f"{YOLOV5N} not found")
    from types import SimpleNamespace

    opt = SimpleNamespace(weights=str(YOLOV5N), cfg="")
    with caplog.at_level(logging.INFO):
        model, t = train.create_model(SimpleNamespace(opt=opt, names=list("abcdefg")))
    assert t.source_model == "yolov5n" and t.pretrained and len(t.fresh) == 6
    assert "(yolov5n): 343/349 tensors transferred; 6 re-initialised (the Detect head's class outputs: 80 classes " \
           "in the weights, 7 in the data)" in caplog.text
    assert "<model dict>" not in caplog.text


def _body_split(model, gain):
    fresh = {f"model.24.m.{i}.{p}" for i in range(3) for p in ("weight", "bias")}
    body = [k for k, _ in model.named_parameters() if k not in fresh]
    return build_optimizer(model, "AdamW", 0.01, 0.9, 5e-4, body=body, body_lr_gain=gain), fresh


def test_the_transferred_tensors_get_their_own_groups_at_their_share_of_the_lr():
    model = Model("yolov5n.yaml", nc=7)
    opt, fresh = _body_split(model, 0.25)
    assert len(opt.param_groups) == 2 * GROUP_KINDS
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters()) and len(set(ids)) == len(ids)  # each once
    named = {id(p): k for k, p in model.named_parameters()}
    head = {named[id(p)] for g in opt.param_groups[:GROUP_KINDS] for p in g["params"]}
    assert head == fresh
    assert [g["lr"] for g in opt.param_groups] == [0.01] * 3 + [0.0025] * 3
    assert [g["weight_decay"] for g in opt.param_groups] == [5e-4, 0, 0, 5e-4, 0, 0]
    assert all(named[id(p)].endswith(".bias") for j, g in enumerate(opt.param_groups) if is_bias_group(j)
               for p in g["params"])
    # without a split: the three groups as before
    assert len(build_optimizer(model, "AdamW", 0.01, 0.9, 5e-4).param_groups) == GROUP_KINDS


def test_head_only_epochs_hold_the_body_at_lr_0_through_the_warmup():
    model = Model("yolov5n.yaml", nc=7)
    opt, _ = _body_split(model, 1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, group_lr_lambdas(opt, lr_lambda(10, 0.01, False), 2))
    assert [g["lr"] for g in opt.param_groups] == [0.01] * 3 + [0.0] * 3
    hyp = load_hyp()
    for epoch in range(3):
        factors = [f(epoch) for f in sched.lr_lambdas]
        apply_warmup(opt, 10 * epoch + 5, 100, factors, hyp, 0.9, bias_lr=0.1)  # a bias warmup from 0.1, too
        lrs = [g["lr"] for g in opt.param_groups]
        if epoch < 2:
            assert lrs[3:] == [0.0] * 3 and lrs[2] > 0.01 * factors[0] * 0.05  # the head's biases start high
        else:
            assert all(lr > 0 for lr in lrs)
        opt.step()
        sched.step()


def test_fine_tuning_options_reach_the_recipe_and_hyp_yaml_repeats_them():
    hyp = {**load_hyp(), "lr_body_gain": 0.25, "head_only_epochs": 2}
    r = choose_recipe("auto", hyp, 16, 27, 20, 7, pretrained=True)
    assert (r.body_lr_gain, r.head_only_epochs, r.splits_body) == (0.25, 2, True)
    again = choose_recipe("auto", resolved_hyp(hyp, r, 16), 16, 27, 20, 7, pretrained=True)
    # hyp.yaml holds the box gain folded into `box`, and the images per step the decay is for in its `nbs`
    assert replace(again, box_gain=r.box_gain, nbs=r.nbs) == r
    scratch = choose_recipe("auto", hyp, 16, 27, 20, 7, pretrained=False)  # no transferred tensors to treat apart
    assert (scratch.body_lr_gain, scratch.head_only_epochs, scratch.splits_body) == (1.0, 0, False)
    sgd = choose_recipe("SGD", hyp, 16, 27, 20, 7, pretrained=True)
    assert (sgd.body_lr_gain, sgd.head_only_epochs) == (0.25, 2)


def test_a_head_only_epoch_leaves_the_transferred_weights_as_they_came(coco_like, tiny_data, tmp_path):
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text(yaml.safe_dump({**load_hyp(), "head_only_epochs": 1, "lr_body_gain": 0.5}))
    snapshots = []
    cb = Callbacks()
    cb.register("on_train_epoch_end", lambda t, epoch: snapshots.append(
        {k: v.detach().clone() for k, v in t.model.named_parameters()}))
    src = {k: v.float() for k, v in load_checkpoint(coco_like)["model"].items()}
    train.run(cb, data=str(tiny_data), weights=str(coco_like), epochs=2, hyp=str(hyp), project=str(tmp_path),
              seed=0, **TINY)
    after0, after1 = snapshots
    assert torch.equal(after0["model.2.cv1.conv.weight"], src["model.2.cv1.conv.weight"])  # held in epoch 0
    assert not torch.equal(after0["model.24.m.0.weight"], after1["model.24.m.0.weight"])
    assert not torch.equal(after1["model.2.cv1.conv.weight"], src["model.2.cv1.conv.weight"])  # trains from epoch 1
    saved = yaml.safe_load((Path(tmp_path) / "exp" / "hyp.yaml").read_text())
    assert saved["head_only_epochs"] == 1 and saved["lr_body_gain"] == 0.5


def test_a_cfg_of_another_model_trains_with_the_from_scratch_recipe(coco_like, tiny_data, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        out = train.run(data=str(tiny_data), weights=str(coco_like), cfg="yolov5s.yaml", epochs=1,
                        project=str(tmp_path), **TINY)
    saved = yaml.safe_load((out.save_dir / "hyp.yaml").read_text())
    nc = 5  # the tiny shapes set
    scratch = choose_recipe("auto", load_hyp(), 8, 3, 1, nc, pretrained=False)
    assert saved["lr0"] == scratch.lr0 and saved["warmup_epochs"] == scratch.warmup_epochs
    assert "the model trained here is yolov5s" in caplog.text


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


def test_the_short_recipe_can_take_yolov5s_class_gain():
    hyp = load_hyp()
    assert not choose_recipe("auto", hyp, 16, 27, 20, 7).cls_by_nc  # the default: not scaled
    assert choose_recipe("auto", {**hyp, "cls_by_nc": 1}, 16, 27, 20, 7).cls_by_nc


def test_the_ema_ramp_can_follow_the_run_in_yolov5s_recipe_too():
    hyp = load_hyp()
    assert choose_recipe("SGD", hyp, 16, 27, 20, 7, pretrained=True).ema_tau == 2000  # YOLOv5's ramp
    # 20 epochs of 27 batches, 4 batches a step (64 images): 7 steps an epoch, 140 in all, a quarter of them
    assert choose_recipe("SGD", {**hyp, "ema_ramp_fraction": 0.25}, 16, 27, 20, 7, True).ema_tau == 140 * 0.25
    assert choose_recipe("auto", {**hyp, "ema_ramp_fraction": 0.5}, 16, 27, 20, 7, True).ema_tau == 540 * 0.5
    assert choose_recipe("auto", hyp, 16, 27, 20, 7).ema_tau == 540 / 4  # the short recipe's default
    assert choose_recipe("auto", hyp, 16, 27, 20, 7, True).ema_tau == 2000  # fine-tuning: YOLOv5's


def test_the_gradient_diagnostics_count_the_body_groups_with_their_kind():
    from utils.engine.diagnostics import group_grad_norms

    model = Model("yolov5n.yaml", nc=7)
    split, _ = _body_split(model, 0.25)
    whole = build_optimizer(model, "AdamW", 0.01, 0.9, 5e-4)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    assert torch.allclose(group_grad_norms(split), group_grad_norms(whole))
    assert group_grad_norms(split).shape == (3,) and (group_grad_norms(split) > 0).all()


def test_fine_tuning_is_yolov5s_sgd_recipe_with_a_step_per_batch_of_16():
    """bench/fidelity.py's ft-sgd-nbs16 (YOLOv5's recipe, hyp nbs 16) is what --weights trains with by default."""
    hyp = load_hyp()
    r = choose_recipe("auto", hyp, 16, 27, 20, 7, pretrained=True)
    measured = choose_recipe("SGD", {**hyp, "nbs": 16}, 16, 27, 20, 7, pretrained=True)
    assert replace(r, nbs=0) == measured and r.weight_decay(hyp, 16) == measured.weight_decay({**hyp, "nbs": 16}, 16)
    assert (r.optimizer, r.lr0, r.momentum, r.accumulate, r.warmup_bias_lr, r.box_gain, r.cls_by_nc) == \
        ("SGD", 0.01, 0.937, 1, 0.1, 1.0, True)
    assert r.weight_decay(hyp, 16) == pytest.approx(5e-4)  # YOLOv5's 5e-4 per 64 images, here per step of 16
    big = choose_recipe("auto", hyp, 64, 7, 20, 7, pretrained=True)  # a step per batch: 4x the images, 4x decay
    assert big.accumulate == 1 and big.weight_decay(hyp, 64) == pytest.approx(2e-3)
    small = choose_recipe("auto", hyp, 8, 53, 20, 7, pretrained=True)  # under 16: summed to 16 a step
    assert small.accumulate == 2 and small.weight_decay(hyp, 8) == pytest.approx(5e-4)
    coco = choose_recipe("auto", hyp, 16, 7000, 30, 80, pretrained=True)  # over 10k steps: YOLOv5's recipe as is
    assert coco.accumulate == 4 and coco.nbs == 0
    assert choose_recipe("auto", {**hyp, "finetune_sgd": 0}, 16, 27, 20, 7, pretrained=True).optimizer == "AdamW"
    assert choose_recipe("auto", hyp, 16, 27, 20, 7).optimizer == "AdamW"  # from scratch: unchanged
    again = choose_recipe("auto", resolved_hyp(hyp, r, 16), 16, 27, 20, 7, pretrained=True)  # hyp.yaml repeats it
    assert again.weight_decay(resolved_hyp(hyp, r, 16), 16) == pytest.approx(5e-4) and again.accumulate == 1
