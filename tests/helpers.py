"""Helpers shared by test modules (tests never import bench/)."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from utils import errors
from utils.boxes import xywhn2xyxy
from utils.data.data_config import SHARED_COCO128
from utils.engine.callbacks import Callbacks
from utils.files import REPO_ROOT
from utils.hyp import DEFAULT_HYP_FILE

DEFAULT_DATASET = SHARED_COCO128
MAX_PER_IMAGE = 100  # pycocotools keeps the top 100 per image and class; we never exceed it per image


def hyp_file(directory: Path, **changes) -> Path:
    """The default hyperparameter file with `changes`, written into `directory`."""
    hyp = {**yaml.safe_load(DEFAULT_HYP_FILE.read_text()), **changes}
    path = directory / "hyp.yaml"
    path.write_text(yaml.safe_dump(hyp, sort_keys=False))
    return path


def read_curves(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """A run folder's TensorBoard scalars, {tag: [(step, value), ...]}, read with TensorBoard's own reader; every
    point kept, so a duplicated step shows up twice."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir), size_guidance={"scalars": 0}, purge_orphaned_data=False)  # 0: keep all
    ea.Reload()
    return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


def one_error(outcome, *words: str, alone: bool | None = None) -> str:
    """A user's mistake as the project answers it: exit status 2, exactly one line starting "error: " that holds each
    of `words`, and no traceback. `outcome`: a CLI run in a process of its own (subprocess.CompletedProcess, text
    mode) or in this one (cli_in_process's (code, lines)). alone: stderr holds nothing but that line (the default
    for a process of its own; in this process a progress bar may stand beside it). Returns the line."""
    if isinstance(outcome, subprocess.CompletedProcess):
        code, text, lines = outcome.returncode, outcome.stdout + outcome.stderr, outcome.stderr.splitlines()
        alone = True if alone is None else alone
    else:
        code, lines = outcome
        text = "\n".join(lines)
    lines = [ln for ln in lines if ln.strip()]
    assert "Traceback" not in text, text[-3000:]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert code == 2 and len(errors) == 1, (code, lines[-20:])
    assert not alone or len(lines) == 1, lines[-20:]
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


def cli_in_process(main, argv: list[str], capsys, monkeypatch) -> tuple[int, list[str]]:
    """A CLI's main through run_cli in this process: (exit code, non-empty stderr lines), never a traceback."""
    monkeypatch.setattr(errors, "setup_logging", lambda *a, **k: None)  # keep pytest's logging handlers
    capsys.readouterr()
    try:
        errors.run_cli(lambda: main(argv), restore_signals=True)
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, [ln for ln in err.splitlines() if ln.strip()]


def one_error_line(argv: list[str]) -> str:
    """One of the commands (argv: script and its arguments) in a process of its own, as `one_error` checks it: its
    one error line."""
    r = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    return one_error(r)


