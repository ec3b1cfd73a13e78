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
import queue
import threading
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
STREAM_TIMEOUT = 30.0  # s without a frame before a stream is taken as ended (OpenCV's own read timeout)
MAX_STREAM_TIMEOUT = 86_400.0  # a day: beyond it a wait is no longer a timeout
READ_TIMEOUT_MARGIN = 30.0  # s OpenCV's read waits past STREAM_TIMEOUT (see open_stream)
STREAM_QUEUE = 4  # frames read ahead of the detector
STOP_WAIT = 1.0  # s a stop waits for the reading thread


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

    def __init__(self, source: str | Path, vid_stride: int = 1, stream_timeout: float = STREAM_TIMEOUT) -> None:
        self.source = str(source)
        if vid_stride < 1:
            raise UserError(f"--vid-stride {vid_stride} must be 1 or more")
        self.vid_stride = vid_stride
        self.stream_timeout = stream_timeout
        self.stream = is_stream(self.source)
        self.files: list[Path] = []
        self._cap = None
        self._reader: StreamReader | None = None
        if self.stream:
            self._cap = open_stream(self.source, stream_timeout)
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
        fps = _fps(self._cap) / self.vid_stride
        self._reader = StreamReader(self._cap, self.vid_stride)  # the reader's thread owns the capture from here
        n = 0
        try:
            while (im := self._reader.next(self.stream_timeout)) is not None:
                yield Frame(self.source, im, "stream", frame=n, fps=fps, position=f"stream {self.source} (frame {n})")
                n += 1
            if self._reader.stalled:
                LOGGER.warning(f"warning: no frame from {self.source} for {self.stream_timeout:g} s after {n} frames; "
                               f"taken as the end of the stream (--stream-timeout sets the wait)")
            else:
                LOGGER.info(f"stream {self.source} ended after {n} frames")
        finally:
            self.close()

    def close(self) -> None:
        """Stop reading a stream (its thread ends within STOP_WAIT s unless OpenCV is stuck in a read)."""
        if self._reader is not None:
            self._reader.stop()


class StreamReader:
    """A stream's frames, read on a daemon thread into a small queue that the main thread waits on with a timeout.
    cap.read() blocks until the next frame, or a stalled stream's OpenCV timeout (about 30 s), and signal
    handlers only run in the main thread between Python steps: read there, a Ctrl-C or SIGTERM waited as long."""

    def __init__(self, cap: cv2.VideoCapture, vid_stride: int = 1) -> None:
        self.cap, self.vid_stride = cap, vid_stride
        self.queue: queue.Queue = queue.Queue(maxsize=STREAM_QUEUE)
        self.done = threading.Event()
        self.stalled = False
        self.thread = threading.Thread(target=self._read, name="stream-reader", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        """Every vid_stride-th frame into the queue; None after the last one."""
        try:
            ok = True
            while ok and not self.done.is_set():
                for _ in range(self.vid_stride - 1):  # grab without decoding: cheap skipping
                    self.cap.grab()
                ok, im = self.cap.read()
                self._put(im if ok else None)
        except cv2.error:
            self._put(None)
        finally:
            self.cap.release()

    def _put(self, item: np.ndarray | None) -> None:
        """Wait for room in the queue, but not past stop()."""
        while not self.done.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                pass

    def next(self, timeout: float) -> np.ndarray | None:
        """The next frame; None at the end of the stream, or after `timeout` s without a frame (`stalled`)."""
        try:
            return self.queue.get(timeout=timeout)  # a lock wait: signals interrupt it
        except queue.Empty:
            self.stalled = True
            return None

    def stop(self) -> None:
        """Ask the thread to end and give it STOP_WAIT s: one in a stalled read stays behind (a daemon, it does not
        hold the process), and OpenCV's read timeout, set past --stream-timeout, keeps it there until the end."""
        if not self.done.is_set():
            self.done.set()
            self.thread.join(STOP_WAIT)


def open_stream(source: str, read_timeout: float = STREAM_TIMEOUT) -> cv2.VideoCapture:
    """Open a webcam index or a URL; UserError (one line) when it does not open. A URL's reads give up after
    read_timeout plus a margin: StreamReader's wait says the stall first, and its thread is not left in a read
    that could return while the interpreter shuts down."""
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
            cap = cv2.VideoCapture(source, cv2.CAP_ANY, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, STREAM_OPEN_TIMEOUT_MS,
                                                         cv2.CAP_PROP_READ_TIMEOUT_MSEC,
                                                         int((read_timeout + READ_TIMEOUT_MARGIN) * 1000)])
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
