"""bench/val_noise.py: the split-half estimate must tell training's spread from the val set's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bench import val_noise


def mean_score(model, idx):
    return float(np.mean([model[i] for i in idx]))


def test_models_that_differ_only_by_a_constant_are_all_training_spread():
    models = [[t] * 40 for t in (0.1, 0.2, 0.4, 0.3)]  # every image scores the model's own level
    var_full, cov = val_noise.split_half(models, mean_score, 20, np.random.default_rng(0))
    assert var_full == pytest.approx(np.var([0.1, 0.2, 0.4, 0.3], ddof=1))
    assert cov == pytest.approx(var_full)


def test_models_of_equal_quality_have_only_val_set_spread():
    rng = np.random.default_rng(1)
    models = [list(rng.normal(0.3, 0.2, 200)) for _ in range(10)]  # per-image luck, no model better than another
    var_full, cov = val_noise.split_half(models, mean_score, 200, np.random.default_rng(0))
    assert var_full > 0 and abs(cov) < 0.25 * var_full


def test_mixed_spread_recovers_the_training_part():
    rng = np.random.default_rng(2)
    levels = np.linspace(0.2, 0.4, 10)
    models = [list(t + rng.normal(0, 0.3, 400)) for t in levels]
    var_full, cov = val_noise.split_half(models, mean_score, 300, np.random.default_rng(0))
    # the full-set variance is the levels' plus per-image noise / 400; the halves' covariance keeps the levels'
    assert cov == pytest.approx(np.var(levels, ddof=1), rel=0.35) and var_full > cov


def image(n_labels, hits, misses, conf=0.9):
    """n_labels of class 0, `hits` detections matching at every IoU threshold, `misses` that match none."""
    correct = np.array([[True] * 10] * hits + [[False] * 10] * misses, dtype=bool).reshape(-1, 10)
    confs = np.array([conf] * hits + [conf + 0.05] * misses, dtype=np.float32)
    return correct, confs, np.zeros(hits + misses, np.float32), np.zeros(n_labels, np.float32)


def test_map_of_counts_repeated_images_and_bootstrap_of_identical_images_is_zero():
    perfect, poor = image(2, 2, 0), image(2, 0, 2)
    assert val_noise.map_of([perfect, poor], np.array([0])) == pytest.approx(1.0)
    assert val_noise.map_of([perfect, poor], np.array([1])) == 0.0
    half = val_noise.map_of([perfect, poor], np.array([0, 1]))
    assert 0 < half < 1 and val_noise.map_of([perfect, poor], np.array([0, 0, 1])) > half
    assert val_noise.bootstrap_se([perfect] * 5, val_noise.map_of, 20, np.random.default_rng(0)) == 0.0
    assert val_noise.bootstrap_se([perfect, poor] * 3, val_noise.map_of, 50, np.random.default_rng(0)) > 0.05


def test_image_stats_hold_every_val_image_with_its_labels(tiny_data, tmp_path):
    import validator
    from models.yolo import Model
    from utils.engine.checkpoint import atomic_save, make_checkpoint
    from utils.data.data_config import load_data_config

    names = list(load_data_config(tiny_data)["names"])
    torch.manual_seed(0)
    m = Model("yolov5n.yaml", nc=len(names))
    ckpt = tmp_path / "m.pt"
    atomic_save(make_checkpoint(m, m.yaml, names, epoch=0), ckpt)
    stats = val_noise.image_stats(str(ckpt), str(tiny_data), 64, workers=0)
    res = validator.run(tiny_data, weights=ckpt, imgsz=64, workers=0, project=tmp_path, plots=False)
    label_files = sorted((tiny_data.parent / "shapes" / "labels" / "val").glob("*.txt"))
    want = sorted(int(r.split()[0]) for f in label_files for r in f.read_text().splitlines() if r.strip())
    assert len(stats) == len(label_files) == 8
    assert sorted(int(c) for s in stats for c in s[3]) == want and res.nt.sum() == len(want)
    for correct, conf, pcls, _ in stats:  # an untrained head still proposes boxes at conf 0.001
        assert correct.shape == (len(conf), 10) and len(pcls) == len(conf)
    assert sum(len(s[1]) for s in stats) > 0


def test_fewer_than_three_checkpoints_are_refused_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="at least 3 checkpoints"):
        val_noise.main(["--data", "x.yaml", "--imgsz", "64",
                        "--weights", str(tmp_path / "a.pt"), str(tmp_path / "b.pt")])
