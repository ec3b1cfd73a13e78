"""The update under AMP: step order, skipping non-finite steps, state round trips; parameter groups; EMA."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from utils.engine.amp import Precision
from utils.engine.ema import ModelEMA
from utils.engine.optim import (ADAMW_WARMUP_EPOCHS, AmpUpdater, Recipe, apply_warmup, build_optimizer, choose_recipe,
                                lr_lambda)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(64, 2))


def _loss(net):
    torch.manual_seed(1)
    return net(torch.randn(2, 3, 6, 6)).square().mean()


def _setup(mode="off"):
    net = _net()
    _loss(net)  # materialise the lazy layer
    opt = build_optimizer(net, "SGD", 0.1, 0.9, 1e-4)
    ema = ModelEMA(net)
    return net, opt, ema, AmpUpdater(net, opt, Precision(mode, "cpu"), ema)


@pytest.mark.parametrize("mode", ["off", "bf16", "fp16"])
def test_step_order_unscale_clip_step_update_zero_ema(mode, monkeypatch):
    net, opt, ema, up = _setup(mode)
    calls = []
    for name in ("unscale_", "step", "update"):
        orig = getattr(up.scaler, name)
        monkeypatch.setattr(up.scaler, name, lambda *a, _o=orig, _n=name, **k: (calls.append(_n), _o(*a, **k))[1])
    orig_clip = nn.utils.clip_grad_norm_
    monkeypatch.setattr(nn.utils, "clip_grad_norm_", lambda *a, **k: (calls.append("clip"), orig_clip(*a, **k))[1])
    orig_ema = ema.update
    monkeypatch.setattr(ema, "update", lambda m: (calls.append("ema"), orig_ema(m))[1])
    up.backward(_loss(net))
    up.backward(_loss(net))  # two accumulated backward passes, one step
    assert up.step()
    assert calls == ["unscale_", "clip", "step", "update", "ema"]
    assert all(p.grad is None for p in net.parameters())


def test_clip_bounds_the_gradient_norm(monkeypatch):
    net, opt, ema, up = _setup()
    seen = []
    monkeypatch.setattr(opt, "step", lambda *a, **k: seen.append(
        math.sqrt(sum(float(p.grad.square().sum()) for p in net.parameters() if p.grad is not None))))
    up.backward(_loss(net) * 1e6)
    up.step()
    assert seen and seen[0] <= 10.0 + 1e-3


@pytest.mark.parametrize("mode", ["off", "fp16"])
def test_non_finite_step_is_skipped_and_leaves_weights_and_ema_untouched(mode):
    net, opt, ema, up = _setup(mode)
    w0 = {k: v.detach().clone() for k, v in net.named_parameters()}
    e0 = {k: v.clone() for k, v in ema.ema.state_dict().items()}
    up.backward(_loss(net) * float("nan"))
    assert not up.step()
    assert up.skipped == 1 and ema.updates == 0
    assert all(torch.equal(w0[k], v) for k, v in net.named_parameters())  # BN statistics move in forward; weights don't
    assert all(torch.equal(e0[k], v) for k, v in ema.ema.state_dict().items())
    up.backward(_loss(net))  # the next finite step goes through
    assert up.step() and up.skipped == 1 and ema.updates == 1


def test_fp16_overflow_lowers_the_scale_and_state_round_trips():
    net, opt, ema, up = _setup("fp16")
    scale0 = up.scaler.get_scale()
    up.backward(_loss(net) * float("inf"))
    up.step()
    assert up.scaler.get_scale() < scale0
    state = up.state_dict()
    _, _, _, fresh = _setup("fp16")
    fresh.load_state_dict(state)
    assert fresh.scaler.get_scale() == up.scaler.get_scale() and fresh.skipped == up.skipped == 1
    assert fresh.scaler.state_dict() == up.scaler.state_dict()


def test_parameter_groups_keep_decay_off_norm_weights_and_biases():
    net = _net()
    _loss(net)
    opt = build_optimizer(net, "AdamW", 1e-3, 0.9, 5e-4)
    decay, norm, bias = opt.param_groups
    assert decay["weight_decay"] == 5e-4 and norm["weight_decay"] == bias["weight_decay"] == 0
    assert len(norm["params"]) == 1 and len(bias["params"]) == 3 and len(decay["params"]) == 2
    assert opt.defaults["betas"] == (0.9, 0.999)


def test_auto_recipe_adamw_per_batch_for_short_sgd_accumulated_for_long_schedules():
    hyp = {"lr0": 0.01, "momentum": 0.937, "weight_decay": 5e-4, "warmup_bias_lr": 0.1, "warmup_epochs": 3.0}
    short = choose_recipe("auto", hyp, 16, 25, 40, 5)  # the built-in dataset: 25 batches x 40 epochs
    assert (short.optimizer, short.accumulate, short.cls_by_nc, short.box_gain) == ("AdamW", 1, False, 4.0)
    assert short.lr0 == pytest.approx(0.008 * 5 / 9, abs=1e-6)
    # 5 to 10 classes as measured (bench/fidelity.py); fewer get no more than 5 do; fine-tuning keeps half
    assert choose_recipe("auto", hyp, 16, 38, 30, 10).lr0 == pytest.approx(0.008 * 5 / 14, abs=1e-6)
    assert choose_recipe("auto", hyp, 16, 38, 30, 1).lr0 == pytest.approx(short.lr0, abs=1e-6)
    # fine-tuning with the AdamW recipe (hyp finetune_sgd: 0; the default is YOLOv5's SGD, test_transfer.py) half
    adamw_ft = {**hyp, "finetune_sgd": 0}
    tuned = choose_recipe("auto", adamw_ft, 16, 38, 30, 10, pretrained=True)
    assert tuned.lr0 == pytest.approx(0.004 * 5 / 14, abs=1e-6)
    assert choose_recipe("auto", adamw_ft, 16, 38, 30, 1, pretrained=True).lr0 == pytest.approx(0.004, abs=1e-6)
    assert short.weight_decay(hyp, 16) == pytest.approx(5e-4 / 4)
    long = choose_recipe("auto", hyp, 16, 7000, 300, 80)  # COCO: 300 epochs of 7k batches
    assert long == Recipe("SGD", 0.01, 0.937, 4, warmup_bias_lr=0.1) and long.weight_decay(hyp, 16) == pytest.approx(5e-4)
    assert choose_recipe("Adam", hyp, 8, 10, 3, 3) == Recipe("Adam", 0.01, 0.937, 8, warmup_bias_lr=0.1)
    # an optional lr_adam_gain scales the short recipe's lr only (the harness's lr ablation)
    doubled = choose_recipe("auto", {**hyp, "lr_adam_gain": 2.0}, 16, 25, 40, 5)
    assert doubled.lr0 == pytest.approx(2 * short.lr0, abs=1e-6)
    assert choose_recipe("auto", {**hyp, "lr_adam_gain": 2.0}, 16, 7000, 300, 80).lr0 == 0.01
    # the gradient clip: 10 unless the hyp sets max_grad_norm (the harness's clipping ablation), either recipe
    assert short.max_grad_norm == long.max_grad_norm == 10.0
    assert choose_recipe("auto", {**hyp, "max_grad_norm": 1e9}, 16, 25, 40, 5).max_grad_norm == 1e9
    assert choose_recipe("SGD", {**hyp, "max_grad_norm": 3.0}, 16, 25, 40, 5).max_grad_norm == 3.0


def test_bias_warmup_is_yolov5s_for_every_optimizer_unless_the_hyp_sets_adams():
    """YOLOv5's bias warmup (0.1 falling to lr0) held for AdamW too in bench/fidelity.py; the hyp can
    still give Adam and AdamW their own start (warmup_bias_lr_adam), as the harness's ablation does."""
    hyp = {"lr0": 0.01, "momentum": 0.937, "warmup_bias_lr": 0.1, "warmup_epochs": 3.0}
    assert choose_recipe("auto", hyp, 16, 7000, 300, 80).warmup_bias_lr == 0.1  # long: SGD
    assert choose_recipe("auto", hyp, 16, 25, 40, 5).warmup_bias_lr == 0.1  # short: AdamW
    assert choose_recipe("Adam", {**hyp, "warmup_bias_lr": 0.05}, 16, 25, 40, 5).warmup_bias_lr == 0.05
    assert choose_recipe("AdamW", {**hyp, "warmup_bias_lr_adam": 0.0}, 16, 25, 40, 5).warmup_bias_lr == 0.0
    assert choose_recipe("SGD", {**hyp, "warmup_bias_lr_adam": 0.0}, 16, 25, 40, 5).warmup_bias_lr == 0.1


