"""TensorBoard logger: tags, values and steps read back with TensorBoard's own reader; resume without duplicated
or missing points; rank != 0 and a missing tensorboard are no-ops."""
from __future__ import annotations

import builtins
import logging
import math
import shutil

import pytest
import torch

pytest.importorskip("tensorboard")
from helpers import read_curves as _read  # noqa: E402

from utils.report.tblog import STEP_PREFIX, TBLogger, cut_history, default_every, open_logger  # noqa: E402

NB = 10  # batches per epoch in the simulated runs


def _loss(step: int, run: int = 0) -> list[float]:
    return [1.0 / (step + 1) + run, 0.5 + run, 0.25 + run]


def _train(lg: TBLogger, epochs: range, run: int = 0, crash_after_steps: int | None = None) -> None:
    """Simulated loop: per-step logging, then the epoch row (results.csv columns) at the end of each epoch."""
    for e in epochs:
        for i in range(NB):
            step = e * NB + i
            if crash_after_steps is not None and step >= crash_after_steps:
                return
            lg.log_step(step, torch.tensor(_loss(step, run)), [0.01 * (e + 1), 0.02, 0.03], 2.0 ** 16, e)
        lg.log_epoch(e, {"epoch": e, "time": 1.5 * e, "train/box_loss": 0.1 * e + run, "metrics/mAP_0.5": float("nan"),
                         "lr0": 0.01, "skipped_steps": 0})


def test_tags_values_steps(tmp_path):
    lg = open_logger(tmp_path, rank=-1)
    _train(lg, range(2))
    lg.close()
    got = _read(tmp_path)
    expect = {STEP_PREFIX + t for t in ("box_loss", "obj_loss", "cls_loss", "lr0", "lr1", "lr2", "scale", "skipped_steps")}
    expect |= {"time", "train/box_loss", "lr0", "skipped_steps"}
    assert set(got) == expect, "NaN columns (no validation) are left out"
    assert [s for s, _ in got["step/box_loss"]] == list(range(2 * NB))
    assert got["step/box_loss"][3][1] == pytest.approx(0.25)
    assert got["step/lr0"][NB] == (NB, pytest.approx(0.02))
    assert got["step/scale"][0][1] == 65536.0
    assert got["train/box_loss"] == [(0, 0.0), (1, pytest.approx(0.1))]
    assert got["time"][1] == (1, 1.5)


def test_every_n_steps(tmp_path):
    lg = open_logger(tmp_path, every=3)
    _train(lg, range(2))
    lg.close()
    assert [s for s, _ in _read(tmp_path)["step/obj_loss"]] == list(range(0, 2 * NB, 3))
    assert default_every(25) == 1 and default_every(7328) == 36


def test_non_finite_losses_left_out(tmp_path):
    lg = open_logger(tmp_path)
    lg.log_step(0, [math.nan, 1.0, math.inf], [0.1], None, 0)
    lg.close()
    got = _read(tmp_path)
    assert "step/box_loss" not in got and "step/cls_loss" not in got and got["step/obj_loss"] == [(0, 1.0)]
    assert "step/scale" not in got, "no scaler: no scale curve"


@pytest.mark.parametrize("crash_after", [25, 30])
def test_resume_continues_the_same_curves(tmp_path, crash_after):
    """A run killed in epoch 2 (after `crash_after` steps; its last checkpoint is epoch 1's) and resumed at
    epoch 2 gives the same points, each once, as a run that was never interrupted."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    lg = open_logger(ref)
    _train(lg, range(4))
    lg.close()

    lg = open_logger(run)
    # values from the lost part differ on purpose; with crash_after=30, epoch 2's row was logged (and flushed)
    # but its checkpoint never written: it must go too
    _train(lg, range(4), run=7, crash_after_steps=crash_after)
    lg.flush()  # what a killed process had on disk (the writer thread flushes every FLUSH_SECS)
    del lg  # no close: killed
    resumed = open_logger(run, start_epoch=2, start_step=2 * NB)
    # the resumed process replays epochs 2..3 with the reference values; epochs 0..1 stay from the first process
    _train(resumed, range(2, 4))
    resumed.close()
    got, want = _read(run), _read(ref)
    for tag in want:
        steps = [s for s, _ in got[tag]]
        assert steps == sorted(set(steps)), f"{tag}: duplicated steps"
        assert steps == [s for s, _ in want[tag]], f"{tag}: missing steps"
    assert got["step/box_loss"][19][1] == pytest.approx(_loss(19, 7)[0]), "before the cut: the first process's point"
    assert got["step/box_loss"][20][1] == pytest.approx(_loss(20)[0]), "after the cut: the resumed process's point"
    assert got["train/box_loss"][2] == (2, pytest.approx(0.2))


def test_rewind_in_process_and_repeated_cut(tmp_path):
    """A replay from an earlier checkpoint (same process) and a cut interrupted before the old files were removed."""
    lg = open_logger(tmp_path)
    _train(lg, range(3))
    lg.rewind(1, NB)  # weights went non-finite in epoch 2: reload epoch 0's checkpoint, replay from epoch 1
    _train(lg, range(1, 3), run=1)
    lg.close()
    got = _read(tmp_path)
    assert [s for s, _ in got["step/cls_loss"]] == list(range(3 * NB))
    assert got["step/cls_loss"][NB][1] == 1.25 and got["step/cls_loss"][NB - 1][1] == 0.25
    assert [s for s, _ in got["train/box_loss"]] == [0, 1, 2]
    # a kill between writing the history and removing the old files leaves copies: the next cut removes them
    files = sorted(tmp_path.glob("events.out.tfevents.*"))
    shutil.copy(files[-1], tmp_path / (files[-1].name + "x"))
    assert cut_history(tmp_path, 3, 3 * NB) > 0
    got = _read(tmp_path)
    assert [s for s, _ in got["step/cls_loss"]] == list(range(3 * NB))
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1


def test_fresh_run_in_reused_folder_clears_old_curves(tmp_path):
    lg = open_logger(tmp_path)
    _train(lg, range(2))
    lg.close()
    lg = open_logger(tmp_path)  # --exist-ok, not --resume
    _train(lg, range(1), run=3)
    lg.close()
    assert [s for s, _ in _read(tmp_path)["step/box_loss"]] == list(range(NB))


def test_only_rank_zero_writes(tmp_path):
    lg = open_logger(tmp_path / "r1", rank=1)
    assert not lg.enabled
    _train(lg, range(1))
    lg.close()
    assert not (tmp_path / "r1").exists()
    assert not open_logger(tmp_path / "off", enabled=False).enabled


def test_missing_tensorboard_one_line_and_noop(tmp_path, monkeypatch, caplog):
    real_import = builtins.__import__

    def no_tb(name, *args, **kwargs):
        if name == "tensorboard" or name.startswith("tensorboard."):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tb)
    with caplog.at_level(logging.INFO):
        lg = open_logger(tmp_path / "x")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["TensorBoard logging off: the tensorboard package is missing (pip install tensorboard)"]
    _train(lg, range(1))
    lg.close()
    assert not (tmp_path / "x").exists()


def test_unwritable_folder_turns_logging_off(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        lg = open_logger(blocker / "run")
    assert not lg.enabled
    assert any("TensorBoard logging off" in r.getMessage() for r in caplog.records)
    _train(lg, range(1))  # no exception
    lg.close()
