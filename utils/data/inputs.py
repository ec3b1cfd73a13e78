"""Pictures handed over from Python (the API, models/api.py), as named BGR uint8 arrays: what detect.py's frames
hold, so both run the same letterbox from there.

    pictures(["a.jpg", "folder/", cv2_image, pil_image, tensor])   # -> [("a.jpg", array), ...]

Accepted, alone or in a list (or tuple) of any mix:
  - a path (str or Path) to an image, a folder (its images), a glob or a .txt list of paths, read as detect.py
    reads them (utils/data/sources.py, EXIF orientation applied). Videos belong to detect.py. URLs are refused:
    nothing downloads here.
  - a NumPy array: HxWx3 (BGR, as OpenCV gives), HxWx4 (BGRA), HxW or HxWx1 (grey); uint8, or float in 0..1.
    `rgb=True` says colour arrays are in RGB order instead (matplotlib, PIL via np.asarray, imageio).
  - a PIL image (when Pillow is installed; it is never imported here unless the caller already has it).
  - a torch tensor: CHW or BCHW (B pictures) in RGB order, torchvision's convention (torchvision.io.read_image);
    uint8 in 0..255 or float in 0..1 (3 or 1 channels).
Float pictures are rounded to 8 bits, so a picture gives the same boxes whichever type carries it.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from utils.data.images import load_image_file, to_bgr8
from utils.data.sources import STREAM_PREFIXES, VID_SUFFIXES, media_files
from utils.errors import UserError

LOGGER = logging.getLogger(__name__)

URL_PREFIXES = STREAM_PREFIXES + ("ftp://", "s3://", "gs://")


def pictures(source: Any, rgb: bool = False) -> list[tuple[str, np.ndarray]]:
    """Every picture in `source` as (file name, BGR uint8 HxWx3 array); names are unique (a repeat gets _2, _3),
    and pictures that are not files are called image0.jpg, image1.jpg, ... by their position. One UserError
    line for anything that is not a picture or holds none."""
    items = list(_flatten(source, rgb))
    if not items:
        raise UserError("no pictures given: pass a path, a folder, an array, a PIL image, a tensor or a list of them")
    out, used = [], set()
    for i, (name, im) in enumerate(items):
        name = _unique(name or f"image{i}.jpg", used)
        out.append((name, im))
    return out


def _flatten(source: Any, rgb: bool) -> Iterable[tuple[str | None, np.ndarray]]:
    if isinstance(source, (list, tuple)):
        for s in source:
            yield from _flatten(s, rgb)
    elif isinstance(source, (str, Path)):
        yield from _files(str(source))
    elif isinstance(source, np.ndarray):
        yield None, _array(source, rgb)
    elif isinstance(source, torch.Tensor):
        yield from ((None, im) for im in _tensor(source))
    elif _is_pil(source):
        yield None, np.ascontiguousarray(np.asarray(source.convert("RGB"))[..., ::-1])  # PIL is RGB
    else:
        raise UserError(f"cannot detect on a {type(source).__name__}: pass a path, a folder, a NumPy array, a PIL "
                        f"image, a torch tensor or a list of them")


def _files(source: str) -> Iterable[tuple[str, np.ndarray]]:
    """The pictures a path names, read as detect.py reads them; unreadable ones among several are skipped with a
    warning, as detect.py does, and a lone unreadable one is refused."""
    if source.lower().startswith(URL_PREFIXES):
        raise UserError(f"{source} is a URL, and this detector downloads nothing: save the picture and pass its path")
    files = media_files(source)
    videos = [f for f in files if f.suffix.lower() in VID_SUFFIXES]
    if videos and len(videos) == len(files):
        raise UserError(f"{source} holds videos only ({videos[0].name}); the API takes pictures: run "
                        f"python detect.py --source {source} for videos")
    if videos:
        LOGGER.warning(f"WARNING skipping {len(videos)} video(s) in {source} (e.g. {videos[0].name}); detect.py reads videos")
    images = [f for f in files if f not in set(videos)]
    for f in images:
        try:
            yield f.name, load_image_file(f)
        except (ValueError, OSError) as e:
            if len(images) == 1:
                raise UserError(f"{f}: cannot read it as an image ({e}); pass another picture") from None
            LOGGER.warning(f"WARNING skipping {f}: cannot read it as an image ({e})")


def _array(im: np.ndarray, rgb: bool) -> np.ndarray:
    """A NumPy picture as BGR uint8 HxWx3 (utils.data.images.to_bgr8, what decoded files go through)."""
    shape = "an HxWx3 (or HxWx4, HxW grey) array"
    if im.ndim not in (2, 3) or (im.ndim == 3 and im.shape[2] not in (1, 3, 4)) or min(im.shape[:2]) < 1:
        raise UserError(f"a NumPy picture must be {shape}; got shape {im.shape}")
    if im.dtype != np.uint8 and not np.issubdtype(im.dtype, np.floating):
        raise UserError(f"a NumPy picture must be uint8 (0..255) or float (0..1); got {im.dtype}: convert it with "
                        f".astype(np.uint8)")
    if im.dtype != np.uint8:
        _check_unit_range(float(im.min()), float(im.max()), "NumPy")
        im = im.astype(np.float32)
    if rgb and im.ndim == 3 and im.shape[2] >= 3:
        im = im[..., [2, 1, 0, 3][: im.shape[2]]]  # RGB(A) -> BGR(A)
    return np.ascontiguousarray(to_bgr8(np.ascontiguousarray(im)))


def _tensor(x: torch.Tensor) -> list[np.ndarray]:
    """A CHW or BCHW RGB tensor (uint8 0..255 or float 0..1) as BGR uint8 HxWx3 arrays, one per picture."""
    if x.ndim not in (3, 4) or x.shape[-3] not in (1, 3) or min(x.shape[-2:]) < 1:
        raise UserError(f"a tensor picture must be CHW or BCHW with 3 (RGB) or 1 channels; got shape {tuple(x.shape)}")
    x = x.detach().cpu()
    if x.dtype != torch.uint8:
        if not x.is_floating_point():
            raise UserError(f"a tensor picture must be uint8 (0..255) or float (0..1); got {x.dtype}")
        _check_unit_range(float(x.min()), float(x.max()), "tensor")
        x = (x.float() * 255 + 0.5).floor().to(torch.uint8)  # rounded as to_bgr8 rounds float arrays
    x = x if x.ndim == 4 else x[None]
    return [np.ascontiguousarray(im.numpy().transpose(1, 2, 0)[..., ::-1]) if im.shape[0] == 3 else
            to_bgr8(np.ascontiguousarray(im[0].numpy())) for im in x]


def _check_unit_range(lo: float, hi: float, kind: str) -> None:
    """Floats must lie in 0..1: a 0..255 float picture would otherwise turn white without a word."""
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo < 0 or hi > 1:
        raise UserError(f"a float {kind} picture must hold values in 0..1; got {lo:g}..{hi:g}: divide by 255, "
                        f"or pass uint8")


def _is_pil(obj: Any) -> bool:
    pil = sys.modules.get("PIL.Image")  # a caller holding a PIL image has imported it; we never need to
    return pil is not None and isinstance(obj, pil.Image)


def _unique(name: str, used: set[str]) -> str:
    """`name`, or stem_2.ext, stem_3.ext, ... when an earlier picture has it (results are saved by name)."""
    stem, suffix = Path(name).stem, Path(name).suffix
    out, n = name, 2
    while out in used:
        out, n = f"{stem}_{n}{suffix}", n + 1
    used.add(out)
    return out
