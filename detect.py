"""Run a trained detector over pictures, videos and streams and save the annotated results.

    python detect.py --weights runs/train/exp/weights/best.pt --source images/
    python detect.py --weights best.pt --source video.mp4 --save-txt --save-conf
    python detect.py --weights best.pt                  # sample pictures of the built-in dataset
    python detect.py --weights a.pt b.pt --source images/   # an ensemble: both models' boxes, one NMS

Results go to runs/detect/exp{N}/: annotated pictures and videos, labels/*.txt (YOLO format, with
--save-txt) and crops/<class>/ (with --save-crop). Precision follows utils.engine.amp.inference_dtype: FP16 on
CUDA GPUs that handle it, FP32 otherwise; a CPU runs FP16 only when --half asks (emulated, slow).
The per-batch step (letterbox -> forward -> NMS -> original pixels) is models/api.predict_batch, which the Python
API (models/api.py, hubconf.py) runs too, so both find the same boxes.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import cv2
import numpy as np
import torch

from models.api import NMSOptions, predict_batch, preprocess as letterbox_batch
from models.yolo import load_for_inference
from utils.data.sources import MAX_STREAM_TIMEOUT, STREAM_TIMEOUT, Frame, MediaSource, batched
from utils.device import select_device
from utils.errors import UserError, run_cli, stops_deferred
from utils.files import cache_dir, increment_path, remove_empty_tree
from utils.inference import (CONF_THRES, DEFAULT_IMGSZ, IOU_THRES, LINE_WIDTH, MAX_DET, InferenceOptions, Timer,
                             check_rules, default_imgsz, image_hw, inference_rules, write_yolo_labels)
from utils.interop.backends import Backend, fixed_imgsz
from utils.limits import check_imgsz
from utils.options import option, parse_options
from utils.report.detections import describe, plural  # noqa: F401  (detect.plural: part of this module's interface)
from utils.report.draw import WRITE_FIX, class_name, draw_detections, encode_image, save_crop, write_file

LOGGER = logging.getLogger(__name__)
MAX_LINE_WIDTH = 100  # px; wider lines hide what they mark


@dataclass(frozen=True)
class DetectOptions(InferenceOptions):
    """Everything a detection run is configured by: run()'s keywords, and the command line (built from these)."""

    weights: str | Path | list = option("best.pt", "checkpoint (train.py's or YOLOv5's), or a .onnx / .torchscript "
                                                   "file from export.py; several checkpoints run as one ensemble",
                                        nargs="+")
    source: str | Path | None = option(None, "image, folder, glob, .txt list, video, webcam index or URL "
                                             "(default: sample pictures of the built-in dataset)")
    imgsz: int | Sequence[int] | None = option(None, "inference size, one number or h w (default: the size the weights "
                                                     "were trained at, else 640)", "--imgsz", "--img", "--img-size",
                                               nargs="+", type=int)
    conf_thres: float = option(CONF_THRES, "confidence threshold")
    iou_thres: float = option(IOU_THRES, "NMS IoU threshold")
    max_det: int = option(MAX_DET, "maximum detections per image")
    classes: Sequence[int] | None = option(None, "keep only these class indices", nargs="+", type=int)
    agnostic_nms: bool = option(False, "class-agnostic NMS")
    save_crop: bool = option(False, "save crops of each box")
    nosave: bool = option(False, "do not save images/videos")
    view_img: bool = option(False, "show results in a window")
    line_thickness: int = option(LINE_WIDTH, "box line width (pixels; 0: scaled to the picture)")
    hide_labels: bool = option(False, "draw boxes without labels")
    hide_conf: bool = option(False, "draw labels without confidences")
    vid_stride: int = option(1, "use every n-th video frame")
    stream_timeout: float = option(STREAM_TIMEOUT, "seconds without a frame before a stream is taken as ended")
    project: str | Path = option("runs/detect", "results go to project/name")
    batch_size: int = option(1, "images per batch (folders of images)")


@dataclass
class DetectResult:
    save_dir: Path
    seen: int = 0  # frames processed
    speed: dict[str, float] = field(default_factory=dict)  # ms per frame: 'pre-process', 'inference', 'NMS'
    shape: tuple[int, ...] = ()  # network input shape of the last batch


def run(weights: str | Path | list, source: str | Path | None = None, **options) -> Path:
    """Detect objects in `source` with the checkpoint `weights` (a list of several: an ensemble); `options` are
    DetectOptions fields. Returns the folder results were saved in."""
    return detect(DetectOptions(weights=weights, source=source, **options)).save_dir


