"""YOLO-format datasets: the dataset (augmented training samples, letterboxed validation ones), the
seeded sampler and the loaders.

The data YAML is read by utils/data/data_config.py, images are decoded by utils/data/images.py, the image and
label files are listed and verified by utils/data/labels.py.

Determinism: `SeededSampler` orders the samples from (seed, epoch) and hands each dataset call an
(index, epoch) pair; the dataset seeds its augmentation from (seed, epoch, index). A batch is
therefore the same whichever worker builds it, with any number of workers, whole or in chunks
(ChunkedLoader), and after a restart.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
from itertools import pairwise
from pathlib import Path
from typing import Any, Iterator, Sequence

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from utils.boxes import xywhn2xyxy, xyxy2xywhn
from utils.data.augment import (augment_hsv, flip_draws, hsv_gains, letterbox, mixup, mixup_ratio, plan_mosaic,
                                plan_warp, random_flips, random_mosaic, random_perspective)
from utils.hyp import Hyp, load_hyp
from utils.data.device_augment import Layer, RawBatch, SamplePlan, collate_plans
from utils.data.images import bgr_to_chw_rgb, decode_in_threads, load_image_file
from utils.data.labels import cache_file_for, img2label_paths, list_image_files, verify_dataset
from utils.errors import STOP_SIGNALS, StopSignals, UserError

LOGGER = logging.getLogger(__name__)

AUTO_CACHE_MAX_BYTES = 2 << 30  # --cache auto: decoded images are kept in RAM up to this size...
AUTO_CACHE_RAM_SHARE = 0.25  # ...and this share of the memory available when the loader is built
MAX_CHUNK = 8  # samples per worker task when workers share batches (ChunkedLoader)
LOADER_TIMEOUT_S = 300  # a worker that delivers no batch for this long is stuck (dead mount...): fail, never hang


# =============================================================================================
# dataset


class UnreadableImage(UserError):
    """An image that passed verification but cannot be read now (deleted, truncated or replaced since)."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


