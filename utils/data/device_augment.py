"""Augmentation on the training device (--augment-on device): the loader's workers only read images and place
the mosaic tiles; the training process warps, colours and flips a whole batch at once after it reaches the device.

The split, and why: the host path (utils/data/augment.py) spends most of a sample's CPU time in the random
perspective warp and the HSV jitter of a 640x640 image. A GPU does both for a whole batch in a few batched
kernels. So in device mode a worker, for each sample:

  - draws every random number the host path draws, in the same order from the same per-sample generator
    (YoloDataset.sample_rng): the same seed gives the same mosaic, warp, colour gains and flips on either path;
  - paints only the part of the mosaic canvas (or of the letterboxed image) that the warp reads, and hands it
    over as uint8 BGR (a third of the canvas on average at scale 0.5), with the 3x3 warp matrix, the labels on
    the canvas and the per-sample draws (`SamplePlan`; `collate_plans` packs a batch into one `RawBatch`).

`DeviceAugment`, the one object train.py calls per batch, then (on the training device, after one pinned,
non-blocking copy):

  - warps every picture with bilinear sampling from the packed crops: the source point of each output pixel
    through the same matrices cv2.warpAffine / warpPerspective use, taps outside the picture read the border
    value 114 as cv2's BORDER_CONSTANT does (`warp_bilinear`); flips are folded into the same coordinates;
  - blends mixup pairs as utils/data/augment.mixup does;
  - applies the HSV jitter through two tables of cv2's own 8-bit conversions (BGR->HSV for every colour,
    HSV->BGR for every hue, saturation and value) around each sample's lookup tables (augment.hsv_luts)
    (`hsv_jitter`, `hsv_tables`);
  - maps the boxes through the same matrices and drops them by the same rules (augment.warp_labels_batched:
    clip, box_candidates' area, aspect and size rules). Boxes stay on the host, in the training process, in
    float64 as the host path computes them: a batch holds a few hundred, and dropping boxes on the GPU would make
    the host wait for the device to learn how many are left.

How close the two paths are (tests/test_device_augment.py): boxes equal to within 1e-3 px; colours bit-exact
given the same warped pixels; warped pixels within 1 grey level of cv2's (cv2 computes the same bilinear
interpolation in its own vector code and rounds a few pixels the other way); the whole pipeline within a mean
difference of 0.01 grey levels.

Nothing here reads a device tensor on the host or makes a device tensor from host numbers without a pinned,
non-blocking copy: on CUDA the host never waits for the GPU's queue.

Mixup runs on the device too (both pictures are warped in the same batched call). Copy-paste does not exist on
either path (it needs polygon labels; utils/data/datasets.py warns and ignores it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import cv2
import numpy as np
import torch

from utils.boxes import xyxy2xywhn
from utils.data.augment import PAD_VALUE, paint_mosaic, Tile, hsv_luts, warp_labels_batched
from utils.device import pinned_transfers
from utils.hyp import Hyp

# columns of RawBatch.layers (one row per warped picture) and RawBatch.samples (one row per sample)
L_SAMPLE, L_OFFSET, L_H, L_W, L_X0, L_Y0, L_MATRIX, L_SCALE = 0, 1, 2, 3, 4, 5, slice(6, 15), 15
LAYER_COLUMNS = 16
S_MIX, S_GAINS, S_UD, S_LR = 0, slice(1, 4), 4, 5
SAMPLE_COLUMNS = 6


# ============================================================================================= worker side


class Layer(NamedTuple):
    """One picture to warp: a mosaic canvas (tiles) or a letterboxed image (tiles None, images[0] the image);
    only `region` (x1, y1, x2, y2) of it is painted, the part the warp reads."""

    images: list[np.ndarray]
    tiles: list[Tile] | None
    size: int  # the mosaic's size (its canvas is 2 * size square); unused for a letterboxed image
    region: tuple[int, int, int, int]
    matrix: np.ndarray  # 3x3, canvas pixel -> output pixel
    scale: float  # the warp's scale draw (box_candidates compares areas with it)
    labels: np.ndarray  # (n, 5) cls + pixel xyxy on the canvas

    def paint(self, out: np.ndarray) -> None:
        """Write the region's pixels into `out` (its (h, w, 3) uint8 view)."""
        x1, y1, x2, y2 = self.region
        if self.tiles is None:
            out[...] = self.images[0][y1:y2, x1:x2]
            return
        shifted = [Tile((a - x1, b - y1, c - x1, d - y1), src, (qa - x1, qb - y1, qc - x1, qd - y1))
                   for (a, b, c, d), src, (qa, qb, qc, qd) in self.tiles]
        paint_mosaic(self.images, shifted, self.size, region=(0, 0, x2 - x1, y2 - y1), canvas=out)


