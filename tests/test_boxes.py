"""Box conversions, letterbox undo, and NMS properties."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from utils.boxes import clip_boxes, non_max_suppression, scale_boxes, xywh2xyxy, xywhn2xyxy, xyxy2xywh, xyxy2xywhn


def _random_xyxy(n: int, size: float = 640.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * size / 2
    wh = torch.rand(n, 2, generator=g) * size / 2 + 1
    return torch.cat([xy, xy + wh], 1)


def test_xywh_round_trip_torch_and_numpy():
    b = _random_xyxy(50)
    assert torch.allclose(xywh2xyxy(xyxy2xywh(b)), b, atol=1e-4)
    n = b.numpy().astype(np.float64)
    assert isinstance(xyxy2xywh(n), np.ndarray)
    np.testing.assert_allclose(xywh2xyxy(xyxy2xywh(n)), n, atol=1e-9)


def test_known_values_and_extra_columns_pass_through():
    b = torch.tensor([[10.0, 20.0, 30.0, 60.0, 0.5, 3.0]])
    assert xyxy2xywh(b).tolist() == [[20.0, 40.0, 20.0, 40.0, 0.5, 3.0]]
    assert xywh2xyxy(torch.tensor([[20.0, 40.0, 20.0, 40.0]])).tolist() == [[10.0, 20.0, 30.0, 60.0]]


def test_inputs_not_modified_and_half_input_gives_fp32():
    b = _random_xyxy(5).half()
    before = b.clone()
    out = xyxy2xywh(b)
    assert torch.equal(b, before) and out.dtype == torch.float32
    assert xywh2xyxy(np.array([[2, 2, 2, 2]])).dtype == np.float64  # integer input promoted, not truncated


def test_normalised_round_trip():
    b = _random_xyxy(20, 300).numpy().clip(0, 300).astype(np.float64)
    n = xyxy2xywhn(b, w=300, h=200)
    back = xywhn2xyxy(n, w=300, h=200)
    np.testing.assert_allclose(back, b, atol=1e-9)
    shifted = xywhn2xyxy(n, w=300, h=200, padw=5, padh=7)
    np.testing.assert_allclose(shifted - b, np.tile([5, 7, 5, 7], (len(b), 1)), atol=1e-9)


def test_clip_boxes():
    b = torch.tensor([[-5.0, -1.0, 700.0, 300.0]])
    assert clip_boxes(b, (200, 640)).tolist() == [[0.0, 0.0, 640.0, 200.0]]
    assert b.tolist() == [[-5.0, -1.0, 700.0, 300.0]]  # not in place


def test_scale_boxes_undoes_letterbox():
    # original 480x640 (h, w) letterboxed to 320x320: gain 0.5 -> 240x320 content, 40 px pad top and bottom
    orig = _random_xyxy(30, 480).clamp(0, 480)
    gain, padw, padh = 0.5, 0.0, 40.0
    boxed = orig * gain + torch.tensor([padw, padh, padw, padh])
    back = scale_boxes((320, 320), boxed, (480, 640), ratio_pad=((gain, gain), (padw, padh)))
    assert torch.allclose(back, orig, atol=1e-4)
    assert torch.allclose(scale_boxes((320, 320), boxed, (480, 640)), orig, atol=1e-4)  # reconstructed letterbox


def test_scale_boxes_reconstructs_the_loaders_letterbox():
    from utils.data.augment import letterbox

    im = np.zeros((333, 500, 3), np.uint8)  # odd sizes: rounded resize and an odd padding pixel
    out, (rx, ry), (padw, padh) = letterbox(im, 320, auto=False)
    orig = torch.tensor([[10.0, 20.0, 490.0, 300.0]])
    boxed = orig * torch.tensor([rx, ry, rx, ry]) + torch.tensor([padw, padh, padw, padh])
    back = scale_boxes(out.shape[:2], boxed, im.shape, ratio_pad=((ry, rx), (padw, padh)))
    assert torch.allclose(back, orig, atol=1e-3)
    assert torch.allclose(scale_boxes(out.shape[:2], boxed, im.shape), orig, atol=1e-3)


def test_scale_boxes_separate_axis_gains_and_clip():
    b = torch.tensor([[10.0, 20.0, 110.0, 220.0]])
    back = scale_boxes((256, 256), b, (100, 200), ratio_pad=((2.0, 1.0), (10.0, 20.0)))
    assert back.tolist() == [[0.0, 0.0, 100.0, 100.0]]


def _pred(rows: list[list[float]], nc: int) -> torch.Tensor:
    """rows of cx, cy, w, h, obj, cls_index, cls_score -> (1, n, 5 + nc) model-style output."""
    out = torch.zeros(1, len(rows), 5 + nc)
    for i, (cx, cy, w, h, obj, c, s) in enumerate(rows):
        out[0, i, :5] = torch.tensor([cx, cy, w, h, obj])
        out[0, i, 5 + int(c)] = s
    return out


def _random_pred(bs: int = 2, n: int = 400, nc: int = 5, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(bs, n, 2, generator=g) * 200
    wh = torch.rand(bs, n, 2, generator=g) * 60 + 5
    scores = torch.rand(bs, n, 1 + nc, generator=g)
    return torch.cat([xy, wh, scores], 2)


def test_nms_suppresses_overlap_and_computes_conf():
    pred = _pred([[50, 50, 20, 20, 0.9, 0, 0.8], [51, 50, 20, 20, 0.8, 0, 0.9], [150, 150, 20, 20, 0.5, 0, 0.5]], nc=2)
    out = non_max_suppression(pred, conf_thres=0.1, iou_thres=0.5)[0]
    assert out.shape == (2, 6)
    assert torch.allclose(out[:, 4], torch.tensor([0.72, 0.25]))  # obj x cls
    assert out[0, :4].tolist() == [40.0, 40.0, 60.0, 60.0]


def test_nms_sorted_fp32_and_max_det():
    pred = _random_pred()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        out = non_max_suppression(pred.to(dtype), conf_thres=0.01, iou_thres=0.5, max_det=30)
        for o in out:
            assert o.dtype == torch.float32 and o.shape[1] == 6 and 0 < len(o) <= 30
            assert torch.all(o[:-1, 4] >= o[1:, 4])
    assert all(len(o) == 7 for o in non_max_suppression(pred, 0.01, 0.5, max_det=7))


def test_nms_classes_are_separate_unless_agnostic():
    rows = [[50, 50, 20, 20, 0.9, 0, 0.9], [50, 50, 20, 20, 0.9, 1, 0.8]]
    assert len(non_max_suppression(_pred(rows, 2), 0.1, 0.5)[0]) == 2
    agn = non_max_suppression(_pred(rows, 2), 0.1, 0.5, agnostic=True)[0]
    assert len(agn) == 1 and agn[0, 5] == 0


def test_nms_classes_filter_and_multi_label():
    pred = _random_pred(nc=4)
    out = non_max_suppression(pred, 0.05, 0.5, classes=[1, 3])
    assert all(set(o[:, 5].unique().tolist()) <= {1.0, 3.0} for o in out)
    one = torch.tensor([[[50.0, 50, 20, 20, 1.0, 0.9, 0.6, 0.05]]])
    assert non_max_suppression(one, 0.1, 0.5, multi_label=True)[0][:, 5].tolist() == [0.0, 1.0]
    assert non_max_suppression(one, 0.1, 0.5, multi_label=False)[0][:, 5].tolist() == [0.0]


def test_nms_accepts_eval_output_tuple_and_empty():
    pred = _random_pred(bs=1)
    a = non_max_suppression((pred, [None]), 0.3, 0.5)[0]
    assert torch.equal(a, non_max_suppression(pred, 0.3, 0.5)[0])
    assert non_max_suppression(pred, conf_thres=1.0)[0].shape == (0, 6)


def test_nms_time_limit_warns(caplog):
    pred = _random_pred(bs=3)
    with caplog.at_level(logging.WARNING):
        out = non_max_suppression(pred, 0.01, 0.5, time_limit=0.0)
    assert "time limit" in caplog.text
    assert len(out) == 3 and len(out[2]) == 0


def test_nms_has_no_default_time_limit_so_every_image_counts(monkeypatch):
    """Validation's mAP must not depend on machine speed: even a clock that jumps a minute per call
    (a very slow machine) leaves every image its boxes."""
    import utils.boxes as boxes

    clock = iter(range(0, 10**6, 60))
    monkeypatch.setattr(boxes.time, "time", lambda: float(next(clock)))
    out = non_max_suppression(_random_pred(bs=4), 0.01, 0.5)
    assert all(len(o) > 0 for o in out)


def test_nms_candidates_are_capped_to_the_most_confident(monkeypatch):
    import utils.boxes as boxes

    pred = _random_pred(bs=1, n=400)
    monkeypatch.setattr(boxes, "MAX_NMS_CANDIDATES", 10)
    out = non_max_suppression(pred, 0.0, 1.0, agnostic=True)[0]  # iou 1.0: NMS removes nothing
    assert len(out) == 10
    conf = pred[0, :, 4:5] * pred[0, :, 5:]
    assert torch.allclose(out[:, 4], conf.max(1).values.topk(10).values)


def _reference_nms(pred: torch.Tensor, conf_thres: float, iou_thres: float, max_det: int, agnostic: bool):
    """The plain definition: every (box, class) pair above conf_thres, the MAX_NMS_CANDIDATES most confident,
    torchvision's batched NMS over all of them, the first max_det kept."""
    import torchvision

    from utils.boxes import MAX_NMS_CANDIDATES, xywh2xyxy

    out = []
    for x in pred:
        scores = x[:, 5:] * x[:, 4:5]
        i, j = (scores > conf_thres).nonzero(as_tuple=True)
        boxes, conf, cls = xywh2xyxy(x[i, :4]), scores[i, j], j.float()
        top = conf.topk(min(len(conf), MAX_NMS_CANDIDATES)).indices
        boxes, conf, cls = boxes[top], conf[top], cls[top]
        keep = torchvision.ops.batched_nms(boxes, conf, torch.zeros_like(cls) if agnostic else cls, iou_thres)[:max_det]
        out.append(torch.cat((boxes[keep], conf[keep, None], cls[keep, None]), 1))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("max_det", [1, 30, 60, 300, 3000])
