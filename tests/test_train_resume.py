"""Exact resume after SIGKILL, and DDP with 2 CPU processes (Gloo)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import read_curves

import train
from utils.engine.train_options import TrainOptions
from utils.options import to_argv
from utils.report.results import read_rows

REPO = Path(__file__).resolve().parents[1]
ARGS = dict(epochs=4, imgsz=64, batch_size=8, workers=0, noplots=True, amp="bf16", seed=3)


@pytest.mark.parametrize("multi_scale", [False, True], ids=["fixed-size", "multi-scale"])
def test_sigkill_during_epoch_3_then_resume_matches_an_uninterrupted_run(multi_scale, tiny_data, bf16_hyp, tmp_path):
    # bf16 arithmetic from the first step; multi-scale: each batch's size comes back the same after a resume
    args = {**ARGS, "multi_scale": multi_scale, "hyp": str(bf16_hyp)}
    ref = train.run(data=str(tiny_data), project=str(tmp_path / "ref"), **args)

    # the same run in a child process, killed hard as soon as epoch 2 is logged: in its checkpoint
    # write or at the start of epoch 3 (index 2); a tiny epoch lasts well under a second here
    last = kill_after(tiny_data, tmp_path / "killed", args, epochs_logged=2)
    # 0 or 1; 2 if the parent was descheduled for the length of an epoch before its signal went out
    assert torch.load(last, weights_only=True)["train"]["completed_epoch"] in (0, 1, 2)
    resumed = train.run(resume=str(last), workers=0)
    assert resumed.save_dir == last.parent.parent  # the same run folder continues

    a, b = ref.ema.state_dict(), resumed.ema.state_dict()
    diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    assert diff <= 1e-6, diff
    assert read_rows(ref.save_dir / "results.csv", clock=False) == \
        read_rows(resumed.save_dir / "results.csv", clock=False)
    # the diagnostics (gradient norms, head biases) of the redone epochs are the same numbers, once each
    assert read_rows(ref.save_dir / "diagnostics.csv") == read_rows(resumed.save_dir / "diagnostics.csv")
    # TensorBoard: the resumed run's curves are the uninterrupted run's, each step once (none lost, none twice)
    want, got = read_curves(ref.save_dir), read_curves(resumed.save_dir)
    assert set(got) == set(want) and [s for s, _ in want["step/box_loss"]] == list(range(4 * 3))  # 24 images / 8
    for tag in want:
        assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
        if tag != "time":
            assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want[tag]], rel=1e-5, abs=1e-7), tag


def kill_after(data: Path, project: Path, args: dict, epochs_logged: int, env: dict | None = None) -> Path:
    """Start train.py in a child process, SIGKILL it once `epochs_logged` epochs are in results.csv; its last.pt."""
    cmd = [sys.executable, "train.py", "--data", str(data), "--project", str(project), *to_argv(args, TrainOptions)]
    child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    results = project / "exp" / "results.csv"
    deadline = time.time() + 600
    while time.time() < deadline and child.poll() is None:
        if results.exists() and len(read_rows(results)) >= 1 + epochs_logged:  # the header, then an epoch a row
            break
        time.sleep(0.02)
    assert child.poll() is None, "the run ended before it could be killed"
    child.send_signal(signal.SIGKILL)
    child.wait()
    return project / "exp" / "weights" / "last.pt"


def test_sigkill_then_resume_is_bit_exact_with_several_threads(coco_subset, several_threads, tmp_path):
    """Real images (many positives per batch, so the threads share the loss's sums) at the default precision:
    the resumed run's weights and results are the uninterrupted run's, bit for bit."""
    args = dict(cfg="yolov5n.yaml", epochs=4, imgsz=128, batch_size=16, workers=2, seed=0, noplots=True)
    ref = train.run(data=str(coco_subset), project=str(tmp_path / "ref"), **args)
    env = {**os.environ, "OMP_NUM_THREADS": str(several_threads)}  # the child uses as many threads as this process
    last = kill_after(coco_subset, tmp_path / "killed", args, epochs_logged=2, env=env)
    assert torch.load(last, weights_only=True)["train"]["completed_epoch"] in (0, 1, 2)  # in its save, or after
    resumed = train.run(resume=str(last), workers=2)
    a, b = ref.ema.state_dict(), resumed.ema.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    assert read_rows(ref.save_dir / "results.csv", clock=False) == \
        read_rows(resumed.save_dir / "results.csv", clock=False)


@pytest.mark.skipif(not torch.distributed.is_available() or shutil.which("torchrun") is None,
                    reason="torch.distributed/torchrun not available")
def test_two_process_ddp_on_cpu(tiny_data, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
           "train.py", "--data", str(tiny_data), "--project", str(tmp_path), "--device", "cpu",
           *to_argv({**ARGS, "epochs": 2, "amp": "off"})]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p.name for p in tmp_path.iterdir())
    assert runs == ["exp"], runs  # rank 0 alone writes
    rows = read_rows(tmp_path / "exp" / "results.csv")
    assert [r[0] for r in rows[1:]] == ["0", "1"]  # each epoch logged once
    assert len(list((tmp_path / "exp").glob("events.out.tfevents.*"))) == 1  # TensorBoard: rank 0 alone
    curves = read_curves(tmp_path / "exp")
    assert [s for s, _ in curves["step/box_loss"]] == list(range(2 * 3))  # 24 images, 4 per process and batch
    assert [s for s, _ in curves["metrics/mAP_0.5"]] == [0, 1]
    assert (tmp_path / "exp" / "weights" / "best.pt").is_file()