def detect(opts: DetectOptions) -> DetectResult:
    """The run: open the source, load the model, then pre-process -> infer -> NMS -> save per batch."""
    check_options(opts)
    media = MediaSource(opts.source or sample_source(), opts.vid_stride, opts.stream_timeout)  # before any folder
    device = select_device(opts.device)
    model, names, stride, dtype = load_detector(opts.weights, device, opts.half)
    check_classes(opts.classes, len(names), model.path)
    size, why = default_imgsz(opts.imgsz, model, DEFAULT_IMGSZ)
    imgsz = image_hw(fixed_imgsz(model, size), stride)
    check_imgsz(imgsz, opts.batch_size, training=False, device=device)
    LOGGER.info(f"detect: {model.path} at {imgsz[0]}x{imgsz[1]} px ({why}), {str(dtype).removeprefix('torch.')} on "
                f"{device}")
    square = opts.batch_size > 1 and not media.stream  # one common shape lets frames share a batch
    save_dir = increment_path(opts.project, opts.name, exist_ok=opts.exist_ok)
    sink = ResultSink(save_dir, names, opts)
    timers = [Timer(device) for _ in range(3)]
    nms = NMSOptions(opts.conf_thres, opts.iou_thres, opts.classes, opts.agnostic_nms, opts.max_det)
    result = DetectResult(save_dir)
    if device.type == "cuda":  # first CUDA call pays for kernel selection; keep it out of the timings
        with torch.inference_mode():
            model(torch.zeros(1, 3, *imgsz, device=device, dtype=dtype))
    try:
        for frames in batched(media, 1 if media.stream else opts.batch_size):
            shape, dets = predict_batch(model, [f.im0 for f in frames], imgsz, square, nms, opts.augment, timers)
            for f, det in zip(frames, dets):
                det = det.cpu().numpy()
                sink.add(f, det)
                LOGGER.info(f"{f.position} {f.path}: {shape[2]}x{shape[3]} {describe(det, names)}, "
                            f"{timers[1].dt * 1e3 / len(frames):.1f}ms")
            result.seen += len(frames)
            result.shape = shape
    finally:
        failed = sink.close()
        media.close()
    if failed:
        raise UserError(failed[0])
    if result.seen == 0:  # every input was skipped (its warning says why): no results, so no success either
        remove_empty_tree(save_dir)
        raise UserError(f"--source {media.source}: nothing was processed, no image or video frame could be read "
                        f"(the warnings above name each file); check the files or pass another --source")
    n = max(result.seen, 1)
    result.speed = {k: t.total * 1e3 / n for k, t in zip(("pre-process", "inference", "NMS"), timers)}
    summarize(result, sink)
    return result


def check_options(opts: DetectOptions) -> None:
    """Refuse impossible values before anything is loaded or written."""
    check_rules([*inference_rules(opts.conf_thres, opts.iou_thres, opts.max_det, opts.batch_size),
                 (opts.vid_stride >= 1, f"--vid-stride {opts.vid_stride} must be 1 or more"),
                 (0 < opts.stream_timeout <= MAX_STREAM_TIMEOUT, f"--stream-timeout {opts.stream_timeout} must lie in "
                                                                 f"(0, {MAX_STREAM_TIMEOUT:g}] seconds"),
                 (0 <= opts.line_thickness <= MAX_LINE_WIDTH, f"--line-thickness {opts.line_thickness} must lie in "
                                                              f"0..{MAX_LINE_WIDTH} pixels (0: scaled to the picture)")])


def check_classes(classes: Sequence[int] | None, nc: int, weights: Path) -> None:
    """--classes within the model's classes: NMS keeps none of an index the model never predicts, so a typo would
    find nothing, silently."""
    bad = [c for c in classes or () if not 0 <= c < nc]
    if bad:
        raise UserError(f"--classes {' '.join(map(str, bad))}: {weights} has {nc} classes, 0..{nc - 1}; pass indices "
                        f"in that range")


def load_detector(weights: str | Path | list, device: torch.device,
                  half: bool | None) -> tuple[Backend, list[str], int, torch.dtype]:
    """(backend for a .pt, .onnx or .torchscript file, or an ensemble of checkpoints (models/yolo.load_for_inference),
    class names, max stride, input dtype)."""
    backend = load_for_inference(weights, device, half)
    return backend, backend.names, int(backend.stride.max()), backend.dtype


def preprocess(frames: list[Frame], imgsz: tuple[int, int], stride: int, square: bool,
               device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, list[tuple]]:
    """Frames through the shared letterbox (models/api.preprocess): an RGB (B, 3, H, W) tensor in 0..1, and per
    frame ((ry, rx), (padw, padh))."""
    return letterbox_batch([f.im0 for f in frames], imgsz, stride, square, device, dtype)