class YoloDataset(Dataset):
    """Images and labels of one split; training samples are augmented, validation ones letterboxed.

    `dataset[i]` or `dataset[(i, epoch)]` -> (uint8 tensor 3xHxW RGB, float32 (n, 6) targets with
    column 0 left for the batch index, image path, shapes or None for mosaic).

    augment_on="device" (training samples only): `dataset[i]` -> (SamplePlan, None, path, shapes): the same
    draws, but the warp, colours and flips are left to the training device (utils/data/device_augment.py).
    """

    def __init__(self, sources: Sequence[str | Path], imgsz: int = 640, batch_size: int = 16, stride: int = 32,
                 hyp: Hyp | None = None, augment: bool = False, rect: bool = False, cache: str | bool | None = None,
                 single_cls: bool = False, pad: float = 0.0, prefix: str = "", seed: int = 0, nc: int | None = None,
                 mosaic_epochs: int | None = None, augment_on: str = "host"):
        sources = [Path(s) for s in (sources if isinstance(sources, (list, tuple)) else [sources])]
        self.on_device = augment and augment_on == "device"
        self.imgsz, self.stride, self.augment, self.rect, self.seed = imgsz, stride, augment, rect, seed
        self.hyp = hyp if hyp is not None else load_hyp()
        self.mosaic = augment and not rect  # rectangular batches fix each image's shape: no mosaic
        # epochs 0..mosaic_epochs-1 may draw mosaics, later ones see whole images (None: every epoch).
        # A function of the sample's epoch, so persistent workers and resumed runs agree without a rebuild.
        self.mosaic_epochs = mosaic_epochs
        if augment and self.hyp.copy_paste > 0:
            LOGGER.warning(f"{prefix}warning: copy_paste needs polygon labels, which these datasets do not have; "
                           f"ignored (set copy_paste: 0.0 in the hyperparameter file)")
        files = list_image_files(sources)
        index = verify_dataset(files, img2label_paths(files), nc, cache_file_for(sources), prefix)
        if not index.im_files:
            raise UserError(f"{prefix}no usable images in {', '.join(map(str, sources))}: all were left out "
                            f"(see the warnings above); fix or remove the files listed")
        if augment and not any(len(x) for x in index.labels):
            LOGGER.warning(f"{prefix}warning: {_no_boxes(index.im_files)}")
        self.im_files = list(index.im_files)
        self.shapes = np.asarray(index.shapes, dtype=np.int64)
        self.labels = [x[:, :5].copy() for x in index.labels]
        if single_cls:
            for x in self.labels:
                x[:, 0] = 0
        self.batch_shapes: np.ndarray | None = None
        self.batch_index = np.zeros(len(self.im_files), dtype=np.int64)
        if rect:
            self._sort_for_rect(batch_size, stride, pad)
        self.label_files = img2label_paths(self.im_files)
        self.ims: list[np.ndarray | None] = [None] * len(self.im_files)
        self.unreadable: set[int] = set()  # images that failed to load after verification (per process)
        mode = _cache_mode(cache)
        if mode == "ram" or (mode == "auto" and self._fits_in_ram()):
            self._cache_images(prefix, auto=mode == "auto")

    def __len__(self) -> int:
        return len(self.im_files)

    def _sort_for_rect(self, batch_size: int, stride: int, pad: float) -> None:
        """Sort by aspect ratio so each batch gets one stride-aligned shape with little padding."""
        ar = self.shapes[:, 1] / self.shapes[:, 0]  # h / w
        order = np.argsort(ar, kind="stable")
        self.im_files = [self.im_files[i] for i in order]
        self.labels = [self.labels[i] for i in order]
        self.shapes, ar = self.shapes[order], ar[order]
        self.batch_index = np.arange(len(ar)) // batch_size
        starts = np.arange(0, len(ar), batch_size)
        lo, hi = np.minimum.reduceat(ar, starts), np.maximum.reduceat(ar, starts)
        # (h, w) relative to imgsz: wide batches shrink h, tall batches shrink w, mixed stay square
        rel = np.ones((len(starts), 2))
        rel[hi < 1, 0] = hi[hi < 1]
        rel[lo > 1, 1] = 1 / lo[lo > 1]
        self.batch_shapes = (np.ceil(rel * self.imgsz / stride + pad).astype(np.int64) * stride)

    def cached_bytes(self) -> int:
        """Memory the decoded images take once resized to long side imgsz (what --cache ram holds)."""
        wh = self.shapes.astype(np.float64)
        r = self.imgsz / wh.max(1)
        return int((np.maximum(np.round(wh * r[:, None]), 1).prod(1) * 3).sum())

    def _fits_in_ram(self) -> bool:
        """--cache auto: cache when the images take under AUTO_CACHE_MAX_BYTES and AUTO_CACHE_RAM_SHARE
        of the available memory (small datasets, where decoding is a large part of each step)."""
        need = self.cached_bytes()
        return need <= AUTO_CACHE_MAX_BYTES and need <= AUTO_CACHE_RAM_SHARE * available_memory()

    def _cache_images(self, prefix: str, auto: bool = False) -> None:
        """Decode and resize every image once, before workers start (they share it copy-on-write).
        An image that cannot be read now stays uncached; sampling it gives the usual one warning."""

        def read(i: int) -> np.ndarray | None:
            try:
                return self._read_resized(i)
            except UnreadableImage:
                return None

        self.ims = decode_in_threads(read, range(len(self)))
        gb = sum(im.nbytes for im in self.ims if im is not None) / 1e9
        how = " (--cache auto: they fit; --cache off to read them from disk each time)" if auto else ""
        LOGGER.info(f"{prefix}cached {sum(im is not None for im in self.ims)} images in RAM ({gb:.2f} GB){how}")

    def _read_resized(self, i: int) -> np.ndarray:
        """Image i with its long side = imgsz (area interpolation when shrinking for evaluation)."""
        try:
            if i in self.unreadable:
                raise ValueError("unreadable earlier in this run")
            im = load_image_file(self.im_files[i])
        except ValueError as e:
            raise UnreadableImage(f"{self.im_files[i]}: {e} (changed since it was verified?); restore or remove it",
                                  i) from None
        h0, w0 = im.shape[:2]
        r = self.imgsz / max(h0, w0)
        if r != 1:
            interp = cv2.INTER_LINEAR if (self.augment or r > 1) else cv2.INTER_AREA
            im = cv2.resize(im, (max(round(w0 * r), 1), max(round(h0 * r), 1)), interpolation=interp)
        return im

    def load_image(self, i: int) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
        """(image resized to long side imgsz, original (h0, w0), resized (h, w))."""
        im = self.ims[i] if self.ims[i] is not None else self._read_resized(i)
        w0, h0 = self.shapes[i]
        return im, (int(h0), int(w0)), im.shape[:2]

    def mosaic_in(self, epoch: int) -> bool:
        return self.mosaic and (self.mosaic_epochs is None or epoch < self.mosaic_epochs)

    def sample_rng(self, index: int, epoch: int) -> np.random.Generator:
        """Augmentation randomness of one sample: a function of (seed, epoch, index) only."""
        return np.random.default_rng([self.seed & 0xFFFFFFFF, epoch, index])

    def __getitem__(self, item: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, str, Any]:
        """Sample `index`; if one of its images has become unreadable, the next sample takes its place
        (deterministically, so every worker and every restart agrees), at `index`'s own output shape (its batch's
        rectangle, which the next sample's may not be), and a warning names the file."""
        index, epoch = item if isinstance(item, tuple) else (item, 0)
        shape = self.out_shape(index)
        for j in (k % len(self) for k in range(index, index + len(self))):
            try:
                return self._sample(j, epoch, shape)
            except UnreadableImage as e:
                if e.index not in self.unreadable:
                    self.unreadable.add(e.index)
                    LOGGER.warning(f"warning: {e}; skipped: another sample takes its place")
        raise UserError(f"no image of {len(self)} can be read any more (the first was {self.im_files[0]}); "
                        f"check the dataset folder")

    def out_shape(self, index: int) -> tuple[int, int]:
        """(h, w) of a letterboxed sample at `index`: its batch's rectangle, else imgsz square."""
        return tuple(int(x) for x in self.batch_shapes[self.batch_index[index]]) if self.rect else (self.imgsz,) * 2

    def _sample(self, index: int, epoch: int, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, str, Any]:
        rng = self.sample_rng(index, epoch) if self.augment else None
        if self.on_device:
            return self._planned_sample(index, epoch, rng, shape)
        if rng is not None and self.mosaic_in(epoch) and rng.random() < self.hyp.mosaic:
            im, labels = self._mosaic_sample(index, rng)
            if rng.random() < self.hyp.mixup:
                im2, labels2 = self._mosaic_sample(int(rng.integers(len(self))), rng)
                im, labels = mixup(im, labels, im2, labels2, rng)
            shapes = None
        else:
            im, labels, shapes = self._letterbox_sample(index, rng, shape)
        h, w = im.shape[:2]
        labels = np.concatenate([labels[:, :1], xyxy2xywhn(labels[:, 1:5].astype(np.float32), w, h, clip=True)], 1) if len(labels) else \
            np.zeros((0, 5), np.float32)
        if rng is not None:
            hyp = self.hyp
            im = augment_hsv(im, rng, hyp.hsv_h, hyp.hsv_s, hyp.hsv_v)
            im, labels = random_flips(im, labels, rng, hyp.flipud, hyp.fliplr)
        targets = torch.zeros((len(labels), 6), dtype=torch.float32)
        targets[:, 1:] = torch.from_numpy(labels.astype(np.float32))
        return torch.from_numpy(bgr_to_chw_rgb(im)), targets, self.im_files[index], shapes

    def _pixel_labels(self, i: int, w: float, h: float, padw: float, padh: float) -> np.ndarray:
        """Labels of image i as cls + pixel xyxy for the image drawn at size (w, h), offset (padw, padh)."""
        lab = self.labels[i]
        return np.concatenate([lab[:, :1], xywhn2xyxy(lab[:, 1:], w, h, padw, padh)], 1).astype(np.float32)

    def _letterbox_sample(self, index: int, rng: np.random.Generator | None,
                          shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, Any]:
        im, (h0, w0), (h, w) = self.load_image(index)
        im, (rx, ry), (padw, padh) = letterbox(im, shape, auto=False, scaleup=self.augment)
        labels = self._pixel_labels(index, rx * w, ry * h, padw, padh)
        shapes = ((h0, w0), ((ry * h / h0, rx * w / w0), (padw, padh)))
        if rng is not None:
            im, labels = random_perspective(im, labels, rng, **_geometry(self.hyp))
        return im, labels, shapes

    def _mosaic_sample(self, index: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Four images (this one and three drawn from rng) tiled, then warped and cropped to imgsz."""
        picks = [index, *(int(k) for k in rng.integers(len(self), size=3))]
        loaded = [self.load_image(k)[0] for k in picks]
        return random_mosaic(loaded, [self.labels[k] for k in picks], self.imgsz, rng, **_geometry(self.hyp))

    def _planned_sample(self, index: int, epoch: int, rng: np.random.Generator,
                        shape: tuple[int, int]) -> tuple[SamplePlan, None, str, Any]:
        """_sample's draws, in its order, for the training device: the pictures to warp (their read region painted
        later, by collate_plans) and the draws the device applies."""
        hyp = self.hyp
        if self.mosaic_in(epoch) and rng.random() < hyp.mosaic:
            layers, mix, shapes = [self._mosaic_layer(index, rng)], 1.0, None
            if rng.random() < hyp.mixup:
                layers.append(self._mosaic_layer(int(rng.integers(len(self))), rng))
                mix = mixup_ratio(rng)
            out_hw = (self.imgsz, self.imgsz)
        else:
            layer, shapes = self._letterbox_layer(index, rng, shape)
            layers, mix, out_hw = [layer], 1.0, layer.images[0].shape[:2]
        gains = hsv_gains(rng, hyp.hsv_h, hyp.hsv_s, hyp.hsv_v)
        flips = flip_draws(rng, hyp.flipud, hyp.fliplr)
        plan = SamplePlan(tuple(layers), mix, gains, flips, tuple(out_hw), hyp.perspective > 0)
        return plan, None, self.im_files[index], shapes

    def _mosaic_layer(self, index: int, rng: np.random.Generator) -> Layer:
        picks = [index, *(int(k) for k in rng.integers(len(self), size=3))]
        loaded = [self.load_image(k)[0] for k in picks]
        plan = plan_mosaic([im.shape for im in loaded], [self.labels[k] for k in picks], self.imgsz, rng,
                           **_geometry(self.hyp))
        return Layer(loaded, plan.tiles, self.imgsz, plan.region, plan.matrix, plan.scale, plan.labels)

    def _letterbox_layer(self, index: int, rng: np.random.Generator, shape: tuple[int, int]) -> tuple[Layer, Any]:
        im, (h0, w0), (h, w) = self.load_image(index)
        im, (rx, ry), (padw, padh) = letterbox(im, shape, auto=False, scaleup=True)
        labels = self._pixel_labels(index, rx * w, ry * h, padw, padh)
        shapes = ((h0, w0), ((ry * h / h0, rx * w / w0), (padw, padh)))
        wh = (im.shape[1], im.shape[0])
        m, s, region = plan_warp(rng, wh, wh, **_geometry(self.hyp))
        return Layer([im], None, self.imgsz, region, m, s, labels), shapes

    @staticmethod
    def collate_fn(batch: list) -> tuple[torch.Tensor, torch.Tensor, list[str], list]:
        """Stack images; concatenate targets with their image's index in the batch in column 0."""
        ims, targets, paths, shapes = zip(*batch)
        for i, t in enumerate(targets):
            t[:, 0] = i
        return torch.stack(ims, 0), torch.cat(targets, 0), list(paths), list(shapes)


