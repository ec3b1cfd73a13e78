"""Faults during training lose nothing and are one clear line: NaN losses are skipped and counted, non-finite
weights reload last.pt (at most three times) and the replayed run matches, a loader worker that crashes or stalls
stops the run resumably, a picture gone after verification is replaced by the next sample.

Faults come from the AMPYOLO_FAULTS test hook (utils/engine/faults.py), from deleted images and from a stalled
collate function; bench/kill_campaign.py's short form runs in bench/tests/test_kill_campaign.py."""
from __future__ import annotations

import csv
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from helpers import read_curves

import train
from utils.data.datasets import create_dataloader, loader_failure
from utils.engine import checkpoint as ck
from utils.engine.faults import FaultPlan, parse_faults
from utils.errors import UserError
from utils.report.results import read_rows

ARGS = dict(imgsz=64, batch_size=8, workers=0, noplots=True, amp="bf16", seed=3)
EPOCHS = 2


def _finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in model.state_dict().values() if v.is_floating_point())


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference(micro, tmp_path_factory):
    """The uninterrupted run the fault runs below are compared with."""
    return train.run(data=str(micro), project=str(tmp_path_factory.mktemp("ref")), epochs=EPOCHS, **ARGS)


# ----------------------------------------------------------------------------------------- the hook


def test_fault_spec_is_parsed_once_and_typos_are_refused():
    plan = parse_faults("nan_loss@1,4; nan_weights@0x2;slow_save@0.25;disk_full@3;worker_exit@5;kill@2")
    assert plan.nan_loss == {1, 4} and plan.nan_weights == {0: 2} and plan.slow_save == 0.25
    assert plan.disk_full == 3 and plan.worker_exit == 5 and plan.kill == 2 and plan.active
    assert parse_faults("kill@0").active and parse_faults("kill@0").kill == 0
    assert not parse_faults(None).active and not parse_faults("").active
    for bad in ("nan_loss@x", "explode@1", "nan_weights@", "kill@"):
        with pytest.raises(UserError, match="AMPYOLO_FAULTS"):
            parse_faults(bad)


def test_disk_full_hook_fails_the_nth_write_and_keeps_the_previous_file(tmp_path):
    plan, path = FaultPlan(disk_full=2), tmp_path / "last.pt"
    ck.atomic_save({"n": 1}, path, plan.before_replace)
    with pytest.raises(UserError, match="No space left on device.*previous file is kept"):
        ck.atomic_save({"n": 2}, path, plan.before_replace)
    assert torch.load(path, weights_only=True) == {"n": 1} and os.listdir(tmp_path) == ["last.pt"]


