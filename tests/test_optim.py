"""The update under AMP: step order, skipping non-finite steps, state round trips; parameter groups; EMA."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from utils.engine.amp import Precision
from utils.engine.ema import ModelEMA
from utils.engine.optim import apply_warmup, build_optimizer, lr_lambda
from utils.hyp import load_hyp
from utils.engine.updater import AmpUpdater


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
    hyp = load_hyp().updated(warmup_bias_lr=0.1, warmup_momentum=0.8)
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
    """Two identical AdamW set-ups: one fused (the update stays on the device), one with the default kernel.

    The convolution has no bias, as in the models' Conv blocks: a bias before BatchNorm has an analytical gradient
    of 0, so its computed one is round-off (7e-9 here), and Adam's step on it, lr * g / (|g| + eps), is about lr
    with a sign set by that round-off. The two kernels round the other weights 1e-8 apart after one step, and on
    an AMD EPYC that flipped this bias's next step: 0.0076 apart, with both kernels right."""
    out = []
    for fused in (True, False):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(64, 2))
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
    for p, ref in zip(net.parameters(), ref_net.parameters()):  # the skipped step left Adam's state alone too
        a, b = up.optimizer.state[p], ref_up.optimizer.state[ref]
        assert float(a["step"]) == float(b["step"]) == 2.0
        assert torch.allclose(a["exp_avg"], b["exp_avg"], atol=1e-6) and torch.isfinite(a["exp_avg_sq"]).all()
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