def _no_boxes(im_files: list[str]) -> str:
    """Why a training set has no box, naming the labels folder it was looked for in (test.py says it of a split
    once it has scored one; a training set is only pictures, so it is said before it trains)."""
    label_files = img2label_paths(im_files)
    folders = sorted({str(Path(f).parent) for f in label_files})
    where = folders[0] + (f" (and {len(folders) - 1} more folders)" if len(folders) > 1 else "")
    found = sum(os.path.isfile(f) for f in label_files)
    what = (f"every label file in {where} is empty" if found else
            f"no label file in {where} (a picture's labels are the .txt of its name in the 'labels' folder beside "
            f"its 'images' folder)")
    return f"no boxes to train on: {what}; the {len(im_files)} pictures train as backgrounds"


def _geometry(hyp: Hyp) -> dict:
    return {"degrees": hyp.degrees, "translate": hyp.translate, "scale": hyp.scale, "shear": hyp.shear,
            "perspective": hyp.perspective}


def _cache_mode(cache: str | bool | None) -> str | None:
    if cache in (None, False, "", "none", "off"):
        return None
    if cache in (True, "ram"):
        return "ram"
    if cache == "auto":
        return "auto"
    raise UserError(f"--cache {cache!r} is not supported; use --cache ram, auto or off")


