"""What detect.py reads: pictures, videos, webcams and streams, as one sequence of frames.

`MediaSource(source)` accepts an image, a folder, a glob, a .txt list of paths, a video file, a
webcam index ("0") or an rtsp/rtmp/http(s) URL. Problems the user must fix (nothing there, nothing
readable, a stream that does not open) raise UserError when the source is opened, before any output
folder is made; a single unreadable file among many is skipped with a warning.
"""
from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import cv2
import numpy as np

from utils.data.images import IMG_FORMATS, VID_FORMATS, load_image_file, read_media_list
from utils.errors import UserError
from utils.files import special_file_kind

LOGGER = logging.getLogger(__name__)

STREAM_PREFIXES = ("rtsp://", "rtmp://", "http://", "https://")
STREAM_OPEN_TIMEOUT_MS = 10_000  # an unreachable URL fails within this instead of hanging


def _suffixes(formats: Iterable[str]) -> set[str]:
    return {("." + f.lower().lstrip(".")) for f in formats}


IMG_SUFFIXES = _suffixes(IMG_FORMATS)
VID_SUFFIXES = _suffixes(VID_FORMATS) | {".webm"}  # detect also reads WebM; training data never is video


@dataclass
class Frame:
    """One picture to run the detector on, with where it came from."""

    path: str  # the file, or the stream address
    im0: np.ndarray  # original BGR uint8 image
    kind: str  # 'image' | 'video' | 'stream'
    frame: int = 0  # frame number within a video or stream (0-based)
    frames: int = 0  # frames in the video (0 when unknown, e.g. streams)
    fps: float = 30.0  # frames per second of the output video (video/stream only)
    position: str = ""  # 'image 2/5', 'video 1/1 (frame 3/90)' for the log line

    @property
    def stem(self) -> str:
        """Base name for outputs: the file stem, or a sanitised stream name."""
        if self.kind == "stream":
            return "".join(c if c.isalnum() else "_" for c in self.path.split("://")[-1]).strip("_") or "stream"
        return Path(self.path).stem


def is_stream(source: str) -> bool:
    return source.isdigit() or source.lower().startswith(STREAM_PREFIXES)


class MediaSource:
    """Iterate over the frames of `source`; `len()` is the number of files (1 for a stream)."""

    def __init__(self, source: str | Path, vid_stride: int = 1) -> None:
        self.source = str(source)
        if vid_stride < 1:
            raise UserError(f"--vid-stride {vid_stride} must be 1 or more")
        self.vid_stride = vid_stride
        self.stream = is_stream(self.source)
        self.files: list[Path] = []
        self._cap = None
        if self.stream:
            self._cap = open_stream(self.source)
        else:
            self.files = media_files(self.source)

    def __len__(self) -> int:
        return 1 if self.stream else len(self.files)

    def __iter__(self) -> Iterator[Frame]:
        if self.stream:
            yield from self._stream_frames()
            return
        n = len(self.files)
        for i, path in enumerate(self.files, 1):
            if path.suffix.lower() in VID_SUFFIXES:
                yield from video_frames(path, f"video {i}/{n}", self.vid_stride)
                continue
            try:
                im = load_image_file(path)
            except (ValueError, OSError) as e:
                LOGGER.warning(f"WARNING skipping {path}: cannot read it as an image ({e})")
                continue
            yield Frame(str(path), im, "image", position=f"image {i}/{n}")

    def _stream_frames(self) -> Iterator[Frame]:
        cap = self._cap
        fps = _fps(cap) / self.vid_stride
        n = 0
        try:
            while True:
                for _ in range(self.vid_stride - 1):  # grab without decoding: cheap skipping
                    cap.grab()
                ok, im = cap.read()
                if not ok:
                    LOGGER.info(f"stream {self.source} ended after {n} frames")
                    return
                yield Frame(self.source, im, "stream", frame=n, fps=fps, position=f"stream {self.source} (frame {n})")
                n += 1
        finally:
            cap.release()


