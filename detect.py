"""Run a trained detector over pictures, videos and streams and save the annotated results.

    python detect.py --weights runs/train/exp/weights/best.pt --source images/
    python detect.py --weights best.pt --source video.mp4 --save-txt --save-conf
    python detect.py --weights best.pt                  # sample pictures of the built-in dataset

Results go to runs/detect/exp{N}/: annotated pictures and videos, labels/*.txt (YOLO format, with
--save-txt) and crops/<class>/ (with --save-crop). Precision follows utils.amp.inference_dtype: FP16 on
CUDA GPUs that handle it, FP32 otherwise; a CPU runs FP16 only when --half asks (emulated, slow).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np
import torch

from utils.augment import letterbox
from utils.backends import Backend, fixed_imgsz, load_backend
from utils.boxes import non_max_suppression, scale_boxes, xyxy2xywhn
from utils.device import select_device
from utils.errors import UserError, run_cli
from utils.files import cache_dir, increment_path
from utils.plots import class_name, draw_detections, save_crop
from utils.sources import Frame, MediaSource, batched

LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class DetectOptions:
    """Everything a detection run is configured by; the CLI's defaults come from here."""

    weights: str = "best.pt"
    source: str | None = None  # None: sample pictures of the built-in dataset
    imgsz: int | Sequence[int] = 640  # one size, or (h, w)
    conf_thres: float = 0.25
    iou_thres: float = 0.45
    max_det: int = 1000
    device: str = ""
    half: bool | None = None  # None: FP16 where the GPU handles it (utils.amp.inference_dtype)
    classes: Sequence[int] | None = None
    agnostic_nms: bool = False
    augment: bool = False
    save_txt: bool = False
    save_conf: bool = False
    save_crop: bool = False
    nosave: bool = False
    view_img: bool = False
    line_thickness: int = 3
    hide_labels: bool = False
    hide_conf: bool = False
    vid_stride: int = 1
    project: str = "runs/detect"
    name: str = "exp"
    exist_ok: bool = False
    batch_size: int = 1


@dataclass
class DetectResult:
    save_dir: Path
    seen: int = 0  # frames processed
    speed: dict[str, float] = field(default_factory=dict)  # ms per frame: 'pre-process', 'inference', 'NMS'
    shape: tuple[int, ...] = ()  # network input shape of the last batch


def run(weights: str | Path, source: str | Path | None = None, imgsz: int | Sequence[int] = 640, conf_thres: float = 0.25,
        iou_thres: float = 0.45, max_det: int = 1000, device: str = "", half: bool | None = None,
        classes: Sequence[int] | None = None, agnostic_nms: bool = False, augment: bool = False,
        save_txt: bool = False, save_conf: bool = False, save_crop: bool = False, nosave: bool = False,
        view_img: bool = False, line_thickness: int = 3, hide_labels: bool = False, hide_conf: bool = False,
        vid_stride: int = 1, project: str | Path = "runs/detect", name: str = "exp", exist_ok: bool = False,
        batch_size: int = 1) -> Path:
    """Detect objects in `source` with the checkpoint `weights`; returns the folder results were saved in."""
    opts = DetectOptions(**{k: v for k, v in locals().items()})
    return detect(opts).save_dir


