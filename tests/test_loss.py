"""ComputeLoss: CIoU, target assignment, FP32 computation under autocast, learning signal."""
from __future__ import annotations

import pytest
import torch

from models.yolo import Model
from utils.engine.loss import ComputeLoss, bbox_ciou, loss_gains
from utils.hyp import load_hyp

HYP = load_hyp()


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
    assert g.box == pytest.approx(0.05) and g.obj == pytest.approx(0.25) and g.cls == pytest.approx(0.5 * 5 / 80)
    assert loss_gains(HYP, 3, 5, 320, cls_by_nc=False).cls == pytest.approx(0.5)
    assert loss_gains(HYP, 4, 80, 640).box == pytest.approx(0.0375)
    assert loss_gains(HYP, 3, 80, 640, box_gain=4.0).box == pytest.approx(0.2)
    assert HYP.cls == 0.5  # the caller's hyperparameters are not edited


@pytest.mark.slow
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


@pytest.mark.slow
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


def _raw_for(box: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """Raw outputs (4,) that decode to `box` (cx, cy relative to the cell corner, w, h; grid units)."""
    xy = torch.logit((box[:2] + 0.5) / 2)
    wh = torch.logit((box[2:] / anchor).sqrt() / 2)
    return torch.cat((xy, wh))


def test_dynamic_assignment_keeps_the_best_aligned_reachable_anchors(model):
    # the target of test_targets_go_to_their_cell_and_two_neighbours: the dynamic candidates add the
    # diagonal cell (1, 1), the fourth whose predicted centre can reach (2.25, 2.25)
    t = torch.tensor([[0, 1, 18 / 64, 18 / 64, 12 / 64, 12 / 64]])
    preds = [torch.zeros(1, 3, s, s, 8) for s in (8, 4, 2)]
    loss = ComputeLoss(model, HYP.updated(assign_topk=1000))
    (b, a, gj, gi), *_ = (x[0] for x in loss.match(preds, t, diagonal=True))
    assert set(zip(gj.tolist(), gi.tolist())) == {(2, 2), (2, 1), (1, 2), (1, 1)}
    everything = loss.match(preds, t, diagonal=True)
    kept = loss.assign_dynamic(preds, t)
    assert [len(x[0]) for x in kept[0]] == [len(x[0]) for x in everything[0]]  # k above the candidates: all kept

    # make one candidate (P3, anchor 1, cell (1, 1)) predict the target exactly: with k = 1 it is the one kept
    (b, a, gj, gi), tbox, _, _ = (x[0] for x in everything)
    j = next(n for n in range(len(b)) if (a[n], gj[n], gi[n]) == (1, 1, 1))
    preds[0][0, 1, 1, 1, :4] = _raw_for(tbox[j], loss.anchors[0][1])
    for soft in (0, 1):
        one = ComputeLoss(model, HYP.updated(assign_topk=1, assign_soft=soft))
        indices, tbox1, tcls1, tsoft1 = one.assign_dynamic(preds, t)
        assert sum(len(b) for b, *_ in indices) == 1  # one positive over all levels
        _, a1, gj1, gi1 = indices[0]
        assert (a1.tolist(), gj1.tolist(), gi1.tolist()) == ([1], [1], [1])
        assert torch.allclose(tbox1[0], tbox[j][None]) and tcls1[0].tolist() == [1]
        if soft:  # the best positive's class target is its IoU, here 1
            assert tsoft1[0].item() == pytest.approx(1.0, abs=1e-4)
        else:
            assert tsoft1[0] is None


def test_dynamic_assignment_gives_each_target_its_own_k_and_soft_targets_follow_alignment(model):
    torch.manual_seed(1)
    preds = [torch.randn(2, 3, s, s, 8) for s in (8, 4, 2)]
    t = torch.tensor([[0, 0, 0.3, 0.3, 0.2, 0.2], [0, 2, 0.7, 0.6, 0.3, 0.2], [1, 1, 0.5, 0.5, 0.4, 0.5]])
    loss = ComputeLoss(model, HYP.updated(assign_topk=3, assign_soft=1))
    indices, tboxes, tclasses, tsoft = loss.assign_dynamic(preds, t)
    counts = torch.bincount(torch.cat(tclasses), minlength=3)  # the classes are distinct per target
    assert counts.tolist() == [3, 3, 3]
    # a kept anchor's soft target is align / best align of its target * best IoU of its target, all in 0..1
    soft = torch.cat(tsoft)
    assert (soft >= 0).all() and (soft <= 1).all() and soft.max() > 0
    # each target's most aligned kept anchor gets that target's best IoU
    ious, cls_of = [], torch.cat(tclasses)
    for i, (p, (b, a, gj, gi), tbox) in enumerate(zip(preds, indices, tboxes)):
        ious.append(bbox_ciou(loss.decode(p[b, a, gj, gi], i, a), tbox, plain=True).clamp(0))
    ious = torch.cat(ious)
    for c in range(3):
        assert soft[cls_of == c].max().item() == pytest.approx(ious[cls_of == c].max().item(), rel=1e-5)


def test_dynamic_assignment_trains(model):
    model.train()
    loss_fn = ComputeLoss(model, loss_gains(HYP.updated(assign_topk=10, assign_soft=1), 3, 3, 64))
    t = torch.tensor([[0, 0, 0.5, 0.5, 0.3, 0.3], [1, 2, 0.3, 0.6, 0.2, 0.4]])
    total, items = loss_fn(model(torch.rand(2, 3, 64, 64)), t)
    assert torch.isfinite(items).all() and (items > 0).all() and 0 < loss_fn.last_positives <= 20
    total.backward()
    _, none = loss_fn(model(torch.rand(1, 3, 64, 64)), torch.zeros((0, 6)))
    assert none[0] == 0 and none[2] == 0 and none[1] > 0
