"""Training in several processes (DDP, torchrun): two CPU processes over Gloo train one run that rank 0 alone writes
and logs, and only rank 0 says the set-up lines."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import read_curves

from utils.options import to_argv
from utils.report.results import read_rows

REPO = Path(__file__).resolve().parents[1]
ARGS = dict(epochs=4, imgsz=64, batch_size=8, workers=0, noplots=True, amp="bf16", seed=3)


@pytest.mark.slow
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


@pytest.mark.parametrize("rank, shown", [("0", True), ("1", False), (None, True)])
def test_under_torchrun_only_rank_0_says_the_set_up_lines(rank, shown, monkeypatch):
    import logging

    from utils.errors import setup_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    try:
        setup_logging()
        assert logging.getLogger("train").isEnabledFor(logging.INFO) is shown
        assert logging.getLogger("train").isEnabledFor(logging.WARNING)  # every rank still warns
    finally:
        root.handlers[:], root.level = handlers, level