def test_the_short_recipe_warms_up_6_epochs_from_scratch_and_keeps_the_hyps_otherwise():
    """Twice YOLOv5's warmup held for the short AdamW recipe from scratch (bench/fidelity.py fp32-lr2-warm6);
    long schedules, an explicit --optimizer and fine-tuning keep the hyp's warmup_epochs."""
    hyp = {"lr0": 0.01, "momentum": 0.937, "warmup_bias_lr": 0.1, "warmup_epochs": 3.0}
    assert choose_recipe("auto", hyp, 16, 25, 40, 5).warmup_epochs == ADAMW_WARMUP_EPOCHS == 6.0  # short: AdamW
    assert choose_recipe("auto", hyp, 16, 7000, 300, 80).warmup_epochs == 3.0  # long: SGD
    assert choose_recipe("AdamW", hyp, 16, 25, 40, 5).warmup_epochs == 3.0
    assert choose_recipe("auto", hyp, 16, 25, 40, 5, pretrained=True).warmup_epochs == 3.0
    assert choose_recipe("auto", {**hyp, "warmup_epochs": 1.5}, 16, 25, 40, 5, pretrained=True).warmup_epochs == 1.5
    hyp = {**hyp, "finetune_sgd": 0}  # the AdamW recipe when fine-tuning
    # the hyp's warmup_epochs_adam sets the short recipe's, from scratch or not (the harness pins 3 with it)
    assert choose_recipe("auto", {**hyp, "warmup_epochs_adam": 3.0}, 16, 25, 40, 5).warmup_epochs == 3.0
    assert choose_recipe("auto", {**hyp, "warmup_epochs_adam": 2.0}, 16, 25, 40, 5, pretrained=True).warmup_epochs == 2.0
    assert choose_recipe("auto", {**hyp, "warmup_epochs_adam": 2.0}, 16, 7000, 300, 80).warmup_epochs == 3.0


