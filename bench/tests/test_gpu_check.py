"""bench/gpu_precision.sh without a GPU: the script parses and refuses cleanly, the judging runs on made-up
numbers, and the measuring steps (c) and (d) run on the CPU with a tiny model."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import train
from bench import gpu_check as gc
from utils.report.results import COLUMNS as RESULTS_COLUMNS

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_precision.sh"


def _results_csv(path: Path, epochs: int, skipped: int, map50: float, epoch_s: float = 10.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [",".join(RESULTS_COLUMNS)]
    for e in range(epochs):
        values = dict.fromkeys(RESULTS_COLUMNS, "0.1")
        values.update({"epoch": e, "time": epoch_s * (e + 1), "skipped_steps": skipped, "metrics/mAP_0.5": map50,
                       "metrics/mAP_0.5:0.95": map50 / 2})
        rows.append(",".join(str(values[c]) for c in RESULTS_COLUMNS))
    path.write_text("\n".join(rows) + "\n")


def fake_out(out: Path, fp16_speedup: float = 2.4, fp16_memory: float = 0.55, infer_speedup: float = 1.8,
             map_half: float = 0.402, agreement: float = 0.99, fp16_skips: int = 4, rc: dict | None = None,
             ngpu: int = 1) -> Path:
    """An OUT folder as bench/gpu_precision.sh leaves it, with the given numbers."""
    out.mkdir(parents=True, exist_ok=True)
    for step in gc.STEPS[:5] + (("ddp",) if ngpu > 1 else ()):
        (out / f"{step}.rc").write_text(f"{(rc or {}).get(step, 0)}\n")
    amp = [{"mode": "off", "img/s": 300.0, "peak GiB": 40.0, "amp check": True, "skipped": 0},
           {"mode": "fp16", "img/s": 300.0 * fp16_speedup, "peak GiB": 40.0 * fp16_memory, "amp check": True,
            "skipped": 2},
           {"mode": "bf16", "img/s": 600.0, "peak GiB": 22.0, "amp check": True, "skipped": 0}]
    (out / "amp.json").write_text(json.dumps(amp))
    _results_csv(out / "fp16" / "results.csv", 3, fp16_skips, 0.4, epoch_s=6.0)
    _results_csv(out / "fp32" / "results.csv", 3, 0, 0.4)
    test = {run: {"half": {"map50": map_half, "map": map_half / 2}, "fp32": {"map50": 0.4, "map": 0.2}}
            for run in gc.RUNS}
    (out / "test.json").write_text(json.dumps(test))
    det = {"batch": 32, "half": {"img/s": 500.0 * infer_speedup, "boxes": 300}, "fp32": {"img/s": 500.0, "boxes": 301},
           "agreement": agreement}
    (out / "detect.json").write_text(json.dumps(det))
    if ngpu > 1:
        _results_csv(out / "ddp" / "results.csv", 1, 2, 0.1)
    else:
        (out / "ddp.skipped").write_text("the machine has 1 GPU; a 2-process run needs 2\n")
    return out


def _verdicts(out: Path) -> dict[str, str]:
    return {f"{r.section}: {r.name}": r.verdict for r in gc.checks(gc.read_results(out))}


def test_summary_passes_on_numbers_that_meet_every_target(tmp_path, capsys):
    out = fake_out(tmp_path / "good")
    v = _verdicts(out)
    assert "FAIL" not in v.values() and list(v.values()).count("PASS") == 9, v  # 3 (a), 2 (b), 2 (c), 2 (d)
    assert v["(e) torchrun 2 GPUs: 2-process run"] == "info"  # one GPU: skipped with its note
    assert gc.main(["summary", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("\n") == len(v) + 2 and "skipped: the machine has 1 GPU" in text  # one table
    assert text.strip().splitlines()[-1].startswith("PASS")
    assert _verdicts(fake_out(tmp_path / "two", ngpu=2))["(e) torchrun 2 GPUs: 2-process fp16 run: epochs / "
                                                         "skipped / epoch s"] == "PASS"


@pytest.mark.parametrize("bad, failing", [
    (dict(fp16_speedup=1.6), "(a) train step: fp16 images/s vs FP32"),
    (dict(fp16_memory=0.7), "(a) train step: fp16 peak memory vs FP32"),
    (dict(infer_speedup=1.2), "(d) detect.py half vs FP32: FP16 inference images/s vs FP32, batch 32"),
    (dict(map_half=0.39), "(c) test.py half vs FP32: fp16/best.pt max |mAP diff|"),
    (dict(agreement=0.9), "(d) detect.py half vs FP32: box agreement (same class, IoU >= 0.95)"),
    (dict(fp16_skips=30), "(b) train.py COCO128: fp16: skipped steps"),
    (dict(rc={"train_fp32": 124}), "steps: train_fp32 exited 124 (time limit)"),
])
def test_summary_fails_on_a_missed_target(bad, failing, tmp_path):
    out = fake_out(tmp_path / "bad", **bad)
    v = _verdicts(out)
    assert v[failing] == "FAIL", v
    assert gc.main(["summary", str(out)]) == 1


def test_missing_results_are_failures_not_crashes(tmp_path):
    out = fake_out(tmp_path / "gone")
    (out / "detect.json").unlink()
    (out / "fp32" / "results.csv").unlink()
    v = _verdicts(out)
    assert v["(d) detect.py half vs FP32: both precisions"] == "FAIL"
    assert v["(b) train.py COCO128: fp32: 3 finished epochs"] == "FAIL"
    assert gc.main(["summary", str(tmp_path / "empty")]) == 1  # nothing at all: every section fails


def test_box_agreement_counts_same_class_boxes_that_overlap():
    box = np.array([[0, 0.1, 0.1, 0.5, 0.5]])
    assert gc.box_agreement({"a": box}, {"a": box.copy()}) == 1.0
    assert gc.box_agreement({}, {}) == 1.0  # nothing found by either
    other_class = box.copy()
    other_class[0, 0] = 1
    assert gc.box_agreement({"a": box}, {"a": other_class}) == 0.0
    moved = box + [0, 0.05, 0, 0.05, 0]  # IoU 0.78
    far = box + [0, 0.3, 0.3, 0.3, 0.3]
    assert gc.box_agreement({"a": np.vstack([box, far])}, {"a": np.vstack([moved, far])}) == 0.5
    assert gc.box_agreement({"a": box}, {"a": np.zeros((0, 5))}) == 0.0  # a box the other precision lost


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", [SCRIPT, REPO / "bench" / "gpu_check.sh"], ids=lambda p: p.name)
def test_script_parses_and_without_cuda_exits_2_with_one_line(script):
    """Both GPU scripts (this one and gpu_check.sh, bench/tests/test_gpu_check_script.py) refuse in one line."""
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script would run for minutes")
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.strip().count("\n") == 0 and "no CUDA device" in r.stderr


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on two shared cores: a second thread only waits
    yield
    torch.set_num_threads(n)


def test_measuring_steps_run_on_cpu_with_a_tiny_model(micro, tmp_path, one_thread):
    """(c) and (d) as the script runs them, on the CPU: their JSON feeds the summary."""
    from models.yolo import Model
    from utils.data.data_config import load_data_config
    from utils.engine.checkpoint import atomic_save, make_checkpoint

    names = load_data_config(micro)["names"]
    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=len(names))
    for run in gc.RUNS:
        (tmp_path / run / "weights").mkdir(parents=True)
        atomic_save(make_checkpoint(model, model.yaml, names, epoch=2), tmp_path / run / "weights" / "best.pt")
    gc.evals(tmp_path, str(micro), device="cpu", imgsz=64, batch=4)
    gc.detect_speed(tmp_path, str(micro), device="cpu", imgsz=64, batch=4)
    res = gc.read_results(tmp_path)
    assert set(res["test"]) == set(gc.RUNS) and set(res["test"]["fp16"]) == {"half", "fp32"}
    assert res["detect"]["half"]["img/s"] > 0 and res["detect"]["fp32"]["img/s"] > 0
    assert 0 <= res["detect"]["agreement"] <= 1
    rows = {f"{r.section}: {r.name}" for r in gc.checks(res)}
    assert any(r.startswith("(c)") for r in rows) and any(r.startswith("(d)") for r in rows)