class SamplePlan(NamedTuple):
    """A training sample in device mode: its pictures (two for mixup) and the draws the device applies."""

    layers: tuple[Layer, ...]
    mix: float  # weight of the first picture (mixup); 1.0 with one picture
    gains: np.ndarray  # (3,) HSV gains (augment.hsv_gains)
    flips: tuple[bool, bool]  # (up-down, left-right)
    out_hw: tuple[int, int]
    projective: bool


@dataclass
class RawBatch:
    """A batch as the workers hand it over: every picture's painted region, BGR HWC uint8, one after another in
    `pixels`; per picture a row of `layers` (sample, pixel offset, h, w, x0, y0 of the region on its canvas, the
    3x3 matrix, the scale draw); per sample a row of `samples` (mixup weight, three HSV gains, flips)."""

    pixels: torch.Tensor  # (P * 3,) uint8
    layers: torch.Tensor  # (L, LAYER_COLUMNS) float64
    samples: torch.Tensor  # (B, SAMPLE_COLUMNS) float64
    out_hw: tuple[int, int]
    projective: bool

    def __len__(self) -> int:
        return len(self.samples)

    def pin_memory(self) -> RawBatch:
        """Page-locked copies (DataLoader(pin_memory=True) calls this), for a non-blocking copy to a GPU."""
        return RawBatch(self.pixels.pin_memory(), self.layers.pin_memory(), self.samples.pin_memory(), self.out_hw,
                        self.projective)

    @staticmethod
    def join(parts: Sequence[tuple], pin: bool = False) -> tuple[RawBatch, torch.Tensor, list[str], list]:
        """One batch from the chunks of it that several workers built (utils/data/datasets.ChunkedLoader)."""
        raws = [p[0] for p in parts]
        pixels = torch.empty(sum(r.pixels.numel() for r in raws), dtype=torch.uint8, pin_memory=pin)
        torch.cat([r.pixels for r in raws], out=pixels)
        layers, labels, pix, n_layers, n_samples = [], [], 0, 0, 0
        for r, (_, lab, *_) in zip(raws, parts):
            lay = r.layers.clone()
            lay[:, L_SAMPLE] += n_samples
            lay[:, L_OFFSET] += pix
            layers.append(lay)
            lab = lab.clone()
            lab[:, 0] += n_layers
            labels.append(lab)
            pix, n_layers, n_samples = pix + r.pixels.numel() // 3, n_layers + len(lay), n_samples + len(r)
        raw = RawBatch(pixels, torch.cat(layers), torch.cat([r.samples for r in raws]), raws[0].out_hw,
                       raws[0].projective)
        labels = torch.cat(labels)
        paths = [p for part in parts for p in part[2]]
        shapes = [s for part in parts for s in part[3]]
        if pin:
            raw = RawBatch(raw.pixels, raw.layers.pin_memory(), raw.samples.pin_memory(), raw.out_hw, raw.projective)
            labels = labels.pin_memory()
        return raw, labels, paths, shapes


def _uint8_buffer(n: int) -> torch.Tensor:
    """n bytes; in a loader worker in shared memory before anything is painted into it, so that handing the batch
    over to the training process copies nothing (what torch's default_collate does for the tensors it stacks).
    share_memory_ moves the still empty buffer there (a copy of untouched pages)."""
    buf = torch.empty(n, dtype=torch.uint8)
    return buf.share_memory_() if torch.utils.data.get_worker_info() is not None else buf


