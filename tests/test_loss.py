"""ComputeLoss: CIoU, target assignment, FP32 computation under autocast, learning signal."""
from __future__ import annotations

import pytest
import torch

from models.yolo import Model
from utils.loss import ComputeLoss, bbox_ciou, loss_gains

HYP = {"box": 0.05, "obj": 1.0, "cls": 0.5, "cls_pw": 1.0, "obj_pw": 1.0, "anchor_t": 4.0}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Model("yolov5n.yaml", nc=3)


def test_ciou_is_iou_for_concentric_same_shape_boxes_and_penalises_distance():
    a = torch.tensor([[10.0, 10.0, 4.0, 4.0]])
    assert bbox_ciou(a, a).item() == pytest.approx(1.0, abs=1e-5)
    b = torch.tensor([[10.0, 10.0, 2.0, 2.0]])  # same centre and aspect: CIoU == IoU == 4/16
    assert bbox_ciou(a, b).item() == pytest.approx(0.25, abs=1e-5)
    far = torch.tensor([[30.0, 10.0, 4.0, 4.0]])  # disjoint: IoU 0, distance penalty 400/24^2+4^2=...
    assert bbox_ciou(a, far).item() == pytest.approx(-(20.0**2) / (24.0**2 + 4.0**2), abs=1e-4)


def test_targets_go_to_their_cell_and_two_neighbours(model):
    loss = ComputeLoss(model, HYP)
    preds = [torch.zeros(1, 3, s, s, 8) for s in (8, 4, 2)]  # a 64 px image
    # one 12x12 px box centred at (18, 18) px = grid (2.25, 2.25) on P3: cell (2, 2), nearer its left/top neighbours
    t = torch.tensor([[0, 1, 18 / 64, 18 / 64, 12 / 64, 12 / 64]])
    (b, a, gj, gi), tbox, tcls = (x[0] for x in loss.build_targets(preds, t))
    cells = set(zip(gj.tolist(), gi.tolist()))
    assert cells == {(2, 2), (2, 1), (1, 2)}
    assert (tcls == 1).all() and (b == 0).all()
    # anchors of P3 are 10x13, 16x30, 33x23 px: 12x12 is within ratio 4 of all three
    assert sorted(set(a.tolist())) == [0, 1, 2]
    assert torch.allclose(tbox[:, 2:], torch.full((len(b), 2), 12 / 8))


def test_loss_gains_scale_with_levels_size_and_optionally_class_count():
    g = loss_gains(HYP, 3, 5, 320)
    assert g["box"] == pytest.approx(0.05) and g["obj"] == pytest.approx(0.25) and g["cls"] == pytest.approx(0.5 * 5 / 80)
    assert loss_gains(HYP, 3, 5, 320, cls_by_nc=False)["cls"] == pytest.approx(0.5)
    assert loss_gains(HYP, 4, 80, 640)["box"] == pytest.approx(0.0375)
    assert loss_gains(HYP, 3, 80, 640, box_gain=4.0)["box"] == pytest.approx(0.2)
    assert HYP["cls"] == 0.5  # the caller's dict is not edited


def test_loss_is_fp32_under_bf16_autocast_and_has_gradients(model):
    model.train()
    loss_fn = ComputeLoss(model, loss_gains(HYP, 3, 3, 64))
    x = torch.rand(2, 3, 64, 64)
    t = torch.tensor([[0, 0, 0.5, 0.5, 0.3, 0.3], [1, 2, 0.3, 0.6, 0.2, 0.4]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        total, items = loss_fn(model(x), t)
    assert total.dtype == torch.float32 and items.shape == (3,) and torch.isfinite(items).all()
    total.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.zero_grad()


def test_no_targets_gives_objectness_loss_only(model):
    model.train()
    _, items = ComputeLoss(model, HYP)(model(torch.rand(1, 3, 64, 64)), torch.zeros((0, 6)))
    assert items[0] == 0 and items[2] == 0 and items[1] > 0


def test_a_few_steps_reduce_the_loss_on_one_batch():
    torch.manual_seed(0)
    m = Model("yolov5n.yaml", nc=2).train()
    loss_fn = ComputeLoss(m, loss_gains(HYP, 3, 2, 64))
    x = torch.rand(2, 3, 64, 64)
    t = torch.tensor([[0, 0, 0.5, 0.5, 0.4, 0.4], [1, 1, 0.3, 0.3, 0.3, 0.2]])
    opt = torch.optim.AdamW(m.parameters(), lr=2e-3)
    first = None
    for _ in range(15):
        total, _ = loss_fn(m(x), t)
        first = first if first is not None else total.item()
        opt.zero_grad()
        total.backward()
        opt.step()
    assert total.item() < 0.7 * first