def open_stream(source: str) -> cv2.VideoCapture:
    """Open a webcam index or a URL; UserError (one line) when it does not deliver a first frame."""
    # OpenCV and FFmpeg print their own multi-line connection errors; ours says the same in one line.
    # FFmpeg reads its level once, at its first use in the process; a user's own setting wins.
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    level = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    try:
        if source.isdigit():
            cap = cv2.VideoCapture(int(source))
            hint = "check the camera index and that a camera is attached"
        else:
            cap = cv2.VideoCapture(source, cv2.CAP_ANY, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, STREAM_OPEN_TIMEOUT_MS])
            hint = "check the URL and that the network reaches it"
    finally:
        cv2.utils.logging.setLogLevel(level)
    if not cap.isOpened():
        cap.release()
        raise UserError(f"--source {source}: cannot open the stream; {hint}")
    return cap


def media_files(source: str) -> list[Path]:
    """The image and video files a source names, sorted; UserError when there are none."""
    p = Path(source).expanduser()
    if any(c in source for c in "*?["):
        paths = [Path(f) for f in sorted(glob.glob(str(p), recursive=True)) if Path(f).is_file()]
    elif os.path.isdir(p):  # os.path answers False, where Path raises, for a name too long or with a NUL
        paths = sorted(f for f in p.iterdir() if f.is_file())
    elif os.path.isfile(p) and p.suffix.lower() == ".txt":
        paths = _listed_files(p)
    elif os.path.isfile(p):
        paths = [p]
    else:
        kind = special_file_kind(p)
        raise UserError(f"--source {source} " + (f"is {kind}, not an image, video, folder or list" if kind
                                                   else "does not exist") +
                        "; pass an image, video, folder, glob, .txt list of paths, webcam index or stream URL")
    media = [f for f in paths if f.suffix.lower() in IMG_SUFFIXES | VID_SUFFIXES]
    others = [f for f in paths if f not in set(media)]
    if not media:
        raise UserError(f"--source {source} holds no images or videos; supported: "
                        f"{' '.join(sorted(s[1:] for s in IMG_SUFFIXES | VID_SUFFIXES))}")
    if others:
        LOGGER.warning(f"WARNING skipping {len(others)} file(s) in {source} that are not images or videos "
                       f"(e.g. {others[0].name})")
    return media


def _listed_files(txt: Path) -> list[Path]:
    """Paths listed one per line in a .txt file (utils.data.images.read_media_list, shared with training's
    lists); relative ones are relative to the file's folder."""
    media, others = read_media_list(txt, "--source list", IMG_FORMATS + VID_FORMATS + ("webm",))
    paths, missing = [], []
    for f in media + others:  # the caller tells media from other files, and warns about the others
        (paths if os.path.isfile(f) else missing).append(f)  # os.path: False, not an error, for a bad name
    if missing:
        LOGGER.warning(f"WARNING {txt}: {len(missing)} listed file(s) not found, skipped (e.g. {missing[0]})")
    return paths


def _fps(cap: cv2.VideoCapture) -> float:
    fps = cap.get(cv2.CAP_PROP_FPS)
    return fps if np.isfinite(fps) and 0 < fps < 1000 else 30.0  # 0/NaN from some containers and webcams


def video_frames(path: Path, position: str, vid_stride: int = 1) -> Iterator[Frame]:
    """Every vid_stride-th frame of a video file; an unreadable or empty video gives a warning, no frames."""
    # FFmpeg's own complaint ("moov atom not found") would go to stderr beside our warning; a user's setting stands
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET, read when OpenCV first opens a video
    cap = cv2.VideoCapture(str(path))
    try:
        if not cap.isOpened():
            LOGGER.warning(f"WARNING skipping {path}: cannot open it as a video")
            return
        total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        fps = _fps(cap) / vid_stride
        n, kept = 0, 0
        while True:
            if n % vid_stride:
                ok = cap.grab()  # skipped frames are not decoded
            else:
                ok, im = cap.read()
                if ok:
                    kept += 1
                    yield Frame(str(path), im, "video", frame=n, frames=total, fps=fps,
                                position=f"{position} (frame {n + 1}/{total or '?'})")
            if not ok:
                break
            n += 1
        if kept == 0:
            LOGGER.warning(f"WARNING {path}: the video has no readable frames; nothing written for it")
    finally:
        cap.release()


def batched(frames: Iterable[Frame], n: int) -> Iterator[list[Frame]]:
    """Group consecutive frames into lists of up to n."""
    batch: list[Frame] = []
    for f in frames:
        batch.append(f)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch
