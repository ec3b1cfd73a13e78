"""The CUDA precision path, proven on a CPU: fp16 autocast with a live GradScaler through train.py's own
loop, and truly FP16 (.half()) models in test.py and detect.py, end to end on tiny data.

fp16 is emulated on most CPUs (utils.engine.amp.CPU_FP16_TRAIN_SLOWDOWN), so every run here is yolov5n at
64-96 px on 8 images. Each test names the known fp16 failure mode it catches.
"""
from __future__ import annotations

import copy
import csv
import os
import signal
import subprocess
import sys
import test as test_cli
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch

import detect
import train
import validator as evaluator
from utils.boxes import non_max_suppression
from utils.engine import updater
from utils.engine.amp import Precision
from utils.engine.checkpoint import atomic_save, load_checkpoint, make_checkpoint
from utils.engine.faults import ENV, parse_faults
from utils.options import to_argv
from utils.report.results import read_rows

REPO = Path(__file__).resolve().parents[1]
# 8 images in batches of 2: 4 optimizer steps per epoch (the short-schedule recipe steps every batch)
ARGS = dict(imgsz=64, batch_size=2, workers=0, noplots=True, amp="fp16", device="cpu", seed=3)
EPOCHS, STEPS_PER_EPOCH = 2, 4
WARNING = "warning: --amp fp16 on a CPU"

# the GradScaler's search for its scale skips first steps: torch warns that the scheduler stepped first
# one thread here and in the child process: the same arithmetic, so runs compare bit for bit
pytestmark = [pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step"),
              pytest.mark.usefixtures("one_thread")]


# ----------------------------------------------------------------------------------------- watching the loop


@dataclass
class Watch:
    """What the runs inside `watch()` did, seen from outside the loop."""

    steps: list[tuple[bool, float, int]] = field(default_factory=list)  # per step: finite, scale after, EMA updates
    ema_fp32: list[bool] = field(default_factory=list)  # per step: every EMA tensor still FP32
    ema_intact: list[bool] = field(default_factory=list)  # per validation: EMA bit-identical across it
    val_dtypes: list[torch.dtype] = field(default_factory=list)  # per validation: dtype of the model it ran
    final: dict = field(default_factory=dict)  # at finish: the precision and the updater's state


@contextmanager
def watch() -> Iterator[Watch]:
    """Spies on AmpUpdater.step, train.validate, test.py's model preparation and train.finish."""
    w = Watch()
    step, validate, prepare, finish = updater.AmpUpdater.step, train.validate, evaluator._prepare_model, train.finish

    def spy_step(self):
        finite = step(self)
        w.steps.append((finite, float(self.scaler.get_scale()), self.ema.updates))
        ema = self.ema.ema.state_dict().values()
        w.ema_fp32.append(all(v.dtype == torch.float32 for v in ema if v.is_floating_point()))
        return finite

    def spy_validate(t, final):
        before = {k: v.clone() for k, v in t.ema.ema.state_dict().items()}
        result = validate(t, final)
        after = t.ema.ema.state_dict()
        w.ema_intact.append(all(torch.equal(before[k], after[k]) and before[k].dtype == after[k].dtype for k in before))
        return result

    def spy_prepare(*args, **kwargs):
        out = prepare(*args, **kwargs)
        model = getattr(out[0], "model", out[0])  # a checkpoint comes back behind utils.interop.backends.PyTorchBackend
        w.val_dtypes.append(next(model.parameters()).dtype)
        return out

    def spy_finish(t):
        w.final = {"precision": t.precision, "updater": copy.deepcopy(t.updater.state_dict())}
        finish(t)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(updater.AmpUpdater, "step", spy_step)
        mp.setattr(train, "validate", spy_validate)
        mp.setattr(evaluator, "_prepare_model", spy_prepare)
        mp.setattr(train, "finish", spy_finish)
        yield w


@pytest.fixture(scope="module")
def fp16_run(micro, tmp_path_factory) -> tuple[train.Outcome, Watch]:
    """The uninterrupted fp16 run the others are compared with."""
    with watch() as w:
        out = train.run(data=str(micro), project=str(tmp_path_factory.mktemp("fp16")), epochs=EPOCHS, **ARGS)
    return out, w


def _rows(save_dir: Path) -> list[dict]:
    return list(csv.DictReader(open(save_dir / "results.csv")))


# ----------------------------------------------------------------------------------------- training


@pytest.mark.slow
def test_fp16_run_has_a_live_grad_scaler_an_fp32_ema_and_fp16_checkpoints(fp16_run):
    """Catches: validation rounding the EMA (it evaluates a half copy, as on CUDA), an EMA kept in FP16."""
    out, w = fp16_run
    assert w.final["precision"] == Precision("fp16", "cpu")
    scaler = w.final["updater"]["scaler"]
    assert scaler and scaler["scale"] > 1  # a live GradScaler (a disabled one has an empty state)
    assert len(w.steps) == EPOCHS * STEPS_PER_EPOCH and any(finite for finite, _, _ in w.steps)
    skipped = sum(not finite for finite, _, _ in w.steps)
    assert w.final["updater"]["skipped"] == skipped == int(_rows(out.save_dir)[-1]["skipped_steps"])
    assert w.steps[-1][2] == len(w.steps) - skipped  # the EMA follows the applied steps only
    assert all(w.ema_fp32) and all(p.dtype == torch.float32 for p in out.ema.parameters())
    assert w.val_dtypes == [torch.float16] * EPOCHS  # live validation ran a truly FP16 copy ...
    assert w.ema_intact == [True] * EPOCHS  # ... and left the FP32 EMA bit-identical
    for name in ("best.pt", "last.pt"):
        ckpt = load_checkpoint(out.save_dir / "weights" / name)
        assert "train" not in ckpt
        assert all(v.dtype == torch.float16 for v in ckpt["model"].values() if v.is_floating_point())


@pytest.mark.slow
def test_injected_overflow_lowers_the_scale_and_skips_exactly_that_step(fp16_run, micro, tmp_path, monkeypatch):
    """Catches: an overflow that reaches the weights or the EMA, a scale that is not lowered, more than
    one step lost. The overflow is real: the loss times 2**100 makes the FP16 gradients inf."""
    assert parse_faults("overflow@3,5").overflow == {3, 5}
    ref = fp16_run[1].steps
    k = max(i for i, (finite, _, _) in enumerate(ref) if finite)  # a step the scaler let through
    monkeypatch.setenv(ENV, f"overflow@{k}")
    with watch() as w:
        out = train.run(data=str(micro), project=str(tmp_path), epochs=EPOCHS, **ARGS)
    assert w.steps[:k] == ref[:k]  # identical up to the injected step
    scale_before = ref[k - 1][1] if k else 65536.0
    updates_before = ref[k - 1][2] if k else 0
    assert w.steps[k] == (False, scale_before / 2, updates_before)  # skipped, scale halved, EMA untouched
    skipped_before = sum(not finite for finite, _, _ in ref[:k])
    assert sum(not finite for finite, _, _ in w.steps[: k + 1]) == skipped_before + 1
    assert all(np.isfinite(float(r["train/box_loss"])) for r in _rows(out.save_dir))
    assert all(torch.isfinite(p).all() for p in out.ema.parameters())


@pytest.mark.slow
def test_sigkill_and_resume_of_an_fp16_run_ends_bit_identical(fp16_run, micro, tmp_path):
    """Catches: scaler state lost on resume. The scale in last.pt is the live one (lowered below its
    initial 2**16 by the first steps' overflows here); a resumed run that restarted at 2**16 would skip
    different steps, and its weights, skipped_steps column and scaler would differ."""
    ref_out, ref_watch = fp16_run
    ref = ref_watch.steps
    project = tmp_path / "killed"
    # the run kills itself as epoch 1 starts (utils/engine/faults.py kill@1): a parent's SIGKILL after seeing epoch 0
    # in last.pt raced the child, which could finish this tiny run first (and strip last.pt) on a loaded machine
    env = os.environ | {"OMP_NUM_THREADS": "1", ENV: "kill@1"}
    cmd = [sys.executable, "train.py", "--data", str(micro), "--project", str(project), "--epochs", str(EPOCHS),
           *to_argv(ARGS)]
    with open(tmp_path / "log.txt", "w") as log:  # the CLI logs to stdout
        child = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.DEVNULL, timeout=600)
    assert child.returncode == -signal.SIGKILL
    last = project / "exp" / "weights" / "last.pt"
    assert sum(WARNING in line for line in open(tmp_path / "log.txt")) == 1  # the CLI's one-line warning

    state = load_checkpoint(last)["train"]
    assert state["completed_epoch"] == 0
    scaler = state["updater"]["scaler"]
    assert scaler["scale"] == ref[STEPS_PER_EPOCH - 1][1] > 1  # the scale after epoch 0, not a fresh one
    assert state["updater"]["skipped"] == sum(not f for f, _, _ in ref[:STEPS_PER_EPOCH])

    with watch() as w:
        resumed = train.run(resume=str(last), workers=0)
    assert w.steps == ref[STEPS_PER_EPOCH:]  # every step of epoch 1 as in the uninterrupted run
    assert w.final["updater"] == ref_watch.final["updater"]  # scale, growth tracker, skipped count
    a, b = ref_out.ema.state_dict(), resumed.ema.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # bit-identical
    assert read_rows(ref_out.save_dir / "results.csv", clock=False) == \
        read_rows(resumed.save_dir / "results.csv", clock=False)


# ----------------------------------------------------------------------------------------- inference