def test_adam_fine_tuning_starts_the_biases_at_0_unless_the_hyp_says_otherwise():
    """From trained weights the 0.1 kick undid a converged checkpoint in one epoch (bias_warmup_start's
    measurements), so Adam/AdamW fine-tuning warms the biases up from 0; SGD keeps YOLOv5's warmup."""
    hyp = {"lr0": 0.01, "momentum": 0.937, "warmup_bias_lr": 0.1, "warmup_epochs": 3.0}
    assert choose_recipe("auto", hyp, 16, 25, 40, 5, pretrained=True).warmup_bias_lr == 0.1  # short: YOLOv5's SGD
    hyp = {**hyp, "finetune_sgd": 0}  # the AdamW recipe
    assert choose_recipe("auto", hyp, 16, 25, 40, 5, pretrained=True).warmup_bias_lr == 0.0  # short: AdamW
    assert choose_recipe("Adam", hyp, 16, 25, 40, 5, pretrained=True).warmup_bias_lr == 0.0
    assert choose_recipe("auto", hyp, 16, 7000, 300, 80, pretrained=True).warmup_bias_lr == 0.1  # long: SGD
    assert choose_recipe("AdamW", {**hyp, "warmup_bias_lr_adam": 0.05}, 16, 25, 40, 5,
                         pretrained=True).warmup_bias_lr == 0.05