def available_memory() -> int:
    """Bytes of memory available to a new allocation (Linux MemAvailable, else free pages; 0 if unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


# =============================================================================================
# sampler and loader


class SeededSampler(Sampler):
    """Sample order from (seed, epoch), sharded over DDP ranks; yields (index, epoch) pairs.

    Shards are cut in blocks (block = batch size for rectangular batches, so a rank always gets
    whole batches of one shape) and padded by repeating from the start so every rank has the
    same number of steps (unequal counts would hang the gradient all-reduce).
    """

    def __init__(self, n: int, shuffle: bool = False, seed: int = 0, rank: int = -1, world_size: int = 1,
                 block: int = 1):
        self.n, self.shuffle, self.seed, self.block = n, shuffle, seed, max(block, 1)
        self.rank, self.world_size = max(rank, 0), (world_size if rank >= 0 else 1)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(int(np.random.SeedSequence([self.seed & 0xFFFFFFFF, self.epoch]).generate_state(1)[0]))
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        return self._shard(order)

    def _shard(self, order: list[int]) -> list[int]:
        if self.world_size == 1:
            return order
        blocks = [order[i : i + self.block] for i in range(0, len(order), self.block)]
        total = math.ceil(len(blocks) / self.world_size) * self.world_size
        blocks += [blocks[k % len(blocks)] for k in range(total - len(blocks))]
        return [i for b in blocks[self.rank :: self.world_size] for i in b]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        return iter([(i, epoch) for i in self.indices()])

    def __len__(self) -> int:
        return len(self._shard(list(range(self.n))))


# SIGTERM is how job schedulers, systemd and container stops end a job, and sent to the process group it reaches the
# loader's workers as well as train.py (SIGHUP too, when the terminal closes). torch's worker handler dies of a SIGTERM
# from anyone but its parent, and the main process, stopping cleanly, then finds its loader "killed by signal:
# Terminated" (a traceback, or a loader failure). So a worker ends on any stop signal as on Ctrl-C: torch's worker
# loop takes the KeyboardInterrupt and exits 0, and train.py stops the run. The first signal also lets the later ones
# go: `timeout` passes the group's SIGTERM on to the group, and a second KeyboardInterrupt in a worker already on its
# way out would end it with status 1, which the main process's loader reports as a crash: the worker's own
# StopSignals (utils/errors.py) raises the first and only notes the rest, as the run's does. Workers start with the
# signals blocked (_Loader) until their handlers are set, so one that lands while they start waits for the handler.


def _worker_init(_: int) -> None:
    cv2.setNumThreads(0)  # workers are the parallelism; OpenCV's own threads would oversubscribe the CPU
    StopSignals().install()  # the worker's own, fresh: the one forked from the parent holds the parent's state
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by _Loader: a pending one arrives now


@contextlib.contextmanager
def _stop_signals_blocked():
    """SIGTERM and SIGINT held back in this thread (and in the processes and threads it starts) meanwhile; one that
    arrives is delivered when the block ends."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks (and no process-group SIGTERM)
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _Loader(DataLoader):
    """A DataLoader whose worker processes start with the stop signals blocked (see STOP_SIGNALS): a child inherits
    the mask of the thread that forks it, and _worker_init unblocks them once its handlers are set."""

    def _get_iterator(self):
        with _stop_signals_blocked():
            return super()._get_iterator()


