"""AutoAnchor: the fit figures, when anchors are replaced, determinism, and anchors travelling in checkpoints."""
from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest
import torch

import train
from models.yolo import Model, build_model
from utils.engine.autoanchor import BPR_TARGET, check_anchors, evolve_anchors, fit, kmeans
from utils.engine.checkpoint import load_checkpoint
from utils.engine.loss import ComputeLoss, loss_gains
from utils.hyp import load_hyp

HYP = load_hyp()


def _wide_labels(n_images: int = 20, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """Images of 256x256 whose boxes are long thin bars (w/h about 12): the default anchors cannot match them."""
    rng = np.random.default_rng(seed)
    shapes = np.full((n_images, 2), 256)
    labels = []
    for _ in range(n_images):
        n = 3
        w = rng.uniform(0.5, 0.9, n)
        h = w / rng.uniform(10, 14, n)
        labels.append(np.stack([np.zeros(n), np.full(n, 0.5), rng.uniform(0.2, 0.8, n), w, h], 1))
    return shapes, labels


def test_fit_figures_count_matches_within_anchor_t():
    anchors = np.array([[10.0, 10.0], [40.0, 40.0]])
    wh = np.array([[10.0, 10.0], [30.0, 30.0], [200.0, 5.0]])
    f = fit(wh, anchors, 4.0)
    # the first box matches one anchor (ratio 0.25 to the second is not above 1/4), the second both, the bar none
    assert f.bpr == pytest.approx(2 / 3)
    assert f.aat == pytest.approx((1 + 2 + 0) / 3)


def test_kmeans_finds_separated_clusters():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 0.1, (50, 2)), rng.normal(5, 0.1, (50, 2))])
    c = kmeans(x, 2, np.random.default_rng(1))
    assert sorted(np.round(c[:, 0]).tolist()) == [0.0, 5.0]


@pytest.mark.slow
def test_check_anchors_replaces_poor_anchors_deterministically():
    shapes, labels = _wide_labels()
    m1, m2, m3 = (Model("yolov5n.yaml", nc=1) for _ in range(3))
    default = m1.model[-1].anchors.clone()
    before, after = check_anchors(m1, shapes, labels, 256, 4.0, seed=0)
    assert before.bpr < BPR_TARGET and after is not None and after.bpr > before.bpr and after.bpr >= 0.98
    assert not torch.equal(m1.model[-1].anchors, default)
    check_anchors(m2, shapes, labels, 256, 4.0, seed=0)
    assert torch.equal(m1.model[-1].anchors, m2.model[-1].anchors)  # same seed, same anchors
    area = (m1.model[-1].anchors * m1.model[-1].stride.view(-1, 1, 1)).prod(-1).flatten()
    assert torch.all(area[1:] >= area[:-1])  # smallest anchors on the finest level
    # good anchors are kept as they are
    square = [np.array([[0, 0.5, 0.5, 0.1, 0.1]])] * 5
    assert check_anchors(m3, np.full((5, 2), 256), square, 256, 4.0, seed=0)[1] is None
    assert torch.equal(m3.model[-1].anchors, default)


def test_evolution_does_not_lower_the_kmeans_fitness():
    from utils.engine.autoanchor import fitness

    rng = np.random.default_rng(0)
    wh = rng.uniform(5, 100, (300, 2))
    base = kmeans(wh / wh.std(0), 9, np.random.default_rng(3)) * wh.std(0)
    evolved = evolve_anchors(wh, 9, 4.0, np.random.default_rng(3), generations=200)
    assert fitness(wh, evolved, 4.0) >= fitness(wh, base, 4.0) - 1e-12


def test_loss_reads_the_anchors_the_model_has_now():
    """AutoAnchor and resume replace the anchors after the loss exists; the loss must see the new ones."""
    model = Model("yolov5n.yaml", nc=2)
    loss = ComputeLoss(model, loss_gains(HYP, 3, 2, 64))
    model.model[-1].anchors.mul_(2)
    assert torch.equal(loss.anchors, model.model[-1].anchors)


@pytest.fixture(scope="module")
def bars_data(tmp_path_factory):
    """8 train / 4 val plain images with long thin bar boxes, as a data YAML."""
    root = tmp_path_factory.mktemp("bars")
    _, labels = _wide_labels(12, seed=1)
    for split, idx in (("train", range(8)), ("val", range(8, 12))):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in idx:
            img = np.full((128, 128, 3), 90, np.uint8)
            rows = []
            for _, cx, cy, w, h in labels[i]:
                x1, y1, x2, y2 = (int((cx - w / 2) * 128), int((cy - h / 2) * 128), int((cx + w / 2) * 128),
                                  int((cy + h / 2) * 128))
                cv2.rectangle(img, (x1, y1), (x2, y2), (230, 40, 40), -1)
                rows.append(f"0 {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}")
            cv2.imwrite(str(root / "images" / split / f"{i}.png"), img)
            (root / "labels" / split / f"{i}.txt").write_text("\n".join(rows) + "\n")
    yaml_path = root / "bars.yaml"
    yaml_path.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: bar\n")
    return yaml_path


@pytest.mark.slow
def test_train_fits_anchors_and_they_travel_in_the_checkpoint(bars_data, tmp_path, caplog):
    default = Model("yolov5n.yaml", nc=1).model[-1].anchors
    kw = dict(data=str(bars_data), epochs=1, imgsz=128, batch_size=4, workers=0, noplots=True, project=str(tmp_path))
    with caplog.at_level(logging.INFO):
        out = train.run(name="fit", **kw)
    assert "best possible recall" in caplog.text and "new anchors" in caplog.text
    ckpt = load_checkpoint(out.save_dir / "weights" / "best.pt")
    anchors = build_model(ckpt).model[-1].anchors
    assert not torch.allclose(anchors, default)
    assert torch.allclose(anchors, out.ema.model[-1].anchors, rtol=1e-3)  # FP16 checkpoint of the same values
    kept = train.run(name="keep", noautoanchor=True, **kw)
    assert torch.equal(build_model(load_checkpoint(kept.save_dir / "weights" / "best.pt")).model[-1].anchors.float(),
                       default)


def test_no_boxes_claim_no_recall(caplog):
    """A training set without a box (its labels in a misnamed folder, say) reported 'best possible recall 1.0000:
    the anchors fit the dataset'; there is nothing to fit, and AutoAnchor says so."""
    m = Model("yolov5n.yaml", nc=1)
    default = m.model[-1].anchors.clone()
    with caplog.at_level(logging.INFO):
        assert check_anchors(m, np.full((4, 2), 256), [np.zeros((0, 5), np.float32)] * 4, 256, 4.0, seed=0)[1] is None
    assert "recall" not in caplog.text and "no boxes" in caplog.text
    assert torch.equal(m.model[-1].anchors, default)