def test_train_passes_weights_as_pretrained_to_the_recipe(micro, tmp_path, caplog):
    """The notice train.py prints says which recipe a fine-tuning run got: YOLOv5's SGD, summed to 16 images a
    step (here 2 batches of 8), with its bias warmup."""
    import logging

    import train
    from models.yolo import Model
    from utils.data.data_config import load_data_config
    from utils.engine.checkpoint import atomic_save, make_checkpoint

    names = load_data_config(micro)["names"]
    model = Model("yolov5n.yaml", nc=len(names))
    atomic_save(make_checkpoint(model, model.yaml, list(names), epoch=-1), tmp_path / "w.pt")
    with caplog.at_level(logging.INFO):
        train.run(data=str(micro), weights=str(tmp_path / "w.pt"), epochs=1, imgsz=64, batch_size=8, workers=0,
                  noval=True, noplots=True, project=str(tmp_path), name="ft", device="cpu")
    assert "optimizer: SGD(lr=0.01, momentum=0.937)" in caplog.text and "2 batch(es) of 8 per step" in caplog.text
    assert "bias warmup from lr 0.1," in caplog.text and "(at most 3 epochs)," in caplog.text


def test_ema_ramp_scales_with_short_schedules():
    """tau 2000 on a 625-step run leaves the EMA at decay 0.27 at the end (no averaging); a quarter of
    the schedule ends every short run at the same decay, and long schedules keep YOLOv5's 2000."""
    hyp = {"lr0": 0.01, "momentum": 0.937, "warmup_bias_lr": 0.1, "warmup_epochs": 3.0}
    short = choose_recipe("auto", hyp, 16, 25, 25, 8)  # 625 steps
    assert short.ema_tau == pytest.approx(625 / 4)
    end = ModelEMA(_net(), tau=short.ema_tau, updates=625).current_decay()
    assert end == pytest.approx(0.9999 * (1 - math.exp(-4)))
    assert ModelEMA(_net(), updates=625).current_decay() < 0.3  # the old ramp
    assert choose_recipe("auto", hyp, 16, 7000, 300, 80).ema_tau == 2000  # long: SGD
    assert choose_recipe("auto", hyp, 16, 1000, 40, 8).ema_tau == 2000  # AdamW over 40k steps: YOLOv5's ramp
    assert choose_recipe("auto", {**hyp, "ema_tau": 2000}, 16, 25, 25, 8).ema_tau == 2000  # hyp override


def test_adamw_bias_warmup_at_0_1_moves_biases_by_about_its_lr_per_step():
    """Why the bias warmup was suspected (docs/recipe.md), on a toy problem: with AdamW a bias at
    lr 0.1 moves ~0.1 per step whatever its gradient's size, while SGD's step scales with the gradient."""
    moved = {}
    for name in ("AdamW", "SGD"):
        torch.manual_seed(0)
        net = nn.Linear(4, 1)
        opt = build_optimizer(net, name, 0.1, 0.9, 0.0)
        b0 = net.bias.detach().clone()
        for _ in range(10):
            (net(torch.randn(8, 4)).sum() * 1e-3).backward()
            opt.step()
            opt.zero_grad()
        moved[name] = float((net.bias.detach() - b0).abs())
    assert moved["AdamW"] > 0.5  # ten steps of ~0.1 in a consistent direction
    assert moved["SGD"] < 0.05


def test_lr_schedules_and_warmup():
    for cos in (False, True):
        f = lr_lambda(10, 0.01, cos)
        assert f(0) == pytest.approx(1.0) and f(10) == pytest.approx(0.01)
    net = _net()
    _loss(net)
    opt = build_optimizer(net, "SGD", 0.01, 0.937, 5e-4)
    for g in opt.param_groups:
        g["initial_lr"] = 0.01
    hyp = {"warmup_bias_lr": 0.1, "warmup_momentum": 0.8}
    apply_warmup(opt, 0, 100, 1.0, hyp, 0.937, 0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0, 0.1]
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.8)
    apply_warmup(opt, 50, 100, 1.0, hyp, 0.937, 0.0)  # Adam-style: the biases ramp up like every other group
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.005] * 3)
    apply_warmup(opt, 100, 100, 0.5, hyp, 0.937, 0.1)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.005] * 3)
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.937)


