"""bench/grad_fidelity.py: the measurement leaves training alone and tells FP32 from bf16."""
from __future__ import annotations

import csv

import pytest
import torch

from models.yolo import Model

from bench import grad_fidelity


def test_fp32_recomputed_agrees_exactly_and_bf16_does_not(micro, tmp_path):
    out = tmp_path / "g.csv"
    rows = grad_fidelity.main(["--data", str(micro), "--imgsz", "64", "--batch-size", "4", "--epochs", "3",
                               "--steps", "0", "1", "--modes", "off", "bf16", "bf16-weights", "bf16-head32",
                               "--workers", "0",
                               "--project", str(tmp_path / "runs"), "--out", str(out)])
    assert [(r["step"], r["mode"]) for r in rows] == [(s, m) for s in (0, 1)
                                                       for m in ("off", "bf16", "bf16-weights", "bf16-head32")]
    assert list(csv.DictReader(open(out)))[5]["mode"] == "bf16"
    for r in rows:
        assert r["backbone_grad_norm"] > 0
        if r["mode"] == "off":  # the same weights, batch and BatchNorm state: the same gradient
            assert r["mean_cos"] == pytest.approx(1, abs=1e-6) and r["median_rel_err"] < 1e-5
        else:
            assert -1 <= r["p10_cos"] <= r["mean_cos"] < 1 - 1e-6 and r["median_rel_err"] > 1e-4


def test_the_rounded_weights_gradient_puts_the_weights_and_gradients_back():
    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=2).train()
    before = [p.detach().clone() for p in model.parameters()]
    next(model.parameters()).grad = torch.ones_like(next(model.parameters()))  # an accumulated gradient

    def loss(preds, targets):
        return sum(p.float().square().mean() for p in preds), None

    imgs = torch.rand(2, 3, 64, 64)
    got = grad_fidelity.rounded_weights_gradients(model, loss, imgs, torch.zeros(0, 6))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert torch.equal(next(model.parameters()).grad, torch.ones_like(before[0]))
    ref = grad_fidelity.batch_gradients(model, loss, imgs, torch.zeros(0, 6), grad_fidelity.Precision("off", "cpu"))
    assert set(got) == set(ref) and any(not torch.equal(got[k], ref[k]) for k in ref)


def test_fp32_head_runs_only_the_detect_convs_in_fp32_and_puts_them_back():
    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=2).train()
    imgs = torch.rand(1, 3, 64, 64)
    names = [k for k, _ in model.named_parameters()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert {p.dtype for p in model(imgs)} == {torch.bfloat16}
        with grad_fidelity.fp32_head(model):
            assert {p.dtype for p in model(imgs)} == {torch.float32}
            assert [k for k, _ in model.named_parameters()] == names  # the gradients keep their keys
        assert {p.dtype for p in model(imgs)} == {torch.bfloat16}
    assert all("forward" not in vars(c) for c in model.model[-1].m)