class Timer:
    """Accumulates wall time of a stage; synchronises CUDA so GPU work is counted where it happens."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.total = 0.0

    def __enter__(self) -> Timer:
        self._sync()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        self.dt = time.perf_counter() - self.start
        self.total += self.dt

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def detect(opts: DetectOptions) -> DetectResult:
    """The run: open the source, load the model, then pre-process -> infer -> NMS -> save per batch."""
    check_options(opts)
    media = MediaSource(opts.source or sample_source(), opts.vid_stride)  # fails before any folder is made
    device = select_device(opts.device)
    model, names, stride, dtype = load_detector(opts.weights, device, opts.half)
    imgsz = check_imgsz(fixed_imgsz(model, opts.imgsz), stride)
    square = opts.batch_size > 1 and not media.stream  # one common shape lets frames share a batch
    save_dir = increment_path(opts.project, opts.name, exist_ok=opts.exist_ok)
    sink = ResultSink(save_dir, names, opts)
    timers = [Timer(device) for _ in range(3)]
    result = DetectResult(save_dir)
    if device.type == "cuda":  # first CUDA call pays for kernel selection; keep it out of the timings
        with torch.inference_mode():
            model(torch.zeros(1, 3, *imgsz, device=device, dtype=dtype))
    try:
        for frames in batched(media, 1 if media.stream else opts.batch_size):
            with timers[0]:
                x, geometry = preprocess(frames, imgsz, stride, square, device, dtype)
            with timers[1], torch.inference_mode():
                pred = model(x, augment=opts.augment)[0]
            with timers[2]:
                dets = non_max_suppression(pred, opts.conf_thres, opts.iou_thres, opts.classes,
                                           opts.agnostic_nms, max_det=opts.max_det)
            for f, g, det in zip(frames, geometry, dets):
                det[:, :4] = scale_boxes(x.shape[2:], det[:, :4], f.im0.shape, ratio_pad=g)
                det = det.cpu().numpy()
                sink.add(f, det)
                LOGGER.info(f"{f.position} {f.path}: {x.shape[2]}x{x.shape[3]} {describe(det, names)}, "
                            f"{timers[1].dt * 1e3 / len(frames):.1f}ms")
            result.seen += len(frames)
            result.shape = tuple(x.shape)
    finally:
        sink.close()
    n = max(result.seen, 1)
    result.speed = {k: t.total * 1e3 / n for k, t in zip(("pre-process", "inference", "NMS"), timers)}
    summarize(result, sink)
    return result


def check_options(opts: DetectOptions) -> None:
    """Refuse impossible values before anything is loaded or written."""
    for flag, v in (("--conf-thres", opts.conf_thres), ("--iou-thres", opts.iou_thres)):
        if not 0.0 <= v <= 1.0:
            raise UserError(f"{flag} {v} must lie between 0 and 1")
    for flag, v in (("--batch-size", opts.batch_size), ("--max-det", opts.max_det), ("--vid-stride", opts.vid_stride)):
        if v < 1:
            raise UserError(f"{flag} {v} must be 1 or more")


def load_detector(weights: str | Path, device: torch.device,
                  half: bool | None) -> tuple[Backend, list[str], int, torch.dtype]:
    """(backend for a .pt, .onnx or .torchscript file (utils/backends.py), class names, max stride, input dtype)."""
    backend = load_backend(weights, device, half)
    return backend, backend.names, int(backend.stride.max()), backend.dtype


def check_imgsz(imgsz: int | Sequence[int], stride: int) -> tuple[int, int]:
    """(h, w) rounded up to multiples of the model's stride (the network halves the size that often)."""
    hw = [int(imgsz)] * 2 if isinstance(imgsz, (int, float)) else [int(s) for s in imgsz]
    if len(hw) == 1:
        hw *= 2
    if len(hw) != 2 or min(hw) < 1:
        raise UserError(f"--imgsz {imgsz}: give one size or height and width, e.g. --imgsz 640 or --imgsz 480 640")
    new = tuple(max(-(-s // stride) * stride, stride) for s in hw)
    if list(new) != hw:
        LOGGER.info(f"--imgsz {hw} is not a multiple of the model stride {stride}; using {list(new)}")
    return new


def preprocess(frames: list[Frame], imgsz: tuple[int, int], stride: int, square: bool,
               device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, list[tuple]]:
    """Letterbox each frame, stack as an RGB (B, 3, H, W) tensor in 0..1; per frame ((ry, rx), (padw, padh))."""
    ims, geometry = [], []
    for f in frames:
        im, (rx, ry), pad = letterbox(f.im0, imgsz, stride=stride, auto=not square)
        ims.append(im)
        geometry.append(((ry, rx), pad))
    x = np.ascontiguousarray(np.stack(ims)[..., ::-1].transpose(0, 3, 1, 2))  # BGR HWC -> RGB CHW
    # cast on the device: a uint8 transfer is 4x smaller than a float one
    return torch.from_numpy(x).to(device).to(dtype).div_(255), geometry


def plural(name: str, n: int) -> str:
    if n == 1:
        return name
    if name.endswith(("s", "x", "z", "ch", "sh")):
        return name + "es"
    if len(name) > 1 and name.endswith("y") and name[-2] not in "aeiou":
        return name[:-1] + "ies"
    return name + "s"


def describe(det: np.ndarray, names: Sequence[str]) -> str:
    """'2 circles, 1 square' (most frequent first), or '(no detections)'."""
    if len(det) == 0:
        return "(no detections)"
    classes, counts = np.unique(det[:, 5].astype(int), return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return ", ".join(f"{counts[i]} {plural(class_name(names, classes[i]), counts[i])}" for i in order)


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
    from utils.synthetic import sample_images  # only needed when no --source is given

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
        self.writers: dict[str, tuple[cv2.VideoWriter, Path]] = {}
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
            (save_dir / "labels").mkdir(parents=True, exist_ok=True)

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
            self._write_labels(path, det, f.im0.shape)
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

    def _write_labels(self, path: Path, det: np.ndarray, shape: tuple[int, ...]) -> None:
        """One row per detection: class cx cy w h (normalised to the original image) [conf]."""
        xywhn = xyxy2xywhn(det[:, :4], w=shape[1], h=shape[0]) if len(det) else np.zeros((0, 4))
        rows = []
        for (cx, cy, w, h), conf, c in zip(xywhn, det[:, 4], det[:, 5]):
            row = f"{int(c)} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}"
            rows.append(row + (f" {conf:.5f}" if self.opts.save_conf else ""))
        path.write_text("".join(r + "\n" for r in rows))  # an empty file means: looked, found nothing

    def _save(self, f: Frame, im: np.ndarray) -> None:
        if f.kind == "image":
            path = self._claim(self.save_dir / f"{self._stem(f)}{Path(f.path).suffix}", (f.path,))
            if not cv2.imwrite(str(path), im):
                # e.g. a format OpenCV reads but cannot write: fall back to JPEG
                cv2.imwrite(str(self._claim(path.with_suffix(".jpg"), (f.path,))), im)
            return
        key = f.path
        if key not in self.writers:
            path = self._claim(self.save_dir / f"{self._stem(f)}.mp4", (f.path,))
            h, w = im.shape[:2]
            self.writers[key] = (cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), f.fps, (w, h)), path)
        self.writers[key][0].write(im)

    def _show(self, f: Frame, im: np.ndarray) -> None:
        try:
            cv2.imshow(f.stem, im)
            cv2.waitKey(1)
        except cv2.error:
            LOGGER.info("--view-img: this OpenCV build cannot open windows (headless); results are saved only")
            self.view = False

    def close(self) -> None:
        for writer, _ in self.writers.values():
            writer.release()
        self.writers.clear()
        if self.view:
            cv2.destroyAllWindows()


def parse_opt(argv: Sequence[str] | None = None) -> DetectOptions:
    d = DetectOptions()
    p = argparse.ArgumentParser(description="Detect objects in pictures, videos and streams.")
    p.add_argument("--weights", default=d.weights,
                   help="checkpoint written by train.py, or a .onnx / .torchscript file from export.py")
    p.add_argument("--source", default=d.source, help="image, folder, glob, .txt list, video, webcam index or URL "
                                                      "(default: sample pictures of the built-in dataset)")
    p.add_argument("--imgsz", "--img", "--img-size", nargs="+", type=int, default=[d.imgsz], help="inference size (h w)")
    p.add_argument("--conf-thres", type=float, default=d.conf_thres, help="confidence threshold")
    p.add_argument("--iou-thres", type=float, default=d.iou_thres, help="NMS IoU threshold")
    p.add_argument("--max-det", type=int, default=d.max_det, help="maximum detections per image")
    p.add_argument("--device", default=d.device, help="cuda device, i.e. 0 or cpu")
    p.add_argument("--half", action=argparse.BooleanOptionalAction, default=d.half,
                   help="FP16 inference (default: on for CUDA GPUs with fast FP16; on a CPU only when asked, "
                        "emulated and slow; --no-half forces FP32)")
    p.add_argument("--classes", nargs="+", type=int, default=d.classes, help="keep only these class indices")
    p.add_argument("--vid-stride", type=int, default=d.vid_stride, help="use every n-th video frame")
    p.add_argument("--line-thickness", type=int, default=d.line_thickness, help="box line width (pixels)")
    p.add_argument("--project", default=d.project, help="results go to project/name")
    p.add_argument("--name", default=d.name, help="results go to project/name")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="images per batch (folders of images)")
    flags = {"--agnostic-nms": "class-agnostic NMS", "--augment": "test-time augmentation (flip and scale)",
             "--save-txt": "save labels/*.txt", "--save-conf": "add confidences to --save-txt labels",
             "--save-crop": "save crops of each box", "--nosave": "do not save images/videos",
             "--view-img": "show results in a window", "--hide-labels": "draw boxes without labels",
             "--hide-conf": "draw labels without confidences", "--exist-ok": "reuse project/name if it exists"}
    for flag, text in flags.items():
        p.add_argument(flag, action="store_true", help=text)
    args = p.parse_args(argv)
    args.imgsz = args.imgsz[0] if len(args.imgsz) == 1 else args.imgsz
    return DetectOptions(**vars(args))


def main(argv: Sequence[str] | None = None) -> Path:
    return detect(parse_opt(argv)).save_dir


if __name__ == "__main__":
    run_cli(main)