def collate_plans(batch: list) -> tuple[RawBatch, torch.Tensor, list[str], list]:
    """The device-mode collate_fn: paints every sample's pictures into one buffer (then one PAD_VALUE pixel).
    Returns the RawBatch, the labels
    (n, 6) float32 as (picture index, cls, x1, y1, x2, y2 on its canvas), paths and shapes."""
    plans, _, paths, shapes = zip(*batch)
    out_hw, projective = plans[0].out_hw, plans[0].projective
    if any(p.out_hw != out_hw for p in plans):
        raise ValueError(f"one batch needs one output size, got {sorted({p.out_hw for p in plans})}")
    pictures = [(b, layer) for b, p in enumerate(plans) for layer in p.layers]
    areas = [(layer.region[2] - layer.region[0]) * (layer.region[3] - layer.region[1]) for _, layer in pictures]
    pixels = _uint8_buffer(3 * (sum(areas) + 1))
    buf = pixels.numpy()
    buf[-3:] = PAD_VALUE  # the pixel every tap outside a crop reads (warp_bilinear)
    layers = np.zeros((len(pictures), LAYER_COLUMNS))
    labels, offset = [], 0
    for i, ((b, layer), area) in enumerate(zip(pictures, areas)):
        x1, y1, x2, y2 = layer.region
        layer.paint(buf[3 * offset : 3 * (offset + area)].reshape(y2 - y1, x2 - x1, 3))
        layers[i, :6] = b, offset, y2 - y1, x2 - x1, x1, y1
        layers[i, L_MATRIX], layers[i, L_SCALE] = layer.matrix.ravel(), layer.scale
        if len(layer.labels):
            labels.append(np.concatenate([np.full((len(layer.labels), 1), i, np.float32), layer.labels], 1))
        offset += area
    samples = np.array([[p.mix, *p.gains, p.flips[0], p.flips[1]] for p in plans], dtype=np.float64)
    labels = np.concatenate(labels, 0) if labels else np.zeros((0, 6), np.float32)
    raw = RawBatch(pixels, torch.from_numpy(layers), torch.from_numpy(samples), out_hw, projective)
    return raw, torch.from_numpy(labels.astype(np.float32)), list(paths), list(shapes)


# ============================================================================================= training side


class DeviceAugment:
    """Brings a training batch to the device. Host mode (a uint8 image batch): the copy alone. Device mode (a
    RawBatch): the copy, then the warp, mixup, HSV jitter and flips there, and the boxes through the same matrices.

        imgs, targets = augment(imgs, targets)   # float images in [0, 1], channels_last, on the device; targets
                                                 # (n, 6) image, cls, xywhn, on the host (as the loader gives them)
    """

    def __init__(self, hyp: Hyp, device: torch.device | str):
        self.device = torch.device(device)
        self.hsv = bool(hyp.hsv_h or hyp.hsv_s or hyp.hsv_v)
        self.pin = pinned_transfers(self.device)
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, imgs: torch.Tensor | RawBatch, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(imgs, RawBatch):
            return imgs.to(self.device, non_blocking=True, memory_format=torch.channels_last).float() / 255, targets
        targets = self.boxes(imgs, targets)
        return self.pixels(imgs).float() / 255, (targets.pin_memory() if self.pin else targets)

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        # a copy from pageable memory would wait for the device to finish its queue: pin first
        return (x.pin_memory() if self.pin and not x.is_pinned() else x).to(self.device, non_blocking=True)

    # ------------------------------------------------------------------------------------- boxes (host)
    @staticmethod
    def boxes(raw: RawBatch, labels: torch.Tensor) -> torch.Tensor:
        """The targets (n, 6) image, cls, xywhn of the augmented batch, as the host path makes them."""
        lay, smp, lab = raw.layers.numpy(), raw.samples.numpy(), labels.numpy()
        oh, ow = raw.out_hw
        kept, picture = warp_labels_batched(lab[:, 1:6], lab[:, 0].astype(np.int64), lay[:, L_MATRIX].reshape(-1, 3, 3),
                                            lay[:, L_SCALE], (ow, oh), raw.projective)
        sample = lay[picture, L_SAMPLE].astype(np.int64)
        xywh = xyxy2xywhn(kept[:, 1:5].astype(np.float32), ow, oh, clip=True)
        ud, lr = smp[sample, S_UD] > 0, smp[sample, S_LR] > 0
        xywh[ud, 1] = 1 - xywh[ud, 1]
        xywh[lr, 0] = 1 - xywh[lr, 0]
        targets = np.zeros((len(kept), 6), np.float32)
        targets[:, 0], targets[:, 1], targets[:, 2:] = sample, kept[:, 0], xywh
        return torch.from_numpy(targets)

    # ------------------------------------------------------------------------------------- pixels (device)
    def pixels(self, raw: RawBatch) -> torch.Tensor:
        """(B, 3, H, W) RGB images (float, integer values 0..255, channels_last) on the device."""
        lay, smp = raw.layers.numpy(), raw.samples.numpy()
        oh, ow = raw.out_hw
        pix = raw.pixels.to(self.device, non_blocking=True).view(-1, 3)
        maps = torch.from_numpy(output_to_crop(lay, smp, raw.out_hw).astype(np.float32))
        ints = torch.from_numpy(lay[:, [L_OFFSET, L_H, L_W]].astype(np.int64))
        warped = warp_bilinear(pix, self._to_device(maps), self._to_device(ints), (oh, ow), raw.projective)
        out = self._mix(warped, lay, smp)
        if self.hsv:
            luts = self._to_device(torch.from_numpy(hsv_luts(smp[:, S_GAINS])))
            out = hsv_jitter(out, luts, *self.tables())
        return out.flip(-1).permute(0, 3, 1, 2)  # BGR HWC -> RGB CHW in channels_last memory

    def _mix(self, warped: torch.Tensor, lay: np.ndarray, smp: np.ndarray) -> torch.Tensor:
        """One picture per sample; mixup pairs blended in float32 and rounded as augment.mixup does."""
        if len(warped) == len(smp):
            return warped
        first = np.unique(lay[:, L_SAMPLE], return_index=True)[1]
        second = np.array([j if j < len(lay) and lay[j, L_SAMPLE] == lay[i, L_SAMPLE] else i
                           for i, j in zip(first, first + 1)])
        r = np.array(smp[:, S_MIX], dtype=np.float32)
        q = np.array(1 - smp[:, S_MIX], dtype=np.float32)  # (1 - r) in float64, then float32, as numpy computes it
        w = self._to_device(torch.from_numpy(np.stack([r, q], 1))).view(-1, 2, 1, 1, 1)
        a, b = warped[self._to_device(torch.from_numpy(first))], warped[self._to_device(torch.from_numpy(second))]
        return torch.where(w[:, 1] == 0, a, (a * w[:, 0] + b * w[:, 1]).round())

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """hsv_tables on the device, built on first use (0.3 s) and kept."""
        if self._tables is None:
            self._tables = tuple(t.to(self.device) for t in hsv_tables())
        return self._tables


WARP_BYTES_PER_PIXEL = 80  # DeviceAugment.pixels' peak per output pixel of each warped picture (see below)
HSV_TABLE_BYTES = (1 << 24) * 3 + (180 << 16) * 3  # hsv_tables on the device, built once per run: 86 MB
SMALL_BYTES = 1 << 20  # the pixel grids, matrices and lookup tables of a batch: a few kB, counted generously


def device_augment_bytes(batch: int, height: int, width: int, mixup: bool) -> int:
    """Device memory the device path (DeviceAugment.pixels) holds at its peak for a batch of `batch` outputs of
    height x width, for AutoBatch to count (the host path holds none of it). Per output pixel of each warped
    picture, warp_bilinear holds at its peak (while it gathers the fourth tap): the source coordinates' fractions
    (float32) and integer parts (int32), 16 B; the four in-bounds masks, 4 B; the flat index, 4 B; three taps
    as float32 BGR, 36 B; and the fourth being made, 20 B (its mask, index, uint8 pixels and float32 copy):
    80 B, what tests/test_device_augment.py measures on the CPU. The output it returns is the first tap: mixup
    and the colour jitter afterwards need less. With mixup a sample may warp two pictures: twice that. The HSV
    tables come on top, once."""
    pictures = batch * (2 if mixup else 1)
    return pictures * height * width * WARP_BYTES_PER_PIXEL + HSV_TABLE_BYTES + SMALL_BYTES