def summarize(result: DetectResult, sink: ResultSink) -> None:
    s = result.speed
    LOGGER.info(f"Speed: {s['pre-process']:.1f}ms pre-process, {s['inference']:.1f}ms inference, "
                f"{s['NMS']:.1f}ms NMS per image at shape {result.shape}")
    saved = []
    if sink.opts.save_txt:
        saved.append(f"{sink.n_labels} label files in {sink.save_dir / 'labels'}")
    if sink.opts.save_crop:
        saved.append(f"{sink.n_crops} crops in {sink.save_dir / 'crops'}")
    if sink.renamed:
        saved.append(f"{sink.renamed} input(s) shared a file name with an earlier one and were saved with a suffix")
    LOGGER.info(f"Results saved to {sink.save_dir}" + (f" ({'; '.join(saved)})" if saved else ""))


def sample_source() -> Path:
    """A folder of sample pictures generated from the built-in dataset (made once, then reused)."""
    from utils.data.synthetic import sample_images  # only needed when no --source is given

    dest = cache_dir() / "samples"
    sample_images(dest, n=4)
    return dest


def display_available() -> bool:
    """True where cv2.imshow can open a window (a desktop session; not CI, SSH or containers)."""
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


class ResultSink:
    """Writes everything a frame produces: annotated image/video, YOLO label file, crops, a window."""

    def __init__(self, save_dir: Path, names: list[str], opts: DetectOptions) -> None:
        self.save_dir, self.names, self.opts = save_dir, names, opts
        self.writers: dict[str, VideoFile] = {}
        # Two inputs with one base name (a/same.jpg, b/same.jpg through a glob or a list) must not write the
        # same outputs: each input gets its own stem (same, same_2, ...), and every output file is claimed
        # by the input (and frame) that writes it, so nothing is overwritten within a run.
        self.stems: dict[str, str] = {}  # input path -> output stem
        self.claimed: dict[Path, tuple] = {}  # output file -> (input path, frame, ...) that owns it
        self.labels: set[Path] = set()
        self.crops: set[Path] = set()
        self.renamed = 0
        self.view = opts.view_img and display_available()
        if opts.view_img and not self.view:
            LOGGER.info("--view-img: no display found (DISPLAY unset); results are saved but not shown")
        if opts.save_txt:
            try:
                (save_dir / "labels").mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UserError(f"cannot create folder {save_dir / 'labels'}: {e.strerror or e}; {WRITE_FIX}") from None

    @property
    def n_labels(self) -> int:
        """Label files this run wrote that are there now (each counted once)."""
        return sum(p.is_file() for p in self.labels)

    @property
    def n_crops(self) -> int:
        return sum(p.is_file() for p in self.crops)

    def _stem(self, f: Frame) -> str:
        """This input's output stem: its file stem, or stem_2, stem_3, ... when an earlier input had it."""
        if f.path not in self.stems:
            base = stem = f.stem
            n = 2
            while stem in self.stems.values():
                stem, n = f"{base}_{n}", n + 1
            if stem != base:
                self.renamed += 1
                LOGGER.info(f"{f.path}: an earlier input of this run has the name {base}; its results are saved "
                            f"as {stem}")
            self.stems[f.path] = stem
        return self.stems[f.path]

    def _claim(self, path: Path, owner: tuple) -> Path:
        """`path`, or path_2, path_3, ... if another input (or frame) of this run already wrote it."""
        base, n = path, 2
        while self.claimed.setdefault(path, owner) != owner:
            path, n = base.with_name(f"{base.stem}_{n}{base.suffix}"), n + 1
        return path

    def add(self, f: Frame, det: np.ndarray) -> None:
        o = self.opts
        stem = self._stem(f) if f.kind == "image" else f"{self._stem(f)}_{f.frame}"
        if o.save_txt:
            path = self._claim(self.save_dir / "labels" / f"{stem}.txt", (f.path, f.frame))
            write_yolo_labels(path, det, f.im0.shape, o.save_conf)
            self.labels.add(path)
        if o.save_crop:
            for k, (*xyxy, _, c) in enumerate(det):
                name = class_name(self.names, int(c))
                path = self._claim(self.save_dir / "crops" / name / f"{stem}_{k}.jpg", (f.path, f.frame, k))
                save_crop(f.im0, xyxy, path)
                self.crops.add(path)
        if o.nosave and not self.view:
            return
        im = draw_detections(f.im0.copy(), det, self.names, o.line_thickness, o.hide_labels, o.hide_conf)
        if not o.nosave:
            self._save(f, im)
        if self.view:
            self._show(f, im)

    def _save(self, f: Frame, im: np.ndarray) -> None:
        if f.kind == "image":
            path = self._claim(self.save_dir / f"{self._stem(f)}{Path(f.path).suffix}", (f.path,))
            data = encode_image(im, path.suffix)
            if data is None:  # a format OpenCV reads but cannot write: JPEG
                path = self._claim(path.with_suffix(".jpg"), (f.path,))
                data = encode_image(im, ".jpg")
            write_file(path, data)
            return
        if f.path not in self.writers:
            self.writers[f.path] = VideoFile(self._claim(self.save_dir / f"{self._stem(f)}.mp4", (f.path,)), f.fps,
                                             im.shape)
        self.writers[f.path].write(im)

    def _show(self, f: Frame, im: np.ndarray) -> None:
        try:
            cv2.imshow(f.stem, im)
            cv2.waitKey(1)
        except cv2.error:
            LOGGER.info("--view-img: this OpenCV build cannot open windows (headless); results are saved only")
            self.view = False

    def close(self) -> list[str]:
        """Finish every video (a stop signal meanwhile waits for it); what could not be written, one line each."""
        with stops_deferred():
            failed = [line for video in self.writers.values() if (line := video.close())]
            self.writers.clear()
        if self.view:
            cv2.destroyAllWindows()
        return failed


