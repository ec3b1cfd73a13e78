"""train.py end to end on tiny data: outputs, checkpoints, the bf16 path, validation purity, fine-tuning."""
from __future__ import annotations

import csv
import logging
from types import SimpleNamespace

import pytest
import torch
from helpers import hyp_file

import train
from utils.engine.train_options import check_options
import validator
from utils.data.data_config import load_data_config
from utils.data.datasets import create_dataloader
from utils.engine import optim
from utils.engine.callbacks import Callbacks
from utils.engine.checkpoint import load_checkpoint
from utils.engine.ema import ModelEMA
from utils.errors import UserError
from utils.report.results import COLUMNS as RESULTS_COLUMNS, read_rows

TINY = dict(epochs=2, imgsz=64, batch_size=8, workers=0, noplots=True)


@pytest.fixture(scope="module")
def bf16_run(tiny_data, bf16_hyp, tmp_path_factory):
    return train.run(data=str(tiny_data), amp="bf16", hyp=str(bf16_hyp), project=str(tmp_path_factory.mktemp("runs")),
                     **TINY)


@pytest.mark.slow
def test_run_writes_stripped_fp16_checkpoints_results_and_config(bf16_run):
    d = bf16_run.save_dir
    for f in ("opt.yaml", "hyp.yaml", "results.csv", "weights/best.pt", "weights/last.pt"):
        assert (d / f).is_file(), f
    rows = list(csv.DictReader(open(d / "results.csv")))
    assert [r["epoch"] for r in rows] == ["0", "1"]
    assert all(float(r["train/box_loss"]) > 0 for r in rows)
    for f in ("best.pt", "last.pt"):
        ckpt = torch.load(d / "weights" / f, weights_only=True)  # plain tensors only
        assert "train" not in ckpt and ckpt["names"][0] == "circle" and ckpt["nc"] == 5
        assert all(v.dtype == torch.float16 for v in ckpt["model"].values() if v.is_floating_point())
        assert "mAP_0.5" in ckpt["metrics"]


@pytest.mark.slow
def test_results_csv_has_a_rising_wall_clock_column(bf16_run):
    rows = list(csv.DictReader(open(bf16_run.save_dir / "results.csv")))
    clock = [float(r["time"]) for r in rows]
    assert 0 < clock[0] < clock[1]
    rows = read_rows(bf16_run.save_dir / "results.csv", clock=False)
    assert "time" not in rows[0] and len(rows[0]) == len(RESULTS_COLUMNS) - 1 == len(rows[1])


def test_close_mosaic_option_is_checked_and_counts_from_the_end():
    opt = train.parse_opt(["--close-mosaic", "-1"])
    with pytest.raises(UserError, match="--close-mosaic -1"):
        check_options(opt)
    s = SimpleNamespace(epochs=40, opt=train.parse_opt([]))
    assert train.mosaic_epochs(s) is None  # default: mosaic to the end
    s.opt = train.parse_opt(["--close-mosaic", "10"])
    assert train.mosaic_epochs(s) == 30  # the last 10 of 40 epochs see whole images
    s.epochs = 5
    assert train.mosaic_epochs(s) == 0  # shorter than the closing phase: no mosaic at all


@pytest.mark.slow
def test_run_writes_per_epoch_diagnostics(bf16_run):
    from utils.engine.diagnostics import COLUMNS

    rows = list(csv.DictReader(open(bf16_run.save_dir / "diagnostics.csv")))
    assert list(rows[0]) == list(COLUMNS) and [r["epoch"] for r in rows] == ["0", "1"]
    for r in rows:
        assert float(r["positives_per_target"]) >= 1  # each target gets its own cell at least
        assert float(r["grad_norm_weights"]) > 0 and 0 <= float(r["clipped_share"]) <= 1
        assert float(r["obj_bias_p3"]) < 0  # objectness starts at a low prior


