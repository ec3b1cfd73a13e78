"""bench/kill_campaign.py's short form (the full form: its docstring), and bench/make_paste_dataset.py at its
smallest size."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from utils.data.data_config import SHARED_COCO128, load_data_config

pytestmark = pytest.mark.slow  # a kill campaign, and a paste dataset made from COCO128

REPO = Path(__file__).resolve().parents[2]


def test_kill_campaign_short_form_sigint_sigterm_sigkill(micro, tmp_path, one_thread):
    """SIGINT and SIGTERM at random moments (exit 0/130, no traceback), SIGKILL mid-write and mid-epoch; every
    time last.pt loads and resumes, and the finished run equals the uninterrupted one. The child processes get
    this process's thread count through OMP_NUM_THREADS, so their arithmetic matches."""
    cmd = [sys.executable, "bench/kill_campaign.py", "--kills", "2", "--graceful", "2", "--epochs", "2", "--seed", "1",
           "--data", str(micro), "--workdir", str(tmp_path)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0 and out.stdout.rstrip().endswith("PASS"), out.stdout[-3000:] + out.stderr[-3000:]
    assert all(f" {sig} " in out.stdout for sig in ("KILL", "INT", "TERM")), out.stdout[-3000:]


def test_paste_dataset_smallest(tmp_path):
    if not (SHARED_COCO128 / "images" / "train2017").is_dir():
        pytest.skip("COCO128 not found")
    from bench.make_paste_dataset import main

    for extra in ([], ["--classes", "10", "--background", "noise"]):
        out = tmp_path / f"p{len(extra)}"
        main(["--train", "2", "--val", "1", "--out", str(out), *extra])
        cfg = load_data_config(out / f"{out.name}.yaml")
        assert len(cfg["names"]) == (10 if extra else 8)
        labels = sorted((out / "labels" / "train").glob("*.txt"))
        assert len(labels) == 2 and all(ln.split()[0].isdigit() for f in labels for ln in f.read_text().split("\n")
                                        if ln)