def test_ema_decay_ramp_fp32_and_state_round_trip():
    net = _net().half()
    ema = ModelEMA(net)
    assert all(v.dtype == torch.float32 for v in ema.ema.state_dict().values() if v.is_floating_point())
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    before = {k: v.clone() for k, v in ema.ema.state_dict().items()}
    ema.update(net)
    d = ema.current_decay()
    assert d == pytest.approx(0.9999 * (1 - math.exp(-1 / 2000)))
    k = "0.weight"
    expected = d * before[k] + (1 - d) * net.state_dict()[k].float()
    assert torch.allclose(ema.ema.state_dict()[k], expected, atol=1e-6)
    other = ModelEMA(_net())
    other.load_state_dict(ema.state_dict())
    assert other.updates == 1 and torch.equal(other.ema.state_dict()[k], ema.ema.state_dict()[k])


# ----------------------------------------------------------------------------------------- the update on the device
def _fused_pair(mode="off"):
    """Two identical AdamW set-ups: one fused (the update stays on the device), one with the default kernel."""
    out = []
    for fused in (True, False):
        net = _net()
        _loss(net)
        opt = build_optimizer(net, "AdamW", 0.01, 0.9, 1e-4, fused=fused)
        ema = ModelEMA(net, tau=2.0)
        out.append((net, ema, AmpUpdater(net, opt, Precision(mode, "cpu"), ema)))
    return out


@pytest.mark.parametrize("mode", ["off", "fp16"])
def test_fused_update_skips_non_finite_steps_on_the_device_without_host_reads(mode, monkeypatch):
    """What train.py runs on CUDA (a fused optimizer), on CPU tensors: the finite flag never reaches the host,
    yet a NaN step changes neither the weights nor the EMA, and is counted; finite steps match the default
    kernel's."""
    (net, ema, up), (ref_net, ref_ema, ref_up) = _fused_pair(mode)
    assert up.on_device and not ref_up.on_device
    for scale in (1.0, float("nan"), 1.0):
        for n, u in ((net, up), (ref_net, ref_up)):
            u.backward(_loss(n) * scale)
        before = {k: v.detach().clone() for k, v in net.named_parameters()}
        reads = []
        monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: reads.append(t) or bool(t.item()))
        finite = up.step()
        monkeypatch.undo()
        assert isinstance(finite, torch.Tensor) and reads == []  # the step decided nothing on the host
        assert bool(ref_up.step()) == bool(finite) == (scale == 1.0)
        if scale != 1.0:
            assert all(torch.equal(before[k], v) for k, v in net.named_parameters())
        for a, b in ((net.state_dict(), ref_net.state_dict()), (ema.ema.state_dict(), ref_ema.ema.state_dict())):
            assert all(torch.allclose(a[k].float(), b[k].float(), rtol=1e-5, atol=1e-6) for k in a)
    assert up.skipped == ref_up.skipped == 1 and ema.updates == ref_ema.updates == 2
    state = up.state_dict()
    assert state["skipped"] == 1 and isinstance(state["skipped"], int)


def test_ema_updates_are_the_same_with_the_flag_on_the_device():
    net = _net()
    _loss(net)
    a, b = ModelEMA(net, tau=3.0), ModelEMA(net, tau=3.0)
    for step in range(4):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.1 * (step + 1))
        a.update(net)
        b.update(net, torch.tensor(True))
        b.update(net, torch.tensor(False))  # a skipped step: no change, not counted
    assert a.updates == b.updates == 4
    assert all(torch.equal(x, y) for x, y in zip(a.ema.state_dict().values(), b.ema.state_dict().values()))
    b.updates = 10  # a resume sets the count back on the host
    assert b.updates == 10


