"""bench/gpu_check.py without a GPU: the judge on made-up numbers, the refusal in one line, and every step run on
the CPU at toy sizes (--tiny), so that a GPU's minutes go to measuring, not to a broken step."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import gpu_check as gc
from utils.report.results import COLUMNS

REPO = Path(__file__).resolve().parents[2]


def _results_csv(path: Path, epochs: int, skipped: int = 0, m: float = 0.4, epoch_s: float = 10.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [",".join(COLUMNS)]
    for e in range(epochs):
        values = {**dict.fromkeys(COLUMNS, "0.1"), "epoch": e, "time": epoch_s * (e + 1), "skipped_steps": skipped,
                  "metrics/mAP_0.5": m, "metrics/mAP_0.5:0.95": m / 2}
        rows.append(",".join(str(values[c]) for c in COLUMNS))
    path.write_text("\n".join(rows) + "\n")


def fake_out(out: Path, fp16: float = 2400.0, memory: float = 0.55, infer: float = 1.8, map_half: float = 0.402,
             fp16_skips: int = 4, loop_device: float = 2100.0, images: int = 2048, small: float = 45.0,
             loader: float = 2500.0, y5_seconds: float = 130.0, identical: bool = True, rc: dict | None = None,
             ngpu: int = 1) -> Path:
    """An OUT folder as `gpu_check.py run` leaves it, with the given numbers."""
    out.mkdir(parents=True, exist_ok=True)
    for step in ("steps", "train_fp16", "train_fp32", "evals", "detect", "loader", "ours"):
        (out / f"{step}.rc").write_text(f"{(rc or {}).get(step, 0)}\n")
    (out / "steps.json").write_text(json.dumps([
        {"candidate": "fp32", "img/s": 1000.0, "peak GiB": 40.0, "amp check": True},
        {"candidate": "fp16-foreach", "img/s": fp16 * 0.9},
        {"candidate": "fp16", "img/s": fp16, "peak GiB": 40.0 * memory, "amp check": True},
        {"candidate": "bf16", "img/s": 2000.0, "peak GiB": 22.0, "amp check": True},
        {"candidate": "fp16-graphs", "error": "failed: X"}]))
    (out / "compile.json").write_text(json.dumps([{"candidate": "fp16-compile", "img/s": fp16 * 1.2, "compile s": 70}]))
    _results_csv(out / "fp16" / "results.csv", 3, fp16_skips, epoch_s=6.0)
    _results_csv(out / "fp32" / "results.csv", 3)
    (out / "test.json").write_text(json.dumps({run: {"half": {"map50": map_half, "map": map_half / 2},
                                                     "fp32": {"map50": 0.4, "map": 0.2}} for run in gc.RUNS}))
    detect = []
    for prec, ms in (("fp32", 2.0), ("fp16", 2.0 / infer)):
        (out / "detect" / prec / "labels").mkdir(parents=True)
        (out / "detect" / prec / "labels" / "a.txt").write_text("0 0.3 0.3 0.2 0.2 0.9\n")
        detect.append({"precision": prec, "batch": 32, "inference ms": ms, "save_dir": str(out / "detect" / prec)})
    (out / "detect.json").write_text(json.dumps(detect))
    if ngpu > 1:
        _results_csv(out / "ddp" / "results.csv", 1, 2, 0.1)
    else:
        (out / "ddp.skipped").write_text("the machine has 1 GPU; a 2-process run needs 2\n")
    for path, workers, rate in (("device", 8, loop_device), ("host", 8, 500.0), ("device", 16, 2200.0),
                                ("host", 16, 900.0)):
        (out / f"loop_{path}_w{workers}.json").write_text(json.dumps([{"img/s": rate, "images_per_epoch": images}]))
    (out / "loop_nondet.json").write_text(json.dumps([{"it/s": 40.0, "img/s": 2560.0}]))
    (out / "loop_small.json").write_text(json.dumps([{"it/s": small, "img/s": small * 16}]))
    (out / "loader.log").write_text(f" imgsz  cache  workers  augment  images/s  device s/batch (0)\n"
                                    f"   640    ram       16     host     819.0  -\n"
                                    f"   640    ram       16   device    {loader:.1f}  0.0123\n")
    (out / "decode.json").write_text(json.dumps({"cv2 img/s (1 core)": 90.0, "decode_jpeg img/s (cuda)": 3000.0,
                                                 "device": "cuda:0"}))
    (out / "same_run.json").write_text(json.dumps({"identical_weights": identical, "max_weight_diff": 1 - identical}))
    for name, m, s in (("ours", 0.70, 60.0), ("yolov5", 0.30, y5_seconds)):
        (out / "runs" / name).mkdir(parents=True)
        (out / "runs" / name / "results.csv").write_text(f"epoch,  metrics/mAP_0.5:0.95\n0, 0.1\n9, {m}\n")
        (out / f"{name}.seconds").write_text(f"{s}\n")
    return out


def _rows(out: Path, parts=gc.PARTS) -> dict[str, tuple[str, bool | None]]:
    return {goal: (measured, ok) for _, goal, measured, _, ok in gc.checks(gc.read_out(out), parts)}


def test_every_goal_met_on_numbers_that_meet_them(tmp_path, capsys):
    out = fake_out(tmp_path / "good")
    rows = _rows(out)
    judged = {g: ok for g, (_, ok) in rows.items() if ok is not None}
    assert all(judged.values()) and len(judged) == 17, judged  # 5 step, 6 precision, 6 throughput
    assert rows["best fp16 candidate over TF32"][0] == "2.88x (fp16-compile)"
    assert rows["candidate fp16-graphs"][0] == "failed: X"
    assert rows["loader: --augment-on device, 16 workers"][0] == "2500 img/s; the device's share 12.3 ms a batch"
    assert "0.88 of the fp16 step" in rows["loop: --augment-on device, 8 workers"][0]
    assert rows["loop: --augment-on host, 8 workers"][1] is None  # information: the goal is the device path's
    assert rows["torchrun 2 GPUs"] == ("skipped: the machine has 1 GPU; a 2-process run needs 2", None)
    assert rows["detect.py box agreement (same class, IoU >= 0.95)"][0] == "1.000"
    assert gc.summary(out) == 0
    text = capsys.readouterr().out
    assert text.count("\n") == len(rows) + 3 and text.strip().splitlines()[-1].startswith("PASS")  # one table
    assert _rows(fake_out(tmp_path / "two", ngpu=2))["torchrun 2 GPUs: epochs / skipped"] == ("1 / 2", True)


@pytest.mark.parametrize("bad, missed", [
    (dict(fp16=1500.0), {"fp16 (train.py's) over TF32", "fp16 images/s", "best fp16 candidate over TF32"}),
    (dict(memory=0.7), {"fp16 peak memory over TF32"}),
    (dict(infer=1.2), {"detect.py FP16 inference over FP32, batch 32"}),
    (dict(map_half=0.39), {"test.py fp16/best.pt half vs FP32: max |mAP diff|",
                           "test.py fp32/best.pt half vs FP32: max |mAP diff|"}),
    (dict(fp16_skips=30), {"train fp16: skipped steps"}),
    (dict(rc={"train_fp32": 124}), {"train_fp32 exited 124 (time limit)"}),
    (dict(loop_device=1000.0), {"loop: --augment-on device, 8 workers"}),
    (dict(images=128), {"loop: --augment-on device, 8 workers"}),  # COCO128 alone times epoch start-ups
    (dict(small=15.0, loader=800.0), {"loop: yolov5n 192 batch 16, built-in set",
                                      "loader: --augment-on device, 16 workers"}),
    (dict(y5_seconds=72.0, identical=False), {"peers: YOLOv5's time over ours",
                                              "seeded run twice (deterministic, CUDA default)"}),
])
def test_each_missed_goal_is_reported(bad, missed, tmp_path):
    out = fake_out(tmp_path / "bad", **bad)
    assert {g for g, (_, ok) in _rows(out).items() if ok is False} == missed
    assert gc.summary(out) == 1


def test_missing_results_are_failures_and_parts_judge_only_their_own(tmp_path):
    out = fake_out(tmp_path / "gone")
    (out / "detect.json").unlink()
    (out / "fp32" / "results.csv").unlink()
    rows = _rows(out)
    assert rows["detect.py in both precisions"] == ("missing", False)
    assert rows["train fp32: finished epochs"] == ("missing", False)
    assert not any(ok is False for _, ok in _rows(out, ("step", "throughput")).values())
    assert gc.summary(tmp_path / "empty") == 1  # nothing at all: every part fails, no crash
    assert gc.summary(out, ("throughput",)) == 0


def test_box_agreement_counts_same_class_boxes_that_overlap():
    box = np.array([[0, 0.1, 0.1, 0.5, 0.5]])
    assert gc.box_agreement({"a": box}, {"a": box.copy()}) == 1.0
    assert gc.box_agreement({}, {}) == 1.0  # nothing found by either
    assert gc.box_agreement({"a": box}, {"a": box + [1, 0, 0, 0, 0]}) == 0.0  # another class
    moved, far = box + [0, 0.05, 0, 0.05, 0], box + [0, 0.3, 0.3, 0.3, 0.3]  # IoU 0.78; elsewhere
    assert gc.box_agreement({"a": np.vstack([box, far])}, {"a": np.vstack([moved, far])}) == 0.5
    assert gc.box_agreement({"a": box}, {"a": np.zeros((0, 5))}) == 0.0  # a box the other precision lost


@pytest.mark.slow
def test_without_cuda_it_refuses_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the check would run for minutes")
    r = subprocess.run([sys.executable, "bench/gpu_check.py", "run"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.strip().count("\n") == 0 and "no CUDA device" in r.stderr


@pytest.mark.slow
def test_every_step_runs_at_toy_sizes_on_the_cpu(tiny_data, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "bench/gpu_check.py", "run", "--tiny", "--data", str(tiny_data), "--out",
                        str(out), "--budget", "1200"], cwd=REPO, capture_output=True, text=True, timeout=1500,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "AMPYOLO_HOME": str(tmp_path / "h")})
    assert r.returncode in (0, 1), r.stdout[-3000:] + r.stderr[-3000:]  # toy sizes on a CPU miss the GPU's goals
    codes = {f.stem: f.read_text().strip() for f in out.glob("*.rc")}
    assert len(codes) == 17 and set(codes.values()) == {"0"}, codes  # every step ran to its end
    rows = _rows(out)
    assert rows["candidate fp16-graphs"][0] == "needs CUDA" and "compiled in" in rows["candidate fp16-compile"][0]
    for path in ("device", "host"):
        for workers in (1, 2):
            assert "48 images an epoch" in rows[f"loop: --augment-on {path}, {workers} workers"][0]  # 2 copies of 24
    assert "the device's share" in rows["loader: --augment-on device, 2 workers"][0]
    assert "img/s on cpu" in rows["decode (cache off): cv2 on 1 core vs decode_jpeg"][0]
    assert rows["seeded run twice (deterministic, CUDA default)"][0].startswith("weights identical: True")
    assert "test.py fp16/best.pt half vs FP32: max |mAP diff|" in rows
    assert "detect.py FP16 inference over FP32, batch 4" in rows
    assert "| part | goal | measured | target | |" in r.stdout  # the summary table closes the output