@pytest.fixture(scope="module")
def trained(micro, tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, data YAML): yolov5n overfitted in FP32 on micro's 8 training images at 96 px (100
    AdamW steps on that one batch, about 10 s), saved in the project's format (FP16 weights), and a data
    YAML that validates on the same images. An untrained model's scores all sit near the thresholds, where
    rounding alone decides what is kept; this one finds the shapes with confident boxes."""
    from models.yolo import Model
    from utils.data.data_config import load_data_config
    from utils.hyp import load_hyp
    from utils.data.datasets import create_dataloader
    from utils.engine.loss import ComputeLoss, loss_gains

    d = tmp_path_factory.mktemp("trained")
    yaml = d / "seen.yaml"
    yaml.write_text(micro.read_text().replace("val.txt", "train.txt"))
    data = load_data_config(yaml)
    loader, _ = create_dataloader(data["train"], 96, 8, 32, workers=0)
    imgs, targets, _, _ = next(iter(loader))
    torch.manual_seed(0)
    model = Model("yolov5n.yaml", nc=data["nc"]).train()
    loss_fn = ComputeLoss(model, loss_gains(load_hyp(), 3, data["nc"], 96, cls_by_nc=False, box_gain=4.0))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = imgs.float() / 255
    for _ in range(100):
        loss, _ = loss_fn(model(x), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ckpt = d / "trained.pt"
    atomic_save(make_checkpoint(model, model.yaml, data["names"], epoch=99), ckpt)
    return ckpt, yaml


@pytest.mark.slow
def test_test_py_half_on_cpu_gives_the_fp32_map(trained, tmp_path):
    """Catches: input not cast to half (a .half() model refuses FP32 input), FP16 losing detections."""
    ckpt, yaml = trained
    with watch() as w:
        common = ["--weights", str(ckpt), "--data", str(yaml), "--img", "96", "--device", "cpu", "--workers", "0",
                  "--no-plots", "--project", str(tmp_path)]
        (fp32,) = test_cli.main(common + ["--no-half"])
        (fp16,) = test_cli.main(common + ["--half"])
    assert w.val_dtypes == [torch.float32, torch.float16]  # --half on a CPU: a truly FP16 model
    assert fp32.map50 > 0.3, "the model must find the shapes, or the comparison says nothing"
    assert abs(fp16.map - fp32.map) <= 0.01 and abs(fp16.map50 - fp32.map50) <= 0.01, (fp16.map, fp32.map)


def _boxes(folder: Path) -> dict[str, np.ndarray]:
    """labels/*.txt of detect.py --save-txt --save-conf: per image rows cls, x1, y1, x2, y2 (normalised), conf."""
    out = {}
    for f in sorted(folder.glob("*.txt")):
        rows = np.loadtxt(f, ndmin=2).reshape(-1, 6) if f.stat().st_size else np.zeros((0, 6))
        xy, wh = rows[:, 1:3], rows[:, 3:5]
        out[f.stem] = np.concatenate([rows[:, :1], xy - wh / 2, xy + wh / 2, rows[:, 5:]], 1)
    return out


@pytest.mark.slow
def test_detect_py_half_on_cpu_gives_the_fp32_boxes(trained, micro, tmp_path):
    """Catches: input not cast to half, box decoding or NMS in FP16 (boxes that move or vanish).

    FP16 activations carry about three significant digits, so a box's regression moves by a fraction of
    a pixel; where two anchors' candidates nearly tie, NMS may keep the other one, a little further off
    (0.8 px on a 15 px box on one CPU here, IoU 0.93). So each FP32 box must have an FP16 box of the same
    class with every corner within 1.5 px (of 96) and a score within 0.02; lost, extra or moved boxes fail."""
    ckpt, _ = trained
    src = tmp_path / "images"
    src.mkdir()
    for p in (micro.parent / "train.txt").read_text().split():
        (src / Path(p).name).symlink_to(p)
    runs = {}
    for flag in ("--no-half", "--half"):
        save = detect.main(["--weights", str(ckpt), "--source", str(src), "--img", "96", "--device", "cpu",
                            "--batch-size", "4", "--save-txt", "--save-conf", "--nosave", "--project", str(tmp_path),
                            "--name", flag.strip("-"), flag])
        runs[flag] = _boxes(save / "labels")
    fp32, fp16 = runs["--no-half"], runs["--half"]
    assert fp32.keys() == fp16.keys() and sum(len(b) for b in fp32.values()) >= 8, "too few boxes to compare"
    for stem, a in fp32.items():
        b = fp16[stem]
        assert len(a) == len(b), stem
        if len(a):
            corners = np.abs(a[:, None, 1:5] - b[None, :, 1:5]).max(2) * 96  # px, every pair
            same_class, scores = a[:, None, 0] == b[None, :, 0], np.abs(a[:, None, 5] - b[None, :, 5])
            close = (corners <= 1.5) & same_class & (scores <= 0.02)
            assert close.any(1).all() and close.any(0).all(), (stem, corners.min(1))


def test_fp16_box_decode_and_nms_compute_in_fp32():
    """Catches: box decoding or NMS in FP16 at full size, where FP16 has half-pixel steps above 512 px and
    box areas overflow it (65504). The decode must equal the FP32 decode of the same map rounded once."""
    from models.yolo import Model

    torch.manual_seed(0)
    det = Model("yolov5n.yaml", nc=3).eval().model[-1]
    raw = (torch.randn(2, det.na, 80, 80, det.no) * 2).half()  # P3 at 640 px
    assert torch.equal(det._decode(0, raw), det._decode(0, raw.float()).half())
    g = torch.Generator().manual_seed(0)
    xy, wh = 100 + 440 * torch.rand(1, 300, 2, generator=g), 250 + 200 * torch.rand(1, 300, 2, generator=g)
    pred = torch.cat((xy, wh, torch.rand(1, 300, 4, generator=g)), 2)  # areas 62500..202500 px
    pred = pred.half().float()  # the values an FP16 model produces
    a, b = non_max_suppression(pred, 0.1, 0.45)[0], non_max_suppression(pred.half(), 0.1, 0.45)[0]
    assert len(a) > 1 and torch.equal(a, b)
