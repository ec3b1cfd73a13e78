"""bench/gpu_check.sh without a GPU: GPU_CHECK_TINY=1 runs every step on the CPU at toy sizes (yolov5n, 64 px),
so that a run on a GPU does not spend its minutes on a broken step. Without it, on a machine with no GPU, the
script refuses in one line (bench/tests/test_gpu_check.py checks that, with gpu_precision.sh's)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_goals

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.sh"


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="no bash or timeout")
def test_every_step_runs_at_toy_sizes_on_the_cpu(tiny_data, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_TINY": "1", "OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "GPU_CHECK_BUDGET_S": "1200", "AMPYOLO_HOME": str(tmp_path / "home")}
    r = subprocess.run(["bash", str(SCRIPT), str(tiny_data)], capture_output=True, text=True, timeout=1500, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    codes = {f.stem: f.read_text().strip() for f in out.glob("*.rc")}
    assert len(codes) == 13 and set(codes.values()) == {"0"}, codes  # every step ran to its end
    rows = {g: m for g, m, _, _ in gpu_goals.goals(gpu_goals.read_out(out))}
    assert rows["1 step candidate: fp16-foreach"].endswith("x fp16")  # a figure, not an error
    assert rows["1 step candidate: fp16-graphs"] == "needs CUDA"
    assert "compiled in" in rows["1 step candidate: fp16-compile"]
    for path in ("device", "host"):
        for workers in (1, 2):
            assert "48 images an epoch" in rows[f"2 loop: --augment-on {path}, {workers} workers"]  # 2 copies of 24
    assert "the device's share" in rows["3 loader: --augment-on device, 2 workers"]
    assert "img/s on cpu" in rows["decode (cache off): cv2 on 1 core vs decode_jpeg"]
    assert rows["seeded run twice (deterministic, CUDA default)"].startswith("weights identical: True")
    assert "| goal | measured |" in r.stdout  # the summary table closes the output
