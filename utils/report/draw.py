"""Detections drawn on images with OpenCV only: boxes, label tabs, class colours and crops.

Nothing here imports matplotlib, so detection (detect.py) neither needs it nor changes a notebook's
plotting backend. Text uses OpenCV's built-in Hershey fonts: nothing downloads.
"""
from __future__ import annotations

import colorsys
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np

from utils.errors import UserError
from utils.files import atomic_write

FONT = cv2.FONT_HERSHEY_SIMPLEX
WRITE_FIX = "free disk space or choose another --project"


class Colors:
    """A fixed palette: class i always gets the same colour, in every run and on every machine.

    Hues are spread by the golden ratio so neighbouring class indices get clearly different colours;
    saturation and value alternate so the palette holds more than a dozen distinguishable entries.
    """

    def __init__(self, n: int = 24) -> None:
        golden = 0.618033988749895
        rgb = []
        for i in range(n):
            h = (0.03 + i * golden) % 1.0
            s = 0.85 if i % 2 == 0 else 0.6
            v = 0.95 if (i // 2) % 2 == 0 else 0.75
            rgb.append(tuple(int(round(c * 255)) for c in colorsys.hsv_to_rgb(h, s, v)))
        self.palette: list[tuple[int, int, int]] = rgb

    def __len__(self) -> int:
        return len(self.palette)

    def __call__(self, i: int, bgr: bool = False) -> tuple[int, int, int]:
        r, g, b = self.palette[int(i) % len(self.palette)]
        return (b, g, r) if bgr else (r, g, b)


colors = Colors()


def default_line_width(shape: Sequence[int]) -> int:
    """Line width that stays visible on large pictures and thin on small ones (~0.3% of the size)."""
    return max(round(sum(shape[:2]) / 2 * 0.003), 2)


def detection_label(name: str, conf: float, hide_labels: bool = False, hide_conf: bool = False) -> str:
    """The text shown on a box: 'name 0.87', 'name', or '' (nothing drawn)."""
    if hide_labels:
        return ""
    return name if hide_conf else f"{name} {conf:.2f}"


class Annotator:
    """Draws boxes and labels onto a BGR uint8 image in place (OpenCV only)."""

    def __init__(self, im: np.ndarray, line_width: int | None = None) -> None:
        if not (isinstance(im, np.ndarray) and im.dtype == np.uint8 and im.ndim == 3):
            raise ValueError("Annotator needs a BGR uint8 HxWx3 image; convert tensors with .numpy() first")
        # OpenCV draws only into contiguous arrays; a sliced/transposed view would be silently copied
        self.im = im if im.flags.c_contiguous else np.ascontiguousarray(im)
        self.lw = int(line_width or default_line_width(im.shape))

    def box(self, xyxy: Sequence[float], color: tuple[int, int, int]) -> None:
        """Outline `xyxy` with a band exactly `lw` pixels wide centred on the box edges.

        Drawn as four filled rectangles rather than one thick cv2.rectangle so the touched pixels are
        exactly predictable (thick OpenCV lines get rounded corners).
        """
        h, w = self.im.shape[:2]
        x1, y1, x2, y2 = (int(round(float(v))) for v in xyxy[:4])
        a = (self.lw - 1) // 2  # pixels outside the edge
        b = self.lw - 1 - a  # pixels inside the edge
        ox1, oy1, ox2, oy2 = x1 - a, y1 - a, x2 + a, y2 + a  # outer rectangle, inclusive
        ix1, iy1, ix2, iy2 = x1 + b, y1 + b, x2 - b, y2 - b  # inner rectangle, inclusive
        bands = ((ox1, oy1, ox2, iy1), (ox1, iy2, ox2, oy2), (ox1, oy1, ix1, oy2), (ix2, oy1, ox2, oy2))
        for bx1, by1, bx2, by2 in bands:
            bx1, bx2 = max(bx1, 0), min(bx2, w - 1)
            by1, by2 = max(by1, 0), min(by2, h - 1)
            if bx1 <= bx2 and by1 <= by2:
                cv2.rectangle(self.im, (bx1, by1), (bx2, by2), color, thickness=-1, lineType=cv2.LINE_8)

    def label(self, xyxy: Sequence[float], text: str, color: tuple[int, int, int]) -> None:
        """Write `text` on a filled tab above the box's top-left corner (below it if no room above)."""
        if not text:
            return
        h, w = self.im.shape[:2]
        scale = self.lw / 3
        thick = max(self.lw - 1, 1)
        (tw, th), base = cv2.getTextSize(text, FONT, scale, thick)
        if tw + 2 > w:  # shrink the font rather than cut the label off on small pictures
            scale *= (w - 2) / (tw + 2)
            thick = max(min(thick, round(scale * 2)), 1)
            (tw, th), base = cv2.getTextSize(text, FONT, scale, thick)
        x1, y1 = int(round(float(xyxy[0]))), int(round(float(xyxy[1])))
        tab_h = th + base + 2
        above = y1 - tab_h - self.lw // 2 >= 0
        top = y1 - tab_h - self.lw // 2 if above else y1 + self.lw // 2 + 1
        x1 = min(max(x1 - (self.lw - 1) // 2, 0), max(w - tw - 2, 0))
        cv2.rectangle(self.im, (x1, top), (x1 + tw + 2, min(top + tab_h, h - 1)), color, -1, cv2.LINE_8)
        cv2.putText(self.im, text, (x1 + 1, top + th + 1), FONT, scale, _text_color(color), thick, cv2.LINE_AA)

    def box_label(self, xyxy: Sequence[float], text: str = "", color: tuple[int, int, int] = (128, 128, 128)) -> None:
        self.box(xyxy, color)
        self.label(xyxy, text, color)

    def result(self) -> np.ndarray:
        return self.im


def _text_color(bg: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black on light tabs, white on dark ones (perceived luminance, BGR order)."""
    b, g, r = bg
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 150 else (255, 255, 255)


def draw_boxes(
    im: np.ndarray,
    boxes: Sequence[Sequence[float]],
    labels: Sequence[str],
    box_colors: Sequence[tuple[int, int, int]],
    line_width: int | None = None,
) -> np.ndarray:
    """Draw each box with its label text and BGR colour; returns the annotated image."""
    ann = Annotator(im, line_width)
    for xyxy, text, color in zip(boxes, labels, box_colors):
        ann.box_label(xyxy, text, color)
    return ann.result()


def draw_detections(
    im: np.ndarray,
    det: np.ndarray,
    names: Sequence[str] | dict[int, str],
    line_width: int | None = None,
    hide_labels: bool = False,
    hide_conf: bool = False,
) -> np.ndarray:
    """Draw NMS output rows (x1, y1, x2, y2, conf, cls) with 'name conf' labels and class colours."""
    det = np.asarray(det, dtype=np.float64).reshape(-1, 6)
    labels, box_colors = [], []
    for *_, conf, c in det:
        labels.append(detection_label(class_name(names, int(c)), float(conf), hide_labels, hide_conf))
        box_colors.append(colors(int(c), bgr=True))
    return draw_boxes(im, det[:, :4], labels, box_colors, line_width)


def class_name(names: Sequence[str] | dict[int, str], c: int) -> str:
    """names[c], or the index as text when a checkpoint has fewer names than predicted classes."""
    try:
        return str(names[c])
    except (IndexError, KeyError):
        return str(c)


def crop_box(im: np.ndarray, xyxy: Sequence[float], gain: float = 1.02, pad: int = 10) -> np.ndarray:
    """The box region of `im`, enlarged by `gain` and `pad` pixels and clipped to the image, as a copy (later
    drawing on `im` does not show in it)."""
    x1, y1, x2, y2 = (float(v) for v in xyxy[:4])
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    bw, bh = (x2 - x1) * gain + pad, (y2 - y1) * gain + pad
    h, w = im.shape[:2]
    left, right = int(max(cx - bw / 2, 0)), int(min(cx + bw / 2, w))
    top, bottom = int(max(cy - bh / 2, 0)), int(min(cy + bh / 2, h))
    return np.ascontiguousarray(im[top:max(bottom, top + 1), left:max(right, left + 1)])


def save_crop(im: np.ndarray, xyxy: Sequence[float], path: str | Path, gain: float = 1.02, pad: int = 10) -> Path:
    """Save crop_box's region of `im` as a file (write_image); returns the written path."""
    return write_image(crop_box(im, xyxy, gain, pad), path)


def encode_image(im: np.ndarray, suffix: str) -> bytes | None:
    """`im` as the bytes of a `suffix` file; None where OpenCV has no writer for the format (it reads more than it
    writes). Encoding first, then writing (write_image), is what lets a full disk be told: cv2.imwrite only returns
    False, for that and for an unknown format alike."""
    try:
        ok, buf = cv2.imencode(suffix, im)
    except cv2.error:
        return None
    return buf.tobytes() if ok else None


def write_image(im: np.ndarray, path: str | Path) -> Path:
    """`im` as `path`, or as its .jpg where OpenCV cannot write that format; the path written. Whole or not at all
    (utils.files.atomic_write): a full disk or a read-only folder is one UserError line and leaves no partial file."""
    path = Path(path)
    data = encode_image(im, path.suffix)
    if data is None:
        path, data = path.with_suffix(".jpg"), encode_image(im, ".jpg")
    write_file(path, data)
    return path


def write_file(path: Path, data: bytes) -> None:
    """`data` as `path` (its folder made), whole or not at all: one output file of a run among many, so not
    fsynced (utils.files.atomic_write, durable=False)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create folder {path.parent}: {e.strerror or e}; {WRITE_FIX}") from None
    atomic_write(path, lambda f: f.write(data), fix=WRITE_FIX, durable=False)
