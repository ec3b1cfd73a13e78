"""What a training run leaves to look at and the options around it (issue 15): TensorBoard curves, labels.jpg,
train_batch / val_batch pictures (none with --noplots), --multi-scale sizes, --batch-size -1 (AutoBatch)."""
from __future__ import annotations

import logging

import cv2
import pytest
import torch
import yaml
from helpers import cli_in_process, read_curves

import train
from utils.engine import run_setup
from utils.data.multiscale import size_for_step
from utils.engine.callbacks import Callbacks
from utils.files import REPO_ROOT
from utils.report.results import COLUMNS as RESULTS_COLUMNS, read_rows

pytest.importorskip("tensorboard")

TINY = dict(imgsz=64, batch_size=8, workers=0, amp="bf16", seed=3)
NB = 3  # tiny_data: 24 training images in batches of 8
STEP_TAGS = {"step/box_loss", "step/obj_loss", "step/cls_loss", "step/lr0", "step/lr1", "step/lr2", "step/skipped_steps"}


def _batch_recorder() -> tuple[Callbacks, list[tuple[int, tuple[int, ...]]]]:
    """Callbacks recording (ni, image batch shape) of every training batch."""
    seen: list[tuple[int, tuple[int, ...]]] = []
    cb = Callbacks()
    cb.register("on_train_batch", lambda t, ni, imgs, targets, paths: seen.append((ni, tuple(imgs.shape))))
    return cb, seen


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


def test_multi_scale_sizes_follow_the_seed_and_stay_on_the_stride(tiny_data, tmp_path):
    cb, seen = _batch_recorder()
    train.run(data=str(tiny_data), project=str(tmp_path), epochs=1, noplots=True, noval=True, multi_scale=True,
              callbacks=cb, **TINY)
    expected = [size_for_step(64, 32, TINY["seed"], 0, ni) for ni in range(NB)]
    assert len(set(expected)) > 1, "this seed draws different sizes"
    assert [ni for ni, _ in seen] == list(range(NB))
    assert [max(shape[2:]) for _, shape in seen] == expected
    assert all(h % 32 == 0 and w % 32 == 0 and 32 <= max(h, w) <= 96 for _, (_, _, h, w) in seen)


def test_without_multi_scale_every_batch_is_imgsz(plotted):
    assert {shape[2:] for _, shape in plotted[2]} == {(64, 64)}


def test_batch_size_minus_one_on_cpu_trains_16_with_one_line_and_records_16(tiny_data, tmp_path, caplog):
    cb, seen = _batch_recorder()
    with caplog.at_level(logging.INFO):
        out = train.run(data=str(tiny_data), project=str(tmp_path), epochs=1, noplots=True, noval=True, callbacks=cb,
                        **{**TINY, "batch_size": -1})
    lines = [r.getMessage() for r in caplog.records if "AutoBatch" in r.getMessage()]
    assert lines == ["AutoBatch (--batch-size -1) needs CUDA; using batch size 16 on cpu"]
    assert [shape[0] for _, shape in seen] == [16, 8]  # 24 images
    assert yaml.safe_load((out.save_dir / "opt.yaml").read_text())["batch_size"] == 16


def test_autobatch_choice_is_what_resume_trains_with_without_profiling_again(micro, tmp_path, monkeypatch):
    """The number AutoBatch picks (on CUDA; faked here) goes into the Setup, opt.yaml and last.pt; --resume reads it."""
    monkeypatch.setattr(run_setup, "resolve_batch_size", lambda requested, *a, **k: 4)
    cb, seen = _batch_recorder()

    def stop(t, epoch, row):
        raise KeyboardInterrupt

    cb.register("on_epoch_end", stop)
    first = train.run(data=str(micro), project=str(tmp_path), epochs=2, noplots=True, callbacks=cb,
                      **{**TINY, "batch_size": -1})
    assert first.interrupted and [shape[0] for _, shape in seen] == [4, 4]  # micro: 8 images
    assert yaml.safe_load((first.save_dir / "opt.yaml").read_text())["batch_size"] == 4
    last = first.save_dir / "weights" / "last.pt"
    assert torch.load(last, weights_only=True)["train"]["opt"]["batch_size"] == 4

    def must_not_profile(*a, **k):
        raise AssertionError("a resume profiled again")

    monkeypatch.setattr(run_setup, "resolve_batch_size", must_not_profile)
    cb2, seen2 = _batch_recorder()
    train.run(resume=str(last), workers=0, callbacks=cb2)
    assert [shape[0] for _, shape in seen2] == [4] * 4 and [ni for ni, _ in seen2] == [0, 1, 2, 3]


@pytest.mark.parametrize("value", ["-2", "0"])
def test_bad_batch_size_is_one_line(value, micro, tmp_path, capsys, monkeypatch):
    code, lines = cli_in_process(train.main, ["--data", str(micro), "--project", str(tmp_path), "--batch-size", value],
                                 capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --batch-size") and "-1" in lines[0], lines


def test_a_stop_signal_whose_interrupt_was_swallowed_still_stops_the_run(micro, tmp_path):
    """Python drops a KeyboardInterrupt raised inside a finaliser; the signal handler's flag must still stop
    the run, at the next batch or after the epoch's checkpoints, with last.pt resumable."""
    from utils.errors import stop_on_signals

    def swallowed(t, *args):
        stop_on_signals.requested = True  # what the handler sets before its raise goes missing

    for event, done in (("on_step_end", -1), ("on_epoch_end", 0)):
        cb = Callbacks()
        cb.register(event, swallowed)
        out = train.run(data=str(micro), project=str(tmp_path), epochs=3, noplots=True, callbacks=cb, **TINY)
        assert out.interrupted and not stop_on_signals.requested  # the flag is the run's own
        last = out.save_dir / "weights" / "last.pt"
        completed = torch.load(last, weights_only=True)["train"]["completed_epoch"] if last.exists() else -1
        assert completed == done


def test_ctrl_c_exits_130_and_still_plots_the_finished_epochs(micro, tmp_path):
    """SIGINT (what Ctrl-C sends) in the middle of a run: the one helpful line, exit status 130 as shells report an
    interrupted program, and results.png for the epochs that finished."""
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "train.py", "--data", str(micro), "--project", str(tmp_path), "--epochs", "200",
           "--imgsz", "64", "--batch-size", "4", "--workers", "0", "--amp", "off"]
    child = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = tmp_path / "exp" / "results.csv"
    deadline = time.time() + 300
    while time.time() < deadline and child.poll() is None and not (results.exists() and len(read_rows(results)) >= 3):
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=300)
    assert child.returncode == 130, out[-2000:]
    assert "interrupted:" in out and "--resume" in out and "Traceback" not in out
    assert (tmp_path / "exp" / "results.png").is_file()
    assert len(read_rows(results)) >= 3  # header and the finished epochs, kept


def test_ctrl_c_inside_a_checkpoint_write_is_an_interrupt_not_a_full_disk(tmp_path):
    """torch.save's writer turns the KeyboardInterrupt of a Ctrl-C into its own RuntimeError ('unexpected pos'),
    which reads like a full disk; with the signal's flag set it is the interrupt it was, and the old file stays."""
    from utils.errors import stop_on_signals
    from utils.files import atomic_write

    target = tmp_path / "last.pt"
    target.write_bytes(b"previous")

    def cut(f):
        f.write(b"partial")
        stop_on_signals.requested = True  # what the SIGINT handler sets as it raises
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 772032 vs 771928")

    try:
        with pytest.raises(KeyboardInterrupt):
            atomic_write(target, cut)
    finally:
        stop_on_signals.requested = False
    assert target.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["last.pt"]
