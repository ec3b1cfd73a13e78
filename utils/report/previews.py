"""Batch previews in the run folder: train_batch{0,1,2}.jpg, val_batch{0,1,2}_labels.jpg / _pred.jpg, labels.jpg.

A preview is a grid of up to 16 images of a batch with their boxes and class names, drawn with OpenCV alone
(Hershey fonts: nothing to download, no matplotlib). Tiles are scaled so the text stays legible on the
built-in dataset's 192 px images (scaled up) and the file stays small on 640 px ones (scaled down).
Inputs are what the loops already hold: the batch tensor (RGB, uint8 0..255 or float 0..1), targets
(n, 6) = image index, class, cx, cy, w, h normalised, and NMS output (n, 6) = x1, y1, x2, y2, conf, class
in the batch's pixels.
"""
from __future__ import annotations

import logging
import math
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import cv2
import numpy as np
import torch

from utils.files import atomic_write
from utils.report.draw import colors


def _class_colour(c: int) -> tuple[int, int, int]:
    """BGR colour of class c in the palette every picture of the project uses."""
    return colors(c, bgr=True)

LOGGER = logging.getLogger(__name__)

FONT = cv2.FONT_HERSHEY_SIMPLEX
MAX_IMAGES = 16
MIN_TILE = 320  # px: small images are scaled up to this so a class name is readable
MAX_MOSAIC = 1920  # px: the grid's longest side at most (640 px batches are scaled down)
CONF_THRES = 0.25  # predictions drawn in val_batch*_pred.jpg
MAX_DRAWN = 300  # boxes per image at most (an untrained model's NMS output can hold thousands)


def _to_uint8_hwc(images: torch.Tensor | np.ndarray) -> np.ndarray:
    """(B, 3, H, W) RGB, uint8 or float 0..1 -> (B, H, W, 3) BGR uint8."""
    x = images.detach().cpu() if isinstance(images, torch.Tensor) else torch.as_tensor(images)
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"expected a (B, 3, H, W) image batch, got shape {tuple(x.shape)}")
    if x.is_floating_point():
        x = (x.float() * 255).round().clamp(0, 255)
    x = x.to(torch.uint8)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return np.ascontiguousarray(x.permute(0, 2, 3, 1).numpy()[..., ::-1])


def grid_geometry(n: int, h: int, w: int) -> tuple[int, float]:
    """(columns, scale of each image) for n tiles of h x w pixels: small images up to MIN_TILE, and the grid's
    width at most MAX_MOSAIC."""
    cols, side = math.ceil(math.sqrt(n)), max(h, w)
    return cols, min(max(MIN_TILE / side, 1.0), MAX_MOSAIC / (cols * side))


def _label_text(names: Sequence[str] | dict, c: int, conf: float | None) -> str:
    try:
        name = str(names[c])
    except (IndexError, KeyError, TypeError):
        name = str(c)
    return name if conf is None else f"{name} {conf:.2f}"


def _draw_box(tile: np.ndarray, xyxy: np.ndarray, text: str, color: tuple[int, int, int], lw: int, font_scale: float) -> None:
    h, w = tile.shape[:2]
    x1, y1, x2, y2 = (int(round(v)) for v in xyxy)
    x1, x2 = max(min(x1, w - 1), 0), max(min(x2, w - 1), 0)
    y1, y2 = max(min(y1, h - 1), 0), max(min(y2, h - 1), 0)
    cv2.rectangle(tile, (x1, y1), (x2, y2), color, lw, cv2.LINE_8)
    if not text:
        return
    (tw, th), base = cv2.getTextSize(text, FONT, font_scale, 1)
    top = y1 - th - base - 2 if y1 - th - base - 2 >= 0 else min(y1 + lw, h - th - base - 2)
    left = min(max(x1, 0), max(w - tw - 2, 0))
    cv2.rectangle(tile, (left, top), (left + tw + 1, top + th + base + 1), color, -1, cv2.LINE_8)
    b, g, r = color
    ink = (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 150 else (255, 255, 255)
    cv2.putText(tile, text, (left + 1, top + th + 1), FONT, font_scale, ink, 1, cv2.LINE_AA)


def draw_mosaic(images: torch.Tensor | np.ndarray, boxes: Sequence[np.ndarray], names: Sequence[str] | dict,
                paths: Sequence[str] | None = None) -> np.ndarray:
    """A BGR grid of the first MAX_IMAGES images; boxes[i] is (n, 6) x1, y1, x2, y2, conf (nan = a label), class
    in image i's pixels."""
    ims = _to_uint8_hwc(images[:MAX_IMAGES])
    n, h, w = ims.shape[:3]
    cols, scale = grid_geometry(n, h, w)
    rows = math.ceil(n / cols)
    th, tw = int(round(h * scale)), int(round(w * scale))
    canvas = np.full((rows * th, cols * tw, 3), 255, np.uint8)
    lw = max(1, round(max(th, tw) / 200))
    font_scale = 0.45
    for i in range(n):
        tile = cv2.resize(ims[i], (tw, th), interpolation=cv2.INTER_LINEAR) if scale != 1 else ims[i].copy()
        b = np.asarray(boxes[i] if i < len(boxes) else np.zeros((0, 6)), dtype=np.float64).reshape(-1, 6)
        for x1, y1, x2, y2, conf, c in b[:MAX_DRAWN]:
            xyxy = np.array([x1, y1, x2, y2]) * np.array([tw / w, th / h, tw / w, th / h])
            label = _label_text(names, int(c), None if math.isnan(conf) else float(conf))
            _draw_box(tile, xyxy, label, _class_colour(int(c)), lw, font_scale)
        if paths is not None and i < len(paths):
            name = Path(str(paths[i])).name[:40]
            (nw, nh), nb = cv2.getTextSize(name, FONT, font_scale, 1)
            cv2.rectangle(tile, (0, th - nh - nb - 4), (nw + 4, th - 1), (40, 40, 40), -1, cv2.LINE_8)
            cv2.putText(tile, name, (2, th - nb - 2), FONT, font_scale, (255, 255, 255), 1, cv2.LINE_AA)
        r, c0 = divmod(i, cols)
        canvas[r * th:(r + 1) * th, c0 * tw:(c0 + 1) * tw] = tile
        cv2.rectangle(canvas, (c0 * tw, r * th), ((c0 + 1) * tw - 1, (r + 1) * th - 1), (255, 255, 255), 1)
    return canvas


def _targets_to_boxes(targets: torch.Tensor | np.ndarray, n: int, h: int, w: int) -> list[np.ndarray]:
    t = np.asarray(targets.detach().cpu() if isinstance(targets, torch.Tensor) else targets, dtype=np.float64)
    t = t.reshape(-1, 6)
    out = []
    for i in range(n):
        ti = t[t[:, 0] == i]
        cx, cy, bw, bh = ti[:, 2] * w, ti[:, 3] * h, ti[:, 4] * w, ti[:, 5] * h
        xyxy = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1)
        out.append(np.concatenate([xyxy, np.full((len(ti), 1), np.nan), ti[:, 1:2]], 1))
    return out


def _write_jpg(im: np.ndarray, path: str | Path) -> Path:
    path = Path(path)
    ok, buf = cv2.imencode(".jpg", im, [cv2.IMWRITE_JPEG_QUALITY, 90])
    if not ok:
        raise RuntimeError(f"could not encode {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(buf.tobytes()))
    return path


def plot_train_batch(images: torch.Tensor, targets: torch.Tensor, paths: Sequence[str] | None,
                     names: Sequence[str] | dict, out_path: str | Path) -> Path:
    """train_batch{k}.jpg: the augmented batch as the model sees it, with its labels and class names."""
    n, h, w = min(len(images), MAX_IMAGES), images.shape[-2], images.shape[-1]
    return _write_jpg(draw_mosaic(images, _targets_to_boxes(targets, n, h, w), names, paths), out_path)


def plot_val_batch(images: torch.Tensor, targets: torch.Tensor, preds: Sequence[torch.Tensor],
                   names: Sequence[str] | dict, labels_path: str | Path, pred_path: str | Path,
                   paths: Sequence[str] | None = None, conf_thres: float = CONF_THRES) -> tuple[Path, Path]:
    """val_batch{k}_labels.jpg (ground truth) and val_batch{k}_pred.jpg (detections with conf >= conf_thres) of
    the same images; preds[i] is image i's NMS output (n, 6) x1, y1, x2, y2, conf, class in the batch's pixels."""
    n, h, w = min(len(images), MAX_IMAGES), images.shape[-2], images.shape[-1]
    labels = draw_mosaic(images, _targets_to_boxes(targets, n, h, w), names, paths)
    boxes = []
    for p in list(preds)[:n]:
        p = np.asarray(p.detach().float().cpu() if isinstance(p, torch.Tensor) else p, dtype=np.float64).reshape(-1, 6)
        boxes.append(p[p[:, 4] >= conf_thres])
    pred = draw_mosaic(images, boxes, names, paths)
    return _write_jpg(labels, labels_path), _write_jpg(pred, pred_path)


def plot_dataset_labels(labels: Sequence[np.ndarray] | np.ndarray, names: Sequence[str] | dict, save_dir: str | Path) -> Path:
    """labels.jpg as utils.report.plots.plot_labels draws it (class histogram, box centres, box sizes): labels is
    the dataset's per-image (n, 5) cls cx cy w h arrays (YoloDataset.labels), or them concatenated; save_dir is
    the run folder."""
    from utils.report.plots import plot_labels  # matplotlib: imported only when this picture is drawn

    arrays = [np.asarray(x, dtype=np.float64).reshape(-1, 5) for x in labels] if not isinstance(labels, np.ndarray) \
        else [labels.reshape(-1, 5)]
    return plot_labels(np.concatenate(arrays, 0) if arrays else np.zeros((0, 5)), names, save_dir)


class PreviewThread:
    """Draws previews on one background thread, so a picture never holds up a training or validation step
    (OpenCV's resize and JPEG encoder release the GIL). Tensors are copied to the CPU when submitted; a failure
    becomes one warning at close(), never an exception in the loop."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="previews")
        self._jobs: list[tuple[str, Future]] = []

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        args = tuple(_detached(a) for a in args)
        kwargs = {k: _detached(v) for k, v in kwargs.items()}
        self._jobs.append((getattr(fn, "__name__", "preview"), self._pool.submit(fn, *args, **kwargs)))

    def close(self) -> None:
        """Wait for the pictures still being drawn; report the ones that failed."""
        for name, job in self._jobs:
            e = job.exception()
            if e is not None:
                LOGGER.warning(f"warning: {name} failed ({type(e).__name__}: {e}); training is not affected")
        self._jobs.clear()
        self._pool.shutdown(wait=True)


def _detached(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in x):
        return type(x)(_detached(v) for v in x)
    return x


TRAIN_PREVIEWS = 3  # train_batch0..2.jpg: the first three training batches


class TrainingPreviews:
    """The Trainer callbacks that draw a run's pictures (train.py registers them through register_previews), rank 0
    and without --noplots only: labels.jpg when the run starts at epoch 0, train_batch0..2.jpg from the first three
    batches. Drawn on a PreviewThread; closed at the end of the training pass that submitted the last picture (and
    always before the final validation, whose val_batch pictures validator.py draws)."""

    def __init__(self) -> None:
        self.thread: PreviewThread | None = None

    def start(self, t: Any) -> None:
        if not t.s.info.is_main or t.s.opt.noplots:
            return
        self.thread = PreviewThread()
        if t.start_epoch == 0:
            self.thread.submit(plot_dataset_labels, t.train_loader.dataset.labels, t.s.names, t.s.save_dir)

    def batch(self, t: Any, ni: int, imgs: torch.Tensor, targets: torch.Tensor, paths: Sequence[str]) -> None:
        if self.thread is not None and ni < TRAIN_PREVIEWS:
            self.thread.submit(plot_train_batch, imgs[:MAX_IMAGES], targets, list(paths)[:MAX_IMAGES], t.s.names,
                               Path(t.s.save_dir) / f"train_batch{ni}.jpg")

    def epoch_end(self, t: Any, epoch: int) -> None:
        nb = len(t.train_loader)
        if (epoch + 1) * nb >= TRAIN_PREVIEWS or epoch >= t.s.epochs - 1:
            self.close(t)

    def close(self, t: Any) -> None:
        if self.thread is not None:
            self.thread.close()
            self.thread = None


def register_previews(callbacks: Any) -> TrainingPreviews:
    """Register a run's pictures into a utils.engine.callbacks.Callbacks; returns the hooks' owner."""
    previews = TrainingPreviews()
    for event, fn in (("on_train_start", previews.start), ("on_train_batch", previews.batch),
                      ("on_train_epoch_end", previews.epoch_end), ("on_train_exit", previews.close)):
        callbacks.register(event, fn)
    return previews
