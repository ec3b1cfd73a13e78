"""Image files: the formats we read, decoding to upright BGR uint8 (16-bit, alpha, EXIF orientation,
pixel limits, truncated JPEGs), and .txt lists of media paths.

Shared by training data (utils/data/datasets.py) and detection sources (utils/data/sources.py).
"""
from __future__ import annotations

import os
import struct
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

import cv2
import numpy as np

from utils.data.imageheader import image_size
from utils.files import read_path_list
from utils.limits import MAX_PIXELS_ENV, max_image_pixels

IMG_FORMATS = ("bmp", "jpeg", "jpg", "png", "tif", "tiff", "webp")
VID_FORMATS = ("asf", "avi", "gif", "m4v", "mkv", "mov", "mp4", "mpeg", "mpg", "ts", "wmv")
DECODE_THREADS = 8  # at most, and no more than the CPUs: decoders release the GIL

T, R = TypeVar("T"), TypeVar("R")


def decode_in_threads(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """[fn(x) for x in items], in threads, in order. Whatever ends it early (an error, a stop signal's
    KeyboardInterrupt) leaves only once no thread is still running: a thread that outlives the interpreter's
    shutdown (multiprocessing's ThreadPool has daemon threads) is ended inside the decoder by an unwinding that
    C++ code cannot pass, which aborts the process ('terminate called without an active exception')."""
    pool = ThreadPoolExecutor(min(DECODE_THREADS, os.cpu_count() or 1), thread_name_prefix="decode")
    try:
        return list(pool.map(fn, items))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # the tasks not started are dropped, the running ones finish


def read_media_list(txt: str | Path, what: str, formats: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """The paths of a .txt list (utils.files.read_path_list: one per line, relative to the list's folder)
    split into those with one of `formats`' extensions and the others. Training's image lists and
    detect.py's --source lists are read here, the same way."""
    suffixes = {"." + f.lower().lstrip(".") for f in formats}
    paths = read_path_list(txt, what)
    return [p for p in paths if p.suffix.lower() in suffixes], [p for p in paths if p.suffix.lower() not in suffixes]


def load_image_file(path: str | Path, verify: bool = False) -> np.ndarray:
    """Decode any supported image to BGR uint8 HxWx3, upright per its EXIF orientation.

    The size is read from the header first (utils/data/imageheader.py): an image over max_image_pixels()
    (utils/limits.py; AMPYOLO_MAX_PIXELS) is refused before a decoder allocates anything. IMREAD_UNCHANGED
    keeps 16-bit and alpha so they are converted on purpose, but it ignores EXIF orientation, which is then
    applied here. verify=True (dataset verification) also refuses a JPEG that the decoder had to fill in
    because its data ends early. Every failure, whatever the decoder raised, is ValueError with the reason.
    """
    try:
        buf = np.fromfile(str(path), dtype=np.uint8)
    except OSError as e:
        raise ValueError(f"cannot read file ({e.strerror})") from None
    except MemoryError:
        raise ValueError("file too large to read into memory") from None
    if buf.size == 0:
        raise ValueError("zero-byte file")
    try:
        w, h = image_size(memoryview(buf))
    except ValueError as e:
        raise ValueError(f"not a decodable image ({e})") from None
    limit = max_image_pixels()
    if w * h > limit:
        raise ValueError(f"{w}x{h} pixels is over the {limit:,}-pixel limit (a decompression bomb?); "
                         f"if the image is real, raise the limit with {MAX_PIXELS_ENV}")
    try:
        im = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
        if im is None:
            raise ValueError("not a decodable image (corrupt or unsupported format)")
        if verify and buf[:2].tobytes() == b"\xff\xd8" and jpeg_filled_in(buf, im):
            raise ValueError("truncated JPEG (its data ends early; the decoder fills the rest with grey)")
        im = to_bgr8(im)
        return _apply_orientation(im, exif_orientation(memoryview(buf)))
    except (cv2.error, MemoryError) as e:
        raise ValueError(f"cannot decode it ({' '.join(str(e).split())[:120] or type(e).__name__})") from None


_STDERR_LOCK = threading.Lock()  # one capture of the process's stderr at a time


def jpeg_filled_in(buf: np.ndarray, im: np.ndarray) -> bool:
    """True for a JPEG whose entropy-coded data ends before the last block, e.g. a file cut short and
    given an end marker again. libjpeg then warns "Corrupt JPEG data: premature end of data segment" on
    stderr (OpenCV offers no other way to see it) and fills every remaining block with flat grey 128.
    The grey bottom-right corner is checked first (cheap); only for such images is the file decoded once
    more with stderr captured, to tell a cut file from a picture that is really grey there."""
    corner = im[-8:, -8:]
    if not (corner == 128).all():
        return False
    with _STDERR_LOCK, tempfile.TemporaryFile() as err:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(err.fileno(), 2)
            cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    return "premature end" in text or "Corrupt JPEG data" in text


def to_bgr8(im: np.ndarray) -> np.ndarray:
    """Greyscale/BGRA/16-bit/float -> 3-channel 8-bit BGR."""
    if im.dtype == np.uint16:
        im = (im >> 8).astype(np.uint8)  # keep the high byte: exact for 8-bit data stored as 16-bit
    elif im.dtype in (np.float32, np.float64):
        im = (np.clip(im, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    elif im.dtype != np.uint8:
        raise ValueError(f"unsupported pixel type {im.dtype}")
    if im.ndim == 2 or im.shape[2] == 1:
        return cv2.cvtColor(im, cv2.COLOR_GRAY2BGR)
    if im.shape[2] == 4:
        return cv2.cvtColor(im, cv2.COLOR_BGRA2BGR)
    if im.shape[2] != 3:
        raise ValueError(f"unsupported channel count {im.shape[2]}")
    return im


def bgr_to_chw_rgb(im: np.ndarray) -> np.ndarray:
    """BGR HxWx3 -> a new contiguous RGB 3xHxW array (the layout of a training tensor).

    cv2.split into the three planes of the output, in reverse order: 0.09 ms at 640x640, where numpy's
    transposing copy of the reversed view takes 0.4 ms.
    """
    chw = np.empty((3, *im.shape[:2]), im.dtype)
    cv2.split(im, mv=[chw[2], chw[1], chw[0]])
    return chw


def _apply_orientation(im: np.ndarray, orientation: int) -> np.ndarray:
    """Turn a stored image upright for EXIF orientation 1..8 (2,4,5,7 include a mirror)."""
    if orientation == 2:
        return cv2.flip(im, 1)
    if orientation == 3:
        return cv2.rotate(im, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(im, 0)
    if orientation == 5:
        return cv2.transpose(im)
    if orientation == 6:
        return cv2.rotate(im, cv2.ROTATE_90_CLOCKWISE)
    if orientation == 7:
        return cv2.rotate(cv2.transpose(im), cv2.ROTATE_180)
    if orientation == 8:
        return cv2.rotate(im, cv2.ROTATE_90_COUNTERCLOCKWISE)
    return im


def exif_orientation(buf: memoryview | bytes) -> int:
    """EXIF orientation (1..8, 1 when absent) of JPEG, PNG (eXIf), WebP (EXIF) or TIFF bytes."""
    b = memoryview(buf)
    try:
        if b[:2] == b"\xff\xd8":
            return _orientation_jpeg(b)
        if b[:8] == b"\x89PNG\r\n\x1a\n":
            return _orientation_chunks(b, 8, ">I", b"eXIf", 12)
        if b[:4] == b"RIFF" and b[8:12] == b"WEBP":
            return _orientation_chunks(b, 12, "<I", b"EXIF", 8)
        if b[:4] in (b"II*\x00", b"MM\x00*"):
            return _orientation_tiff(b)
    except (struct.error, IndexError, ValueError):
        pass  # malformed metadata: show the pixels as stored
    return 1


def _orientation_jpeg(b: memoryview) -> int:
    i = 2
    while i + 4 <= len(b) and b[i] == 0xFF:
        marker = b[i + 1]
        if marker == 0xDA:  # start of scan: metadata segments are all before it
            break
        if marker in (0x01, 0xFF) or 0xD0 <= marker <= 0xD8:  # markers without a length field
            i += 2 if marker != 0xFF else 1
            continue
        (length,) = struct.unpack(">H", b[i + 2 : i + 4])
        seg = b[i + 4 : i + 2 + length]
        if marker == 0xE1 and seg[:6] == b"Exif\x00\x00":
            return _orientation_tiff(seg[6:])
        i += 2 + length
    return 1


def _orientation_chunks(b: memoryview, start: int, size_fmt: str, tag: bytes, head: int) -> int:
    """PNG (length, type, data, crc) and WebP/RIFF (type, length, data, pad) tagged chunks."""
    i = start
    while i + 8 <= len(b):
        if size_fmt == ">I":
            (n,), typ = struct.unpack(">I", b[i : i + 4]), b[i + 4 : i + 8]
        else:
            typ, (n,) = b[i : i + 4], struct.unpack("<I", b[i + 4 : i + 8])
        if typ == tag:
            data = b[i + 8 : i + 8 + n]
            return _orientation_tiff(data[6:] if data[:6] == b"Exif\x00\x00" else data)
        i += head + n + (n & 1 if size_fmt == "<I" else 0)
    return 1


def _orientation_tiff(t: memoryview) -> int:
    """Orientation tag (0x0112) in IFD0 of a TIFF structure."""
    order = "<" if t[:2] == b"II" else ">"
    (ifd,) = struct.unpack(order + "I", t[4:8])
    (count,) = struct.unpack(order + "H", t[ifd : ifd + 2])
    for k in range(count):
        e = ifd + 2 + 12 * k
        tag, typ = struct.unpack(order + "HH", t[e : e + 4])
        if tag == 0x0112 and typ == 3:
            (value,) = struct.unpack(order + "H", t[e + 8 : e + 10])
            return value if 1 <= value <= 8 else 1
    return 1