class VideoFile:
    """An annotated video, written to a hidden temp file beside its name and renamed into place once closed and
    read back: a run that stops (Ctrl-C, SIGTERM, a stalled stream) leaves a playable .mp4, and one that a full
    disk cut short leaves none, and says so (OpenCV's writer reports no failed write)."""

    def __init__(self, path: Path, fps: float, shape: tuple[int, ...]) -> None:
        self.path, self.frames = path, 0
        h, w = shape[:2]
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
            os.close(fd)
        except OSError as e:
            raise UserError(f"could not write {path}: {e.strerror or e}; {WRITE_FIX}") from None
        self.tmp = Path(tmp)
        self.writer = cv2.VideoWriter(tmp, cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
        if not self.writer.isOpened():
            self.tmp.unlink(missing_ok=True)
            raise UserError(f"could not write {path}: OpenCV opened no mp4v writer for {w}x{h} at {fps:g} fps; "
                            f"{WRITE_FIX}")

    def write(self, im: np.ndarray) -> None:
        self.writer.write(im)
        self.frames += 1

    def close(self) -> str | None:
        """Release, check and rename into place; None when done, else the line saying why the video is not there."""
        self.writer.release()
        try:
            if self.frames and video_frame_count(self.tmp) < 1:
                return f"could not write {self.path}: the file does not read back, most likely the disk is full; " \
                       f"{WRITE_FIX}"
            os.chmod(self.tmp, 0o644)  # mkstemp made it 0600
            os.replace(self.tmp, self.path)
        except OSError as e:
            return f"could not write {self.path}: {e.strerror or e}; {WRITE_FIX}"
        finally:
            with contextlib.suppress(OSError):
                self.tmp.unlink(missing_ok=True)  # gone when renamed
        return None


def video_frame_count(path: Path) -> int:
    """Frames a video file's header names; 0 when it does not open (no index: its writer was cut short)."""
    cap = cv2.VideoCapture(str(path))
    try:
        return int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0) if cap.isOpened() else 0
    finally:
        cap.release()


# flags of YOLOv5's detect.py this one does not take, with what to do instead
YOLOV5_ONLY = {"--dnn": "ONNX files run through ONNX Runtime (python export.py, then --weights best.onnx)",
               "--visualize": "feature-map dumps are not implemented", "--update": "checkpoints hold no pickled code "
               "to strip", "--save-csv": "use --save-txt --save-conf (YOLO-format rows with confidences)",
               "--data": "class names come from the weights file"}


def parse_opt(argv: Sequence[str] | None = None) -> DetectOptions:
    opts = parse_options(DetectOptions, argv, "Detect objects in pictures, videos and streams.", YOLOV5_ONLY)
    return replace(opts, imgsz=_single(opts.imgsz), weights=_single(opts.weights))


def _single(value: Any) -> Any:
    """A one-item list from a nargs='+' option as that item (--weights a.pt is one file, not an ensemble of one)."""
    value = list(value) if isinstance(value, (list, tuple)) else value
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def main(argv: Sequence[str] | None = None) -> Path:
    return detect(parse_opt(argv)).save_dir


if __name__ == "__main__":
    run_cli(main)