CHUNK_GAIN = 0.5  # chunks must at least halve the busiest worker's share of an epoch to be used


def _chunking_pays(n: int, batch_size: int, chunk: int, workers: int) -> bool:
    """Whether chunks of at most `chunk` shorten an epoch of n samples by at least CHUNK_GAIN.

    The epoch lasts as long as its busiest worker, which gets every `workers`-th task (DataLoader deals
    them round-robin). Where chunks win less, whole batches are kept: the main process then need not join
    chunks (one more copy of each batch, 0.36 ms per 640x640 image on the H200 machine), work that competes
    with the training step on the same thread. On the H200 the loop of the built-in set (25 batches of 16 a
    epoch, 8 workers; chunks would shorten its epoch by an eighth) ran 14.4 it/s with chunks and 21.6 without;
    COCO128 at batch 64 (2 batches an epoch, 16 workers) went from 142 to 432 images/s with them."""
    batches = _batch_sizes(n, batch_size)
    chunks = [b - a for m in batches for a, b in pairwise(_chunk_bounds(m, chunk))]
    return _busiest(chunks, workers) <= CHUNK_GAIN * _busiest(batches, workers)


def _busiest(tasks: list[int], workers: int) -> int:
    return max(sum(tasks[w::workers]) for w in range(workers))