@pytest.mark.slow
@pytest.mark.parametrize("warmup, fp32_steps", [({"warmup_epochs_adam": 0}, 4), ({"warmup_epochs": 0}, 6)])
def test_bf16_run_trains_the_warmup_steps_in_fp32_then_switches_to_bf16(micro, tmp_path, monkeypatch, warmup,
                                                                       fp32_steps):
    """3 epochs of 2 batches of 4. A warmup of 3 steps (0..3, `ni <= nw`) is passed after 4; the short
    recipe's 6 epochs from scratch (12 steps), which the hyp's warmup_epochs does not change, outlast the run."""
    monkeypatch.setattr(optim, "MIN_WARMUP_STEPS", 3)
    dtypes: list[torch.dtype] = []
    stem = lambda m, inputs, out: dtypes.append(out.dtype) if m.training else None  # noqa: E731

    cb = Callbacks()
    cb.register("on_train_start", lambda t: train.de_parallel(t.model).model[0].conv.register_forward_hook(stem))
    train.run(data=str(micro), amp="bf16", hyp=str(hyp_file(tmp_path, **warmup)), epochs=3, batch_size=4,
              imgsz=64, workers=0, noval=True, noplots=True, project=str(tmp_path / "runs"), callbacks=cb)
    assert dtypes == [torch.float32] * fp32_steps + [torch.bfloat16] * (6 - fp32_steps)


@pytest.mark.slow
def test_bf16_run_keeps_an_fp32_ema(bf16_run):
    assert all(p.dtype == torch.float32 for p in bf16_run.ema.parameters())
    assert all(torch.isfinite(p).all() for p in bf16_run.ema.parameters())


@pytest.mark.slow
def test_validation_pass_leaves_the_ema_bit_identical(tiny_data):
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=5)
    ema = ModelEMA(model)
    data = load_data_config(tiny_data)
    loader, _ = create_dataloader(data["val"], 64, 8, 32, rect=True, pad=0.5, workers=0)
    before = {k: v.clone() for k, v in ema.ema.state_dict().items()}
    validator.run(data=data, model=ema.ema, dataloader=loader, imgsz=64, plots=False)
    after = ema.ema.state_dict()
    assert all(torch.equal(before[k], after[k]) and before[k].dtype == after[k].dtype for k in before)
    assert not ema.ema.training


@pytest.mark.slow
def test_fine_tune_from_our_checkpoint_with_other_class_count(bf16_run, tiny_data, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    single = train.run(data=str(tiny_data), weights=str(bf16_run.save_dir / "weights/best.pt"), single_cls=True,
                       amp="off", project=str(tmp_path), **{**TINY, "epochs": 1, "noval": True})
    assert "re-initialised" in caplog.text
    assert load_checkpoint(single.save_dir / "weights/best.pt")["nc"] == 1


@pytest.mark.slow
def test_resuming_a_finished_run_says_so(bf16_run):
    from utils.errors import UserError

    with pytest.raises(UserError, match="finished run"):
        train.run(resume=str(bf16_run.save_dir / "weights/last.pt"))


@pytest.mark.slow
def test_a_chart_that_fails_during_training_leaves_the_results_and_one_warning(micro, tmp_path, monkeypatch, caplog):
    """The final validation's confusion matrix runs out of memory (1,203 classes did): one warning line, and the last
    epoch's results.csv row, best.pt and the other charts are still written."""
    import utils.report.plots as plots

    def plot_confusion_matrix(*args, **kwargs):
        raise MemoryError("Unable to allocate 42.2 GiB for an array with shape (96820, 108960, 4)")

    monkeypatch.setattr(plots, "plot_confusion_matrix", plot_confusion_matrix)
    caplog.set_level(logging.INFO)
    out = train.run(data=str(micro), epochs=1, imgsz=64, batch_size=4, workers=0, project=str(tmp_path))
    assert len(read_rows(out.save_dir / "results.csv")) == 2  # the header and epoch 0
    assert (out.save_dir / "weights" / "best.pt").is_file() and (out.save_dir / "PR_curve.png").is_file()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "confusion" in r.getMessage()]
    assert len(warned) == 1 and "MemoryError" in warned[0] and "\n" not in warned[0], warned


@pytest.mark.slow
def test_patience_0_turns_early_stopping_off(micro, tmp_path, caplog):
    """As in YOLOv5: --patience 0 never stops early (it stopped after the first epoch and stripped the run)."""
    caplog.set_level(logging.INFO)
    out = train.run(data=str(micro), epochs=3, imgsz=64, batch_size=4, workers=0, noplots=True, patience=0,
                    project=str(tmp_path))
    assert len(read_rows(out.save_dir / "results.csv")) == 4  # the header and epochs 0, 1, 2
    assert not any("early stop" in r.getMessage() for r in caplog.records)