# ----------------------------------------------------------------------------------------- non-finite values


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")  # the skipped first step
def test_nan_losses_are_skipped_and_counted_and_weights_stay_finite(micro, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPYOLO_FAULTS", "nan_loss@0")  # epoch 0's only batch; epoch 1 trains normally
    out = train.run(data=str(micro), project=str(tmp_path), epochs=EPOCHS, noval=True, **ARGS)
    rows = list(csv.DictReader(open(out.save_dir / "results.csv")))
    assert [r["skipped_steps"] for r in rows] == ["1", "1"]  # cumulative
    assert rows[0]["train/box_loss"] == "0" and float(rows[1]["train/box_loss"]) > 0  # NaN batches left out
    assert _finite(out.ema)
    last = ck.load_checkpoint(out.save_dir / "weights" / "last.pt")
    assert all(bool(torch.isfinite(v.float()).all()) for v in last["model"].values())


@pytest.mark.slow
def test_nan_weights_reload_last_pt_and_the_replayed_run_matches(reference, micro, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("AMPYOLO_FAULTS", f"nan_weights@{EPOCHS - 1}")
    out = train.run(data=str(micro), project=str(tmp_path), epochs=EPOCHS, **ARGS)
    assert "non-finite" in caplog.text and "reload 1 of at most 3" in caplog.text
    a, b = reference.ema.state_dict(), out.ema.state_dict()
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-6
    assert read_rows(reference.save_dir / "results.csv", clock=False) == \
        read_rows(out.save_dir / "results.csv", clock=False)
    want, got = read_curves(reference.save_dir), read_curves(out.save_dir)  # the replayed steps logged once
    assert [s for s, _ in got["step/box_loss"]] == [s for s, _ in want["step/box_loss"]] == list(range(EPOCHS))
    assert [s for s, _ in got["train/box_loss"]] == list(range(EPOCHS))
    assert [v for _, v in got["step/box_loss"]] == pytest.approx([v for _, v in want["step/box_loss"]], rel=1e-5)


@pytest.mark.slow
def test_weights_that_stay_non_finite_stop_after_three_reloads(micro, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPYOLO_FAULTS", "nan_weights@0x4")
    with pytest.raises(UserError, match=r"non-finite .* in epoch 0 again after 3 reloads") as e:
        train.run(data=str(micro), project=str(tmp_path), epochs=1, noval=True, **ARGS)
    assert "\n" not in str(e.value)
    last = ck.load_checkpoint(tmp_path / "exp" / "weights" / "last.pt")
    assert last["train"]["completed_epoch"] == -1  # the initial state, never overwritten by NaN weights
    assert all(bool(torch.isfinite(v).all()) for v in last["train"]["model"].values() if v.is_floating_point())


# ----------------------------------------------------------------------------------------- data and loader workers


@pytest.mark.slow
def test_image_gone_after_verification_is_replaced_by_the_next_sample(tiny_data, tmp_path, caplog):
    src = tiny_data.parent / "shapes"
    for sub in ("images/train", "labels/train"):
        shutil.copytree(src / sub, tmp_path / sub)
    loader, ds = create_dataloader(tmp_path / "images" / "train", 64, 8, 32, augment=True, workers=0, shuffle=True)
    loader2, _ = create_dataloader(tmp_path / "images" / "train", 64, 8, 32, augment=True, workers=2)
    gone, cut = Path(ds.im_files[3]), Path(ds.im_files[10])
    gone.unlink()
    cut.write_bytes(b"")  # zero bytes: as if a copy was interrupted
    paths = [p for _, _, batch_paths, _ in loader for p in batch_paths]
    assert len(paths) == len(ds) and str(gone) not in paths and str(cut) not in paths
    warnings = [r.getMessage() for r in caplog.records if "another sample takes its place" in r.getMessage()]
    assert len(warnings) == 2 and str(gone) in warnings[0] + warnings[1] and str(cut) in warnings[0] + warnings[1]
    assert sum(len(p) for _, _, p, _ in loader2) == len(ds)  # the same in worker processes, and no hang


@pytest.mark.slow
def test_crashed_loader_worker_stops_cleanly_and_last_pt_resumes(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPYOLO_FAULTS", "worker_exit@3")  # worker 0: batches 0 and 2 of epoch 0, dies in epoch 1
    with pytest.raises(UserError, match="data loader failed.*--resume") as e:
        train.run(data=str(tiny_data), project=str(tmp_path), epochs=EPOCHS, noval=True, **{**ARGS, "workers": 2})
    assert "\n" not in str(e.value)
    last = tmp_path / "exp" / "weights" / "last.pt"
    assert ck.load_checkpoint(last)["train"]["completed_epoch"] == 0
    monkeypatch.delenv("AMPYOLO_FAULTS")
    out = train.run(resume=str(last), workers=0)
    assert [r[0] for r in read_rows(out.save_dir / "results.csv")[1:]] == ["0", "1"]


def _stall(batch):
    time.sleep(60)


@pytest.mark.slow
def test_a_stuck_loader_worker_times_out_instead_of_hanging(tiny_data, monkeypatch):
    import utils.data.datasets as datasets

    monkeypatch.setattr(datasets, "LOADER_TIMEOUT_S", 2)
    loader, _ = create_dataloader(tiny_data.parent / "shapes" / "images" / "val", 64, 4, 32, workers=1)
    loader.collate_fn = _stall  # the worker never delivers (a dead network mount, say)
    t0 = time.time()
    with pytest.raises(RuntimeError) as e:
        next(iter(loader))
    assert time.time() - t0 < 30
    failure = loader_failure(e.value, Path("runs/train/exp/weights/last.pt"))
    assert failure is not None and "timed out after 2 seconds" in str(failure) and "--resume" in str(failure)
