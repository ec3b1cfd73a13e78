"""IoU, COCO-style matching and AP (hand-worked and against pycocotools), confusion matrix, fitness."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from utils.report.metrics import (IOU_THRESHOLDS, ConfusionMatrix, ap_per_class, box_iou, fitness, greedy_match,
                                  match_predictions)


def test_box_iou_known_values_and_fp32():
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[0.0, 0.0, 10.0, 10.0], [5.0, 0.0, 15.0, 10.0], [20.0, 20.0, 30.0, 30.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(box_iou(a, b), torch.tensor([[1.0, 50 / 150, 0.0, 0.0]]))
    assert box_iou(a.half(), b.bfloat16()).dtype == torch.float32
    assert box_iou(a, b[:0]).shape == (1, 0)


def test_match_is_per_threshold_and_confidence_first():
    label = torch.tensor([[0, 0.0, 0.0, 10.0, 10.0]])
    # the half box (IoU 0.5) has the higher confidence, so it claims the label at IoU 0.5; from 0.55 up
    # it no longer qualifies and the exact box takes the label instead
    det = torch.tensor([[0.0, 0.0, 10.0, 10.0, 0.9, 0], [0.0, 0.0, 10.0, 5.0, 0.95, 0]])
    correct = match_predictions(det, label)
    assert correct[1].tolist() == [True] + [False] * 9
    assert correct[0].tolist() == [False] + [True] * 9
    det[:, 5] = 1  # wrong class: never a match
    assert not match_predictions(det, label).any()
    assert match_predictions(det[:0], label).shape == (0, 10)
    assert not match_predictions(det, label[:0]).any()


def _sequential_reference(cand: torch.Tensor, quality: torch.Tensor) -> torch.Tensor:
    """The COCOeval loop: each prediction in turn takes the best free candidate (last one on ties)."""
    T, n, m = cand.shape
    out = torch.full((T, n), -1)
    for t in range(T):
        free = [True] * m
        for i in range(n):
            best, best_q = -1, -2.0
            for j in range(m):
                if cand[t, i, j] and free[j] and quality[i, j] >= best_q:
                    best, best_q = j, float(quality[i, j])
            if best >= 0:
                free[best] = False
                out[t, i] = best
    return out


def test_greedy_match_equals_sequential_loop():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n, m = int(torch.randint(1, 12, (1,), generator=g)), int(torch.randint(1, 7, (1,), generator=g))
        q = torch.rand(n, m, generator=g).double()
        if trial % 3 == 0:
            q = (q * 4).round() / 4  # many ties
        cand = q[None] >= torch.tensor([0.1, 0.4, 0.7], dtype=torch.float64)[:, None, None]
        assert torch.equal(greedy_match(cand, q), _sequential_reference(cand, q)), trial


def _hand_case():
    # class 0: 3 labels; predictions by confidence: TP, FP, TP, FP, FP
    #   cum TP 1 1 2 2 2 -> recall 1/3 1/3 2/3 2/3 2/3, precision 1 .5 2/3 .5 .4
    #   envelope (max to the right) 1 2/3 2/3 .5 .4
    #   recall points 0.00..0.33 (34) -> 1; 0.34..0.66 (33) -> 2/3; 0.67..1.00 (34) -> 0 (never reached)
    #   AP = (34 * 1 + 33 * 2/3) / 101 = 56/101
    # class 1: 1 label; predictions FP (0.95), TP (0.4): recall 0 1, precision 0 .5, envelope .5 .5
    #   every recall point -> 0.5, AP = 0.5
    # class 2: a prediction but no labels: ignored, as COCO ignores categories without ground truth
    conf = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.95, 0.4, 0.99])
    pred_cls = np.array([0, 0, 0, 0, 0, 1, 1, 2])
    hit = np.array([1, 0, 1, 0, 0, 0, 1, 0], dtype=bool)
    tp = np.repeat(hit[:, None], 10, 1)  # same outcome at every IoU threshold
    target_cls = np.array([0, 0, 0, 1])
    return tp, conf, pred_cls, target_cls


def test_ap_hand_worked():
    res = ap_per_class(*_hand_case())
    assert res.classes.tolist() == [0, 1] and res.n_labels.tolist() == [3, 1]
    np.testing.assert_allclose(res.ap[:, 0], [56 / 101, 0.5], atol=1e-12)
    np.testing.assert_allclose(res.ap.mean(1), [56 / 101, 0.5], atol=1e-12)
    assert res.map50 == pytest.approx((56 / 101 + 0.5) / 2, abs=1e-12)
    # mean F1 peaks when every prediction is kept (class 0: P .4 R 2/3, class 1: P .5 R 1)
    np.testing.assert_allclose(res.p, [0.4, 0.5])
    np.testing.assert_allclose(res.r, [2 / 3, 1.0])
    assert res.pr_curve.shape == (2, 101) and res.f1_curve.shape == (2, 1000)


def test_ap_order_of_input_does_not_matter():
    tp, conf, pred_cls, target_cls = _hand_case()
    perm = np.random.default_rng(0).permutation(len(conf))
    a, b = ap_per_class(tp, conf, pred_cls, target_cls), ap_per_class(tp[perm], conf[perm], pred_cls[perm], target_cls)
    np.testing.assert_array_equal(a.ap, b.ap)


def test_ap_edge_cases():
    no_preds = ap_per_class(np.zeros((0, 10), bool), np.zeros(0), np.zeros(0), np.array([0, 1]))
    assert no_preds.ap.tolist() == [[0.0] * 10] * 2 and no_preds.mp == 0.0
    no_labels = ap_per_class(np.ones((2, 10), bool), np.array([0.5, 0.4]), np.array([0, 1]), np.zeros(0))
    assert no_labels.ap.shape == (0, 10) and no_labels.map == 0.0
    perfect = ap_per_class(np.ones((1, 10), bool), np.array([0.5]), np.array([3]), np.array([3]))
    assert perfect.map == 1.0 and perfect.p.tolist() == [1.0] and perfect.r.tolist() == [1.0]


def test_fitness():
    class R:
        map50, map = 0.6, 0.4

    assert fitness(R()) == pytest.approx(0.1 * 0.6 + 0.9 * 0.4)
    assert fitness([0.9, 0.8, 0.6, 0.4]) == pytest.approx(0.42)


def test_confusion_matrix_hand_case():
    cm = ConfusionMatrix(nc=2)
    labels = torch.tensor([[0, 0, 0, 10, 10], [1, 20, 20, 30, 30], [1, 40, 40, 50, 50.0]])
    det = torch.tensor([
        [0, 0, 10, 10, 0.9, 0],  # right class on label 0 -> [0, 0]
        [20, 20, 30, 31, 0.8, 0],  # wrong class on label 1 -> [0, 1]
        [60, 60, 70, 70, 0.7, 1],  # on nothing -> background column [1, 2]
        [40, 40, 50, 50, 0.1, 1],  # below conf 0.25: dropped, so label 2 is missed -> [2, 1]
    ])
    cm.process_batch(det, labels)
    assert cm.matrix.tolist() == [[1, 1, 0], [0, 0, 1], [0, 1, 0]]
    cm.process_batch(None, torch.tensor([[0, 0, 0, 5, 5.0]]))  # image without detections: its label is missed
    assert cm.matrix[2].tolist() == [1, 1, 0]
    tp, fp = cm.tp_fp()
    assert tp.tolist() == [1, 0] and fp.tolist() == [1, 1]


def test_confusion_matrix_one_to_one():
    cm = ConfusionMatrix(nc=1)
    labels = torch.tensor([[0, 0, 0, 10, 10.0]])
    det = torch.tensor([[0, 0, 10, 10, 0.9, 0], [0, 0, 10, 9, 0.8, 0]])  # both overlap the one label
    cm.process_batch(det, labels)
    assert cm.matrix.tolist() == [[1, 1], [0, 0]]  # the second is a false alarm, not a second hit


@pytest.mark.slow
def test_agreement_with_pycocotools_on_coco128(coco128_dir, tmp_path):
    pytest.importorskip("pycocotools")
    from helpers import image_pairs, load_ground_truth, make_predictions

    import validator

    preds = make_predictions(coco128_dir, seed=0)
    assert 1000 < len(preds)
    ground_truth = load_ground_truth(coco128_dir)
    res = validator.score_predictions(image_pairs(preds, ground_truth), nc=len(ground_truth[2]))  # test.py's code
    ours = res.map50, res.map
    (tmp_path / "predictions.json").write_text(json.dumps(preds))
    coco = validator.coco_evaluate(coco128_dir / "annotations.json", tmp_path / "predictions.json",
                                   [im["id"] for im in ground_truth[0]["images"]])
    theirs = coco["map50"], coco["map"]
    assert 0.2 < theirs[1] < theirs[0] < 0.9  # a meaningful, non-trivial operating point
    assert abs(ours[0] - theirs[0]) < 0.005, (ours, theirs)  # mAP@0.5
    assert abs(ours[1] - theirs[1]) < 0.005, (ours, theirs)  # mAP@0.5:0.95


def test_iou_thresholds_are_cocos():
    np.testing.assert_allclose(IOU_THRESHOLDS, np.arange(0.5, 0.951, 0.05))