@pytest.mark.parametrize("agnostic", [False, True])
def test_nms_over_a_prefix_of_the_candidates_gives_exactly_nms_over_all(max_det, agnostic):
    """Validation's NMS first runs over the 4 * max_det most confident candidates and over all only if
    those leave fewer than max_det: the boxes, scores, classes and order must be those of NMS over every
    candidate (capped) whether the short try fills (max_det 1, 30, 60 per class) or not (60 agnostic and
    300 over heavily overlapping boxes; 3000, where it is all of them already)."""
    pred = _random_pred(bs=3, n=1500, nc=8, seed=max_det)
    pred[..., :2] = pred[..., :2] / 4 + 100  # crowd the boxes together: most pairs overlap, many are suppressed
    # distinct scores: NMS orders equal scores arbitrarily, so ties would make "the same result" ill-defined
    g = torch.Generator().manual_seed(1)
    pred[..., 4] = 1.0
    n = pred[..., 5:].numel()
    pred[..., 5:] = (torch.randperm(n, generator=g) + 1).view(pred[..., 5:].shape) / (n + 1)
    for iou in (0.3, 0.6):
        ours = non_max_suppression(pred, 0.001, iou, multi_label=True, agnostic=agnostic, max_det=max_det)
        ref = _reference_nms(pred, 0.001, iou, max_det, agnostic)
        for o, r in zip(ours, ref):
            assert torch.equal(o, r)


def test_nms_rejects_bad_thresholds():
    with pytest.raises(ValueError):
        non_max_suppression(_random_pred(), conf_thres=1.5)