def _batch_sizes(n: int, batch_size: int) -> list[int]:
    """Sizes of the batches DataLoader(batch_size, drop_last=False) cuts from n samples."""
    return [min(batch_size, n - i) for i in range(0, n, batch_size)]


def _chunk_bounds(n: int, chunk: int) -> list[int]:
    """Cut points of n samples into ceil(n / chunk) chunks whose sizes differ by at most one."""
    k = max(math.ceil(n / chunk), 1)
    return [round(i * n / k) for i in range(k + 1)]


class _ChunkSampler(Sampler):
    """The batches a DataLoader(batch_size) would cut from `sampler` (consecutive, the last one shorter),
    each cut into chunks of at most `chunk` samples: a chunk never spans two batches."""

    def __init__(self, sampler: Sampler, batch_size: int, chunk: int):
        self.sampler, self.batch_size, self.chunk = sampler, batch_size, chunk

    def __iter__(self) -> Iterator[list]:
        items = list(self.sampler)
        for start in range(0, len(items), self.batch_size):
            batch = items[start : start + self.batch_size]
            bounds = _chunk_bounds(len(batch), self.chunk)
            yield from (batch[a:b] for a, b in pairwise(bounds))

    def __len__(self) -> int:
        return sum(math.ceil(m / self.chunk) for m in _batch_sizes(len(self.sampler), self.batch_size))


class ChunkedLoader:
    """Batches of `batch_size` from workers that each build a chunk of at most `chunk` samples.

    A plain DataLoader worker builds a whole batch, so an epoch of fewer batches than workers leaves
    workers idle (COCO128 at batch 64 has 2 batches: 2 busy workers). Here the workers build chunks
    (stacked by `collate_fn`, which runs in the workers) and the main process joins the chunks of each
    batch. A sample depends on (seed, epoch, index) only, so the batches are those of
    DataLoader(dataset, batch_size, sampler=sampler, collate_fn=YoloDataset.collate_fn), bit for bit.

    Used like that DataLoader: len() is batches per epoch; .sampler, .dataset, .batch_size and
    .collate_fn (set it before iterating, as for a DataLoader with persistent workers) are there.
    """

    def __init__(self, dataset: Dataset, sampler: Sampler, batch_size: int, chunk: int, pin_memory: bool = False,
                 collate_fn=YoloDataset.collate_fn, **loader_kwargs):
        self.dataset, self.sampler, self.batch_size, self.pin_memory = dataset, sampler, batch_size, pin_memory
        self._chunks = _Loader(dataset, batch_sampler=_ChunkSampler(sampler, batch_size, chunk),
                                  collate_fn=collate_fn, pin_memory=False, **loader_kwargs)

    @property
    def collate_fn(self):
        return self._chunks.collate_fn

    @collate_fn.setter
    def collate_fn(self, fn) -> None:
        self._chunks.collate_fn = fn

    @property
    def num_workers(self) -> int:
        return self._chunks.num_workers

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[str], list]]:
        parts, count, left = [], 0, len(self.sampler)
        for part in self._chunks:
            parts.append(part)
            count += len(part[2])
            if count == min(self.batch_size, left):
                yield self._join(parts)
                parts, left, count = [], left - count, 0

    def _join(self, parts: list) -> tuple[torch.Tensor, torch.Tensor, list[str], list]:
        """One batch from its chunks, as collate_fn would have made it from all of its samples."""
        if isinstance(parts[0][0], RawBatch):
            return RawBatch.join(parts, self.pin_memory)
        ims = [p[0] for p in parts]
        n = sum(len(x) for x in ims)
        # straight into page-locked memory when the batch goes to a GPU (DataLoader(pin_memory) would pin a copy)
        out = torch.empty((n, *ims[0].shape[1:]), dtype=ims[0].dtype, pin_memory=self.pin_memory)
        torch.cat(ims, out=out)
        offset, targets = 0, []
        for im, t, *_ in parts:
            t[:, 0] += offset  # image index within the chunk -> within the batch
            targets.append(t)
            offset += len(im)
        targets = torch.cat(targets, 0)
        paths = [p for part in parts for p in part[2]]
        shapes = [s for part in parts for s in part[3]]
        return out, (targets.pin_memory() if self.pin_memory else targets), paths, shapes