def output_to_crop(layers: np.ndarray, samples: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """(L, 3, 3) float64: each picture's map from a final output pixel (after the flips) to its painted crop:
    undo the flips, the warp matrix's inverse (as cv2.warpAffine inverts it), then the crop's offset."""
    oh, ow = out_hw
    n = len(layers)
    flip = np.repeat(np.eye(3)[None], n, 0)
    s = layers[:, L_SAMPLE].astype(np.int64)
    lr, ud = samples[s, S_LR] > 0, samples[s, S_UD] > 0
    flip[lr, 0, 0], flip[lr, 0, 2] = -1, ow - 1
    flip[ud, 1, 1], flip[ud, 1, 2] = -1, oh - 1
    shift = np.repeat(np.eye(3)[None], n, 0)
    shift[:, 0, 2], shift[:, 1, 2] = -layers[:, L_X0], -layers[:, L_Y0]
    return shift @ np.linalg.inv(layers[:, L_MATRIX].reshape(n, 3, 3)) @ flip


def warp_bilinear(pix: torch.Tensor, maps: torch.Tensor, ints: torch.Tensor, out_hw: tuple[int, int],
                  projective: bool) -> torch.Tensor:
    """Bilinear warp of packed crops: (L, H, W, 3) float, rounded to integer values like cv2's uint8 output.

    pix (P, 3) uint8: the pixels of every crop one after another, then one pixel of PAD_VALUE; maps (L, 3, 3)
    output pixel -> crop pixel; ints (L, 3) int64: each crop's first pixel in `pix`, its height and width. A tap
    outside its crop reads the PAD_VALUE pixel. That is cv2's BORDER_CONSTANT: a crop holds every canvas pixel
    the warp reads (augment.plan_warp, with a margin), so a tap outside it lies outside the canvas.
    """
    oh, ow = out_hw
    dev = pix.device
    u = torch.arange(ow, device=dev, dtype=torch.float32)
    v = torch.arange(oh, device=dev, dtype=torch.float32)[:, None]
    m = maps[:, :, :, None, None]  # (L, 3, 3, 1, 1)
    x = m[:, 0, 0] * u + m[:, 0, 1] * v + m[:, 0, 2]
    y = m[:, 1, 0] * u + m[:, 1, 1] * v + m[:, 1, 2]
    if projective:
        w = m[:, 2, 0] * u + m[:, 2, 1] * v + m[:, 2, 2]
        x, y = torch.nan_to_num_(x / w, nan=-2.0), torch.nan_to_num_(y / w, nan=-2.0)
    # far-away points read the border either way: clamp so that the integer conversion is safe
    x, y = x.clamp_(-2, 1 << 20), y.clamp_(-2, 1 << 20)
    ix, iy = x.floor(), y.floor()
    fx, fy = x.sub_(ix).unsqueeze_(-1), y.sub_(iy).unsqueeze_(-1)
    ix, iy = ix.to(torch.int32), iy.to(torch.int32)
    off, h, w = (t.view(-1, 1, 1).to(torch.int32) for t in ints.unbind(1))
    x_in, x1_in = (ix >= 0) & (ix < w), (ix >= -1) & (ix < w - 1)  # the 2x2 footprint's columns and rows inside
    y_in, y1_in = (iy >= 0) & (iy < h), (iy >= -1) & (iy < h - 1)
    base, pad = off + iy * w + ix, len(pix) - 1  # (a Python number: a tensor made from one would be a blocking copy)

    def tap(inside: torch.Tensor, shift: torch.Tensor | int) -> torch.Tensor:
        idx = torch.where(inside, base + shift, pad)
        return pix.index_select(0, idx.view(-1)).view(*idx.shape, 3).float()

    p00, p10 = tap(x_in & y_in, 0), tap(x1_in & y_in, 1)
    top = p00.add_(p10.sub_(p00).mul_(fx))
    p01, p11 = tap(x_in & y1_in, w), tap(x1_in & y1_in, w + 1)
    bottom = p01.add_(p11.sub_(p01).mul_(fx))
    return top.add_(bottom.sub_(top).mul_(fy)).round_().clamp_(0, 255)


def hsv_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """cv2's own 8-bit conversions as tables: BGR -> HSV for every one of the 2**24 colours (index b<<16 | g<<8 |
    r), and HSV -> BGR for every hue 0..179, saturation and value (index h<<16 | s<<8 | v): 48 and 34 MB. Built
    by cv2.cvtColor on rows 4096 and 256 pixels wide, multiples of OpenCV's vector width, so every entry comes
    from the code that converts a training image whose width is one (OpenCV's scalar code, which converts the
    last pixels of other rows, rounds a few values the other way)."""
    k = np.arange(1 << 24, dtype=np.uint32)
    bgr = np.stack([k >> 16, (k >> 8) & 255, k & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)
    to_hsv = cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV).reshape(-1, 3)
    hsv = bgr.reshape(-1, 3)[: 180 << 16].reshape(-1, 256, 3)  # the same enumeration: (h, s, v) for h < 180
    to_bgr = cv2.cvtColor(np.ascontiguousarray(hsv), cv2.COLOR_HSV2BGR).reshape(-1, 3)
    return torch.from_numpy(to_hsv), torch.from_numpy(to_bgr)


def hsv_jitter(bgr: torch.Tensor, luts: torch.Tensor, to_hsv: torch.Tensor, to_bgr: torch.Tensor) -> torch.Tensor:
    """augment_hsv on a batch: (B, H, W, 3) BGR (float, integer values) -> (B, H, W, 3) uint8 BGR, through each
    sample's (3, 256) lookup tables (augment.hsv_luts) between cv2's conversions (hsv_tables)."""
    n = len(bgr)
    b, g, r = bgr.unbind(-1)
    key = (b * 65536 + g * 256 + r).to(torch.int32)  # exact in float32: below 2**24
    hsv = to_hsv.index_select(0, key.view(-1)).view(n, -1, 3)
    luts = luts.to(torch.int32)
    idx = sum(torch.gather(luts[:, c] * scale, 1, hsv[..., c].long())  # one channel's int64 index at a time
              for c, scale in enumerate((65536, 256, 1)))
    return to_bgr.index_select(0, idx.view(-1)).view(bgr.shape)