# ----------------------------------------------------------------------------------------- batch size and schedule
def test_the_short_recipe_scales_its_lr_by_the_square_root_of_the_batch_from_16_to_64():
    """The lr tuned at 16 images per step grows as the square root of the batch from 16 to 64 (measured where the
    step floor leaves the batch, docs/recipe.md), is kept below 16 and is batch 64's above it; hyp lr_batch_power 0
    keeps it at every batch, 1 scales it linearly; the weight decay follows the images per step."""
    hyp = {"lr0": 0.01, "momentum": 0.937, "weight_decay": 5e-4, "warmup_bias_lr": 0.1, "warmup_epochs": 3.0}
    at = {b: choose_recipe("auto", hyp, b, 1000 // b, 100, 10) for b in (4, 8, 16, 32, 64, 256)}
    base = at[16].lr0
    assert all(r.accumulate == 1 for r in at.values())
    assert at[4].lr0 == at[8].lr0 == base  # below 16: as tuned
    assert at[32].lr0 == pytest.approx(2 ** 0.5 * base, abs=1e-6)
    assert at[64].lr0 == pytest.approx(2 * base, abs=1e-6)
    assert at[256].lr0 == at[64].lr0  # past the largest batch measured (64): its lr, not more
    assert at[64].weight_decay(hyp, 64) == pytest.approx(5e-4) and at[4].weight_decay(hyp, 4) == pytest.approx(5e-4 / 16)
    kept = {b: choose_recipe("auto", {**hyp, "lr_batch_power": 0.0}, b, 1000 // b, 100, 10) for b in (8, 64, 256)}
    assert {r.lr0 for r in kept.values()} == {base}
    assert choose_recipe("auto", {**hyp, "lr_batch_power": 1.0}, 64, 15, 15, 10).lr0 == pytest.approx(4 * base, abs=1e-6)


def test_at_batch_16_and_below_the_recipe_is_the_one_before_any_scaling():
    """The 30-epoch batch-16 figures and the built-in dataset's (batch 16) were measured before the recipe learned
    to follow the batch: there every scaling rule is a no-op, the shipped defaults equal all of them switched off."""
    from utils.engine.optim import steps_batch

    hyp = {"lr0": 0.01, "momentum": 0.937, "weight_decay": 5e-4, "warmup_bias_lr": 0.1, "warmup_epochs": 3.0}
    off = {**hyp, "lr_batch_power": 0.0, "warmup_max_fraction": 1.0, "ema_batch_power": 0.0,
           "adam_beta_batch_power": 0.0, "min_steps": 0}
    for batch, images, epochs in ((16, 2000, 30), (16, 400, 40), (8, 128, 15)):
        nb = -(-images // batch)
        assert steps_batch("auto", hyp, batch, images, epochs) == batch
        assert choose_recipe("auto", hyp, batch, nb, epochs, 10) == choose_recipe("auto", off, batch, nb, epochs, 10)


def test_the_warmup_is_its_epochs_with_a_floor_in_batches_and_an_optional_cap():
    r = Recipe("AdamW", 0.001, 0.9, 1, warmup_epochs=6.0)
    assert r.warmup_steps(125, 30) == 750  # batch 16 on 2000 images, 30 epochs: 6 epochs
    assert r.warmup_steps(125, 15) == 750  # and at 15
    assert r.warmup_steps(16, 15) == 100  # batch 64 on 1000 images: 6 epochs are 96 batches, the floor is 100
    assert r.warmup_steps(2, 40) == 80  # the floor never outlasts the run
    quarter = Recipe("AdamW", 0.001, 0.9, 1, warmup_epochs=6.0, warmup_max_fraction=0.25)  # hyp warmup_max_fraction
    assert quarter.warmup_steps(125, 30) == 750 and quarter.warmup_steps(125, 15) == 469
    assert quarter.warmup_steps(16, 15) == 60  # the floor gives way to the cap


def test_an_ema_step_of_weight_4_averages_like_4_steps_of_16_images():
    """The EMA counting images: one update of weight 4 leaves the average where four updates of weight 1 towards
    the same weights leave it (once the ramp is flat), and the ramp advances 4 steps per update."""
    net = _net()
    _loss(net)
    one, four = ModelEMA(net, tau=3.0, updates=1000, step_weight=4.0), ModelEMA(net, tau=3.0, updates=4000)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    one.update(net)
    for _ in range(4):
        four.update(net)
    a, b = one.ema.state_dict(), four.ema.state_dict()
    assert all(torch.allclose(a[k].float(), b[k].float(), rtol=0, atol=1e-6) for k in a)
    ramp = ModelEMA(net, tau=8.0, step_weight=4.0)
    ramp.updates = 2
    assert ramp.current_decay() == pytest.approx((0.9999 * (1 - math.exp(-8 / 8.0))) ** 4)
    hyp = {"lr0": 0.01, "momentum": 0.937, "weight_decay": 5e-4, "warmup_bias_lr": 0.1, "warmup_epochs": 3.0}
    r = choose_recipe("auto", {**hyp, "ema_batch_power": 1.0}, 64, 16, 15, 10)
    assert r.ema_step_weight == 4.0 and r.ema_tau == pytest.approx(16 * 15 * 4 / 4)  # the ramp over 16-image steps
    assert choose_recipe("auto", hyp, 16, 16, 15, 10).ema_step_weight == 1.0


def test_a_batch_too_large_for_the_short_recipes_steps_is_lowered():
    from utils.engine.optim import MIN_STEPS, steps_batch

    assert MIN_STEPS == 1500
    assert steps_batch("auto", {}, 64, 1000, 15) == 16  # 240 steps -> batch 16 (945 steps), as tuned
    assert steps_batch("auto", {}, 64, 4000, 15) == 40  # 945 steps -> batch 40 (1500), a multiple of 8
    assert steps_batch("auto", {}, 32, 4000, 15) == 32  # 1875 steps: kept
    assert steps_batch("auto", {}, 256, 1000, 100) == 64  # 400 steps -> 1600
    assert steps_batch("auto", {}, 64, 1000, 100) == 64  # 1600 steps: kept
    h = {"min_steps": 500}
    assert steps_batch("auto", h, 64, 1000, 15) == 24  # 240 steps -> batch 24 (625 steps)
    assert steps_batch("auto", h, 64, 2000, 15) == 56
    assert steps_batch("auto", h, 64, 2000, 100) == 64  # 3200 steps: kept
    assert steps_batch("auto", h, 64, 100, 15) == 16  # never under the 16 the recipe was tuned at
    assert steps_batch("auto", h, 64, 1000, 15, multiple=3) == 24  # a multiple of the processes too
    assert steps_batch("auto", {"min_steps": 0}, 64, 1000, 15) == 64  # the floor off
    assert steps_batch("SGD", {}, 64, 1000, 15) == steps_batch("AdamW", {}, 64, 1000, 15) == 64  # a chosen optimizer
    assert steps_batch("auto", {"optimizer": "AdamW"}, 64, 1000, 15) == 64  # a run's settled hyp.yaml
    assert steps_batch("auto", {}, 64, 118_287, 300) == 64  # COCO: SGD's long schedule
    assert steps_batch("auto", {}, 16, 10, 1) == 16  # 16 and below are as tuned


def test_train_lowers_the_batch_and_says_so(tiny_data, tmp_path, caplog):
    import logging

    import train
    from helpers import hyp_file

    with caplog.at_level(logging.INFO):
        out = train.run(data=str(tiny_data), hyp=str(hyp_file(tmp_path, min_steps=10)), epochs=2, imgsz=64,
                        batch_size=24, workers=0, noval=True, noplots=True, amp="off", project=str(tmp_path))
    assert "batch 24 would give this run of 2 epochs on 24 images only 2 optimizer steps; training at batch 16" \
        in caplog.text
    import yaml

    assert yaml.safe_load((out.save_dir / "opt.yaml").read_text())["batch_size"] == 16