def create_dataloader(path: str | Path | Sequence[str | Path], imgsz: int, batch_size: int, stride: int,
                      hyp: Hyp | None = None, augment: bool = False, rect: bool = False,
                      cache: str | bool | None = None, workers: int = 8, shuffle: bool = False, seed: int = 0,
                      single_cls: bool = False, rank: int = -1, world_size: int = 1, pad: float = 0.0,
                      prefix: str = "", nc: int | None = None, mosaic_epochs: int | None = None,
                      chunk: int | None = None, augment_on: str = "host"
                      ) -> tuple[DataLoader | ChunkedLoader, YoloDataset]:
    """The YoloDataset of `path` (a folder, a .txt list or a list of those) and its loader, batches
    (uint8 images, targets, paths, shapes); call `loader.sampler.set_epoch(epoch)` every epoch.

    `nc`: when given, label rows with a class outside 0..nc-1 leave their image out.
    `mosaic_epochs`: mosaics only in epochs below it (train.py's --close-mosaic).
    `chunk`: workers build at most this many samples of a batch each (ChunkedLoader; the same batches);
    0: whole batches; None: MAX_CHUNK where that shortens an epoch (few batches for the workers, as
    COCO128 at batch 64 on 8 workers), else whole batches.
    `augment_on`: "device" makes an augmenting loader's batches RawBatch (utils/data/device_augment.py: the workers
    paint the mosaics, the training device warps them; its DeviceAugment finishes each batch).
    """
    if rect and shuffle:
        LOGGER.warning(f"{prefix}warning: rect=True keeps images sorted by aspect ratio; shuffle turned off")
        shuffle = False
    sources = list(path) if isinstance(path, (list, tuple)) else [path]
    dataset = YoloDataset(sources, imgsz, batch_size, stride, hyp=hyp, augment=augment, rect=rect, cache=cache,
                          single_cls=single_cls, pad=pad, prefix=prefix, seed=seed, nc=nc, mosaic_epochs=mosaic_epochs,
                          augment_on=augment_on)
    batch_size = min(batch_size, len(dataset))
    collate = collate_plans if dataset.on_device else YoloDataset.collate_fn
    cpus = max((os.cpu_count() or 1) // max(world_size, 1), 1)
    nw = max(min(workers, cpus), 0)  # --workers as asked, up to the CPUs a process has
    sampler = SeededSampler(len(dataset), shuffle, seed, rank, world_size, block=batch_size if rect else 1)
    common = dict(num_workers=nw, persistent_workers=nw > 0, worker_init_fn=_worker_init,
                  timeout=LOADER_TIMEOUT_S if nw > 0 else 0,
                  # own generator: creating loader iterators must not consume the global torch RNG (exact resume)
                  generator=torch.Generator().manual_seed(seed & 0xFFFFFFFF))
    if chunk is None:
        chunk = MAX_CHUNK if nw >= 2 and _chunking_pays(len(sampler), batch_size, MAX_CHUNK, nw) else 0
    if 0 < chunk < batch_size:
        return ChunkedLoader(dataset, sampler, batch_size, chunk, pin_memory=torch.cuda.is_available(),
                             collate_fn=collate, **common), dataset
    loader = _Loader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate,
                        pin_memory=torch.cuda.is_available(), **common)
    return loader, dataset


def loader_failure(e: Exception, last: Path) -> UserError | None:
    """A DataLoader failure (a worker killed or crashed, a timeout, an error raised inside a worker) as one
    line saying how to continue; None for any other error."""
    text = str(e)
    if "DataLoader" not in text:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # an error raised in a worker arrives as 'Caught X in DataLoader worker N' + its traceback: keep its last line
    cause = lines[-1].split(": ", 1)[-1] if "Traceback" in text else lines[0]
    return UserError(f"training stopped, the data loader failed: {cause.rstrip('.')}; {last} holds the last "
                     f"finished epoch: fix the cause, then continue with python train.py --resume {last}")


def stopped_by_signal(e: Exception) -> bool:
    """A loader error that only says a worker was ended by SIGTERM, SIGINT or SIGHUP (signals meant for the whole run, as a
    process group's): part of a stop, never a failure of the loader."""
    text = str(e)
    return "DataLoader" in text and any(f"killed by signal: {name}" in text
                                        for name in ("Terminated", "Interrupt", "Hangup"))
