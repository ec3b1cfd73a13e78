"""What a training run draws and logs: TensorBoard curves (the results columns per epoch, every step once), labels.jpg
and the train_batch / val_batch pictures (none with --noplots), every batch at --imgsz without --multi-scale."""
from __future__ import annotations

import cv2
import pytest
from helpers import batch_recorder as _batch_recorder, read_curves

import train
from utils.report.results import COLUMNS as RESULTS_COLUMNS, read_rows

pytestmark = pytest.mark.slow  # every test here trains a run

pytest.importorskip("tensorboard")

TINY = dict(imgsz=64, batch_size=8, workers=0, amp="bf16", seed=3)
NB = 3  # tiny_data: 24 training images in batches of 8
STEP_TAGS = {"step/box_loss", "step/obj_loss", "step/cls_loss", "step/lr0", "step/lr1", "step/lr2", "step/skipped_steps"}


@pytest.fixture(scope="module")
def plotted(tiny_data, tmp_path_factory):
    cb, seen = _batch_recorder()
    out = train.run(data=str(tiny_data), project=str(tmp_path_factory.mktemp("runs")), epochs=2, callbacks=cb, **TINY)
    return out, cb, seen


def test_event_file_holds_the_results_columns_per_epoch_and_contiguous_steps(plotted):
    out, cb, _ = plotted
    assert len(list(out.save_dir.glob("events.out.tfevents.*"))) == 1
    curves = read_curves(out.save_dir)
    epoch_tags = set(RESULTS_COLUMNS) - {"epoch"}
    assert set(curves) == epoch_tags | STEP_TAGS, "bf16 has no GradScaler: no step/scale"
    for tag in epoch_tags:
        assert [s for s, _ in curves[tag]] == [0, 1], tag
    for tag in STEP_TAGS:
        assert [s for s, _ in curves[tag]] == list(range(2 * NB)), tag  # every batch, once (default_every(3) == 1)
    rows = read_rows(out.save_dir / "results.csv")
    header, last = rows[0], dict(zip(rows[0], rows[-1]))
    assert "metrics/mAP_0.5" in header
    for tag in ("train/box_loss", "metrics/mAP_0.5:0.95", "val/cls_loss", "lr0"):
        assert curves[tag][1][1] == pytest.approx(float(last[tag]), rel=1e-5, abs=1e-7), tag
    lr0 = [v for _, v in curves["step/lr0"]]
    assert all(0 <= v < 1 for v in lr0) and lr0[0] < lr0[1] < lr0[2], "warmup: the lr of each step"
    assert curves["step/skipped_steps"][-1][1] == 0
    assert "on_train_start" not in cb, "the run's own observers went into a copy, not the caller's Callbacks"


def test_pictures_of_a_run(plotted):
    d = plotted[0].save_dir
    names = ["labels.jpg", "train_batch0.jpg", "train_batch1.jpg", "train_batch2.jpg", "val_batch0_labels.jpg",
             "val_batch0_pred.jpg"]  # 8 validation images: one validation batch
    for name in names:
        im = cv2.imread(str(d / name))
        assert im is not None and im.shape[0] >= 320, name
    assert not (d / "train_batch3.jpg").exists() and not (d / "val_batch1_labels.jpg").exists()


def test_noplots_run_draws_nothing_but_logs_curves(micro, tmp_path):
    out = train.run(data=str(micro), project=str(tmp_path), epochs=1, noplots=True, **TINY)
    assert sorted(p.name for p in out.save_dir.glob("*.jpg")) + sorted(p.name for p in out.save_dir.glob("*.png")) == []
    assert [s for s, _ in read_curves(out.save_dir)["step/box_loss"]] == [0]  # 8 images: one batch


def test_without_multi_scale_every_batch_is_imgsz(plotted):
    assert {shape[2:] for _, shape in plotted[2]} == {(64, 64)}