def log_lines(caplog, start: str = "") -> list[str]:
    """The messages caplog holds that start with `start`."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(start)]


def interrupt_at(epoch: int) -> Callbacks:
    """A Ctrl-C as `epoch` starts (a KeyboardInterrupt is what the signal handler raises)."""
    def stop(t, e):
        if e == epoch:
            raise KeyboardInterrupt

    cb = Callbacks()
    cb.register("on_epoch_start", stop)
    return cb


def batch_recorder() -> tuple[Callbacks, list[tuple[int, tuple[int, ...]]]]:
    """Callbacks recording (ni, image batch shape) of every training batch."""
    seen: list[tuple[int, tuple[int, ...]]] = []
    cb = Callbacks()
    cb.register("on_train_batch", lambda t, ni, imgs, targets, paths: seen.append((ni, tuple(imgs.shape))))
    return cb, seen


# ----------------------------------------------------------------------------------------- a fixed COCO128 prediction set
# (tests/test_metrics.py's pycocotools agreement; `python bench/speed.py metrics` times the same set)


def load_ground_truth(dataset: Path) -> tuple[dict, dict[int, np.ndarray], list[int]]:
    """(COCO json dict, image_id -> YOLO labels (n, 5) cls, x1, y1, x2, y2 in pixels, COCO91 id per class)."""
    coco = json.loads((dataset / "annotations.json").read_text())
    coco91 = json.loads((dataset / "yolo80_to_coco91.json").read_text())
    labels = {}
    for im in coco["images"]:
        f = dataset / "labels" / "train2017" / (Path(im["file_name"]).stem + ".txt")
        rows = np.loadtxt(f, ndmin=2) if f.exists() and f.stat().st_size else np.zeros((0, 5))
        boxes = xywhn2xyxy(rows[:, 1:5], im["width"], im["height"])
        labels[im["id"]] = np.concatenate([rows[:, :1], boxes], 1)
    return coco, labels, coco91


def _jitter(boxes: np.ndarray, rng: np.random.Generator, scale: float) -> np.ndarray:
    """Move each corner by a random fraction of the box size."""
    wh = np.concatenate([boxes[:, 2:4] - boxes[:, :2]] * 2, 1)
    return boxes + rng.normal(0, scale, boxes.shape) * wh


def _image_predictions(gt: np.ndarray, w: int, h: int, rng: np.random.Generator, nc: int) -> np.ndarray:
    """(n, 6) x1, y1, x2, y2, score, cls for one image."""
    keep = gt[rng.random(len(gt)) < 0.85]  # some objects are missed
    dup = keep[rng.random(len(keep)) < 0.3]  # some are found twice
    hits = np.concatenate([keep, dup])
    boxes = _jitter(hits[:, 1:], rng, rng.choice([0.03, 0.08, 0.2], size=(len(hits), 1)))
    cls = np.where(rng.random(len(hits)) < 0.1, rng.integers(0, nc, len(hits)), hits[:, 0])  # class swaps
    scores = np.clip(rng.beta(4, 2, len(hits)), 0.001, 1)
    n_fp = int(rng.integers(0, 25))
    xy = rng.random((n_fp, 2)) * [w, h]
    fp = np.concatenate([xy, xy + rng.random((n_fp, 2)) * [w / 2, h / 2]], 1)
    fp_cls = np.where(rng.random(n_fp) < 0.5, rng.choice(gt[:, 0], n_fp) if len(gt) else 0, rng.integers(0, nc, n_fp))
    boxes = np.concatenate([boxes, fp]).clip(0, [w, h, w, h])
    all_scores = np.concatenate([scores, rng.beta(2, 4, n_fp)])
    out = np.concatenate([boxes, all_scores[:, None], np.concatenate([cls, fp_cls])[:, None]], 1)
    out = out[(out[:, 2] > out[:, 0] + 1) & (out[:, 3] > out[:, 1] + 1)]
    return out[np.argsort(-out[:, 4], kind="stable")][:MAX_PER_IMAGE]


def make_predictions(dataset: Path = DEFAULT_DATASET, seed: int = 0) -> list[dict]:
    """The fixed prediction set in COCO result format (boxes [x, y, w, h] rounded to 3 decimals)."""
    coco, labels, coco91 = load_ground_truth(dataset)
    rng = np.random.default_rng(seed)
    preds = []
    for im in coco["images"]:
        for x1, y1, x2, y2, s, c in _image_predictions(labels[im["id"]], im["width"], im["height"], rng, len(coco91)):
            preds.append({"image_id": im["id"], "category_id": coco91[int(c)],
                          "bbox": [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)], "score": round(s, 5)})
    return preds


def image_pairs(preds: list[dict], ground_truth: tuple) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per image (detections (n, 6) xyxy, conf, cls; labels (m, 5) cls, xyxy) in pixels, from COCO-format
    predictions and `load_ground_truth`'s result: what test.py's evaluation loop accumulates."""
    coco, labels, coco91 = ground_truth
    to_yolo = {c: i for i, c in enumerate(coco91)}
    by_image: dict[int, list] = {im["id"]: [] for im in coco["images"]}
    for p in preds:
        x, y, w, h = p["bbox"]
        by_image[p["image_id"]].append([x, y, x + w, y + h, p["score"], to_yolo[p["category_id"]]])
    return [(torch.tensor(rows, dtype=torch.float32).reshape(-1, 6), torch.from_numpy(labels[i]).float())
            for i, rows in by_image.items()]


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, options: str):
    """A tmpfs mounted at `folder` (made here) with mount `options` (e.g. "size=12m", "ro,size=64k"), unmounted at
    the end; the test is skipped where mounting is not allowed (not root, no CAP_SYS_ADMIN)."""
    import os
    import shutil
    import subprocess

    folder.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
