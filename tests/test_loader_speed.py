"""The loader's fast paths give the very bytes of the plain ones.

Each optimised step is compared with a straightforward implementation written here (what the loader
did before it was made faster) on random images and the same random draws; the chunked loader is
compared with whole-batch loading over several epochs. Every comparison is exact (np.array_equal /
torch.equal), never a tolerance.
"""
from __future__ import annotations

import os

import cv2
import numpy as np
import pytest
import torch

from utils.boxes import xywhn2xyxy
from utils.data import augment
from utils.data.augment import PAD_VALUE, augment_hsv, mosaic4, random_flips, random_mosaic, random_perspective
from utils.data.data_config import load_data_config
from utils.hyp import load_hyp
from utils.data.datasets import (ChunkedLoader, SeededSampler, _chunk_bounds, _chunking_pays, _ChunkSampler,
                                 create_dataloader)
from utils.data.images import bgr_to_chw_rgb

# ----------------------------------------------------------------------------------------- references


def ref_hsv(im, rng, hgain, sgain, vgain):
    gains = rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1
    if not (hgain or sgain or vgain):
        return im
    hue, sat, val = cv2.split(cv2.cvtColor(im, cv2.COLOR_BGR2HSV))
    x = np.arange(256, dtype=np.float32)
    lut_h = ((x * gains[0]) % 180).astype(np.uint8)
    lut_s = np.clip(x * gains[1], 0, 255).astype(np.uint8)
    lut_v = np.clip(x * gains[2], 0, 255).astype(np.uint8)
    hsv = cv2.merge((cv2.LUT(hue, lut_h), cv2.LUT(sat, lut_s), cv2.LUT(val, lut_v)))
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)


def ref_flips(im, labels, rng, flipud, fliplr):
    do_ud, do_lr = rng.random(2) < (flipud, fliplr)
    labels = labels.copy()
    if do_ud:
        im = np.flipud(im)
        labels[:, 2] = 1 - labels[:, 2]
    if do_lr:
        im = np.fliplr(im)
        labels[:, 1] = 1 - labels[:, 1]
    return np.ascontiguousarray(im), labels


def ref_mosaic4(images, labels, s, rng):
    xc, yc = (int(v) for v in rng.uniform(0.5 * s, 1.5 * s, size=2))
    canvas = np.full((2 * s, 2 * s, 3), PAD_VALUE, dtype=np.uint8)
    out = []
    for k, (im, lab) in enumerate(zip(images, labels)):
        h, w = im.shape[:2]
        x1a, x2a = (max(xc - w, 0), xc) if k in (0, 2) else (xc, min(xc + w, 2 * s))
        y1a, y2a = (max(yc - h, 0), yc) if k in (0, 1) else (yc, min(yc + h, 2 * s))
        x1b = w - (x2a - x1a) if k in (0, 2) else 0
        y1b = h - (y2a - y1a) if k in (0, 1) else 0
        canvas[y1a:y2a, x1a:x2a] = im[y1b:y1b + (y2a - y1a), x1b:x1b + (x2a - x1a)]
        if len(lab):
            out.append(np.concatenate([lab[:, :1], xywhn2xyxy(lab[:, 1:], w, h, x1a - x1b, y1a - y1b)], axis=1))
    lab = np.concatenate(out, 0) if out else np.zeros((0, 5), np.float32)
    np.clip(lab[:, 1:], 0, 2 * s, out=lab[:, 1:])
    return canvas, lab.astype(np.float32)


def ref_chw(im):
    return np.ascontiguousarray(im[:, :, ::-1].transpose(2, 0, 1))


def random_image(rng, h, w):
    """Noise with flat patches and grey: HSV's hue wrap, saturation 0 and clipping all occur."""
    im = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    im[: h // 3, : w // 3] = rng.integers(0, 256, 3, dtype=np.uint8)
    im[h // 2 :, w // 2 :] = 128
    return im


def random_labels(rng, n):
    lab = rng.uniform(0.05, 0.95, (n, 5)).astype(np.float32)
    lab[:, 0] = rng.integers(0, 4, n)
    lab[:, 3:] *= 0.3
    return lab


SHAPES = [(640, 640), (480, 640), (427, 640), (1, 1), (3, 5), (7, 1), (97, 33)]


# ----------------------------------------------------------------------------------------- steps


@pytest.mark.parametrize("gains", [(0.015, 0.7, 0.4), (0.5, 0.5, 0.5), (1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (0.0, 0.9, 0.0)])
def test_augment_hsv_equals_reference(gains):
    for seed, (h, w) in enumerate(SHAPES):
        im = random_image(np.random.default_rng(seed), h, w)
        before = im.copy()
        got = augment_hsv(im, np.random.default_rng(100 + seed), *gains)
        assert np.array_equal(got, ref_hsv(im, np.random.default_rng(100 + seed), *gains)), (gains, h, w)
        assert np.array_equal(im, before)  # the input (a cached image, say) is never written


def test_random_flips_equal_reference_in_every_combination():
    for seed, (h, w) in enumerate(SHAPES):
        rng = np.random.default_rng(seed)
        im, lab = random_image(rng, h, w), random_labels(rng, 3)
        for probs in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (0.5, 0.5)):
            got_im, got_lab = random_flips(im, lab, np.random.default_rng(seed), *probs)
            ref_im, ref_lab = ref_flips(im, lab, np.random.default_rng(seed), *probs)
            assert np.array_equal(got_im, ref_im) and np.array_equal(got_lab, ref_lab), (probs, h, w)
            assert got_im.flags.c_contiguous


def test_bgr_to_chw_rgb_equals_transposed_copy():
    rng = np.random.default_rng(0)
    for h, w in SHAPES:
        im = random_image(rng, h, w)
        out = bgr_to_chw_rgb(im)
        assert np.array_equal(out, ref_chw(im)) and out.flags.c_contiguous
        view = im[::-1, ::2]  # not contiguous: still right
        assert np.array_equal(bgr_to_chw_rgb(view), ref_chw(view))


def mosaic_inputs(seed, size):
    rng = np.random.default_rng(seed)
    ims, labs = [], []
    for _ in range(4):
        long = size if rng.random() < 0.7 else int(rng.integers(size // 4, size))
        short = int(rng.integers(max(long // 3, 1), long + 1))
        h, w = (long, short) if rng.random() < 0.5 else (short, long)
        ims.append(random_image(rng, h, w))
        labs.append(random_labels(rng, int(rng.integers(0, 4))))
    return ims, labs


def test_mosaic4_equals_reference():
    for seed in range(20):
        size = (64, 96, 160)[seed % 3]
        ims, labs = mosaic_inputs(seed, size)
        canvas, lab = mosaic4(ims, labs, size, np.random.default_rng(seed))
        ref_canvas, ref_lab = ref_mosaic4(ims, labs, size, np.random.default_rng(seed))
        assert np.array_equal(canvas, ref_canvas) and np.array_equal(lab, ref_lab)


GEOMETRIES = [dict(translate=0.1, scale=0.5),  # the defaults
              dict(translate=0.1, scale=0.9),  # shrunk to a tenth: the warp reads nearly all the canvas
              dict(degrees=45.0, translate=0.3, scale=0.5, shear=10.0),
              dict(degrees=180.0, translate=0.5, scale=0.99, shear=45.0),
              dict(translate=0.0, scale=0.0),
              dict(translate=0.1, scale=0.5, perspective=0.0005)]


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_random_mosaic_equals_mosaic4_then_random_perspective(geometry):
    """random_mosaic paints only the canvas the warp reads; the output must not show it."""
    for seed in range(24):
        size = (64, 96, 128)[seed % 3]
        ims, labs = mosaic_inputs(seed, size)
        im, lab = random_mosaic(ims, labs, size, np.random.default_rng(seed), **geometry)
        rng = np.random.default_rng(seed)
        canvas, ref_lab = ref_mosaic4(ims, labs, size, rng)
        ref_im, ref_lab = random_perspective(canvas, ref_lab, rng, **geometry, border=(-(size // 2),) * 2)
        assert np.array_equal(im, ref_im) and np.array_equal(lab, ref_lab), (geometry, seed)


@pytest.mark.parametrize("geometry", GEOMETRIES[:4])
def test_the_read_region_holds_every_pixel_the_warp_reads(geometry):
    """Whatever lies outside the region (here: black, then white) never reaches the output."""
    for seed in range(24):
        size = (64, 96, 640)[seed % 3]
        ims, labs = mosaic_inputs(seed, size)
        rng = np.random.default_rng(seed)
        n, out = 2 * size, 2 * size - 2 * (size // 2)
        tiles = augment._mosaic_layout([im.shape for im in ims], size, rng)
        m, _ = augment._perspective_matrix(rng, (n, n), (out, out), **{"degrees": 0.0, "shear": 0.0, **geometry},
                                           perspective=0.0)
        region = augment._affine_read_region(m, (out, out), n)
        assert region is not None
        full = augment._warp(augment.paint_mosaic(ims, tiles, size), m, (out, out), False)
        for junk in (0, 255):
            canvas = np.full((n, n, 3), junk, np.uint8)
            part = augment.paint_mosaic(ims, tiles, size, region, canvas=canvas)
            assert np.array_equal(augment._warp(part, m, (out, out), False), full), (geometry, seed, junk)


# ----------------------------------------------------------------------------------------- whole samples


def reference_sample(ds, index, epoch):
    """YoloDataset._sample's mosaic path, built from the references above (mixup left out: hyp has 0)."""
    rng = ds.sample_rng(index, epoch)
    hyp = ds.hyp
    assert rng.random() < hyp.mosaic
    picks = [index, *(int(k) for k in rng.integers(len(ds), size=3))]
    canvas, labels = ref_mosaic4([ds.load_image(k)[0] for k in picks], [ds.labels[k] for k in picks], ds.imgsz, rng)
    geometry = {k: getattr(hyp, k) for k in ("degrees", "translate", "scale", "shear", "perspective")}
    im, labels = random_perspective(canvas, labels, rng, **geometry, border=(-(ds.imgsz // 2),) * 2)
    assert not rng.random() < hyp.mixup
    im = ref_hsv(im, rng, hyp.hsv_h, hyp.hsv_s, hyp.hsv_v)
    from utils.boxes import xyxy2xywhn

    h, w = im.shape[:2]
    labels = np.concatenate([labels[:, :1], xyxy2xywhn(labels[:, 1:5], w, h, clip=True)], 1) if len(labels) else \
        np.zeros((0, 5), np.float32)
    im, labels = ref_flips(im, labels, rng, hyp.flipud, hyp.fliplr)
    return ref_chw(im), labels


def test_training_samples_equal_the_reference_pipeline(coco_subset):
    """Mosaic on, the default hyperparameters, real COCO128 photos at 320."""
    loader, ds = create_dataloader(load_data_config(coco_subset)["train"], 320, 8, 32, hyp=load_hyp(), augment=True,
                                   workers=0, seed=7, cache="ram")
    assert ds.hyp.mosaic == 1.0
    for epoch in range(2):
        for index in range(0, len(ds), 3):
            im, targets, *_ = ds[(index, epoch)]
            ref_im, ref_labels = reference_sample(ds, index, epoch)
            assert np.array_equal(im.numpy(), ref_im) and np.array_equal(targets[:, 1:].numpy(), ref_labels)


# ----------------------------------------------------------------------------------------- chunked loader


def test_chunk_sampler_cuts_each_batch_and_never_across():
    sampler = SeededSampler(23, shuffle=True, seed=1)
    chunks = list(_ChunkSampler(sampler, 10, 4))
    assert len(chunks) == len(_ChunkSampler(sampler, 10, 4)) == 3 + 3 + 1
    assert [len(c) for c in chunks] == [3, 4, 3, 3, 4, 3, 3]  # 10 -> 3 4 3, the last 3 -> 3
    assert [i for c in chunks for i in c] == list(sampler)
    assert _chunk_bounds(64, 8) == list(range(0, 65, 8)) and _chunk_bounds(16, 8) == [0, 8, 16]


def batches(loader, epochs):
    out = []
    for epoch in epochs:
        loader.sampler.set_epoch(epoch)
        out.extend(loader)
    return out


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for (ims, targets, paths, shapes), (ims2, targets2, paths2, shapes2) in zip(got, want):
        assert ims.dtype == ims2.dtype and torch.equal(ims, ims2)
        assert targets.dtype == targets2.dtype and torch.equal(targets, targets2)
        assert paths == paths2 and shapes == shapes2


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["mosaic", "rect", "ddp rank 1 of 2"])
def test_chunked_loader_gives_the_whole_batch_loaders_batches(request, workers, mode):
    """Batches of 10 (the last one shorter), chunks of at most 4 (3 4 3 | ...), three epochs. Rect batches come
    from COCO128 photos (their shapes differ), the others from the 24 built-in images (10 10 4)."""
    data = request.getfixturevalue("coco_subset" if mode == "rect" else "tiny_data")
    hyp = load_hyp().updated(mixup=0.3, flipud=0.5)
    kw = dict(hyp=hyp, augment=True, seed=3, workers=workers, rect=mode == "rect", shuffle=mode != "rect",
              cache="ram")
    if mode.startswith("ddp"):
        kw.update(rank=1, world_size=2)
    train = load_data_config(data)["train"]
    plain, _ = create_dataloader(train, 64, 10, 32, chunk=0, **kw)
    chunked, ds = create_dataloader(train, 64, 10, 32, chunk=4, **kw)
    assert isinstance(chunked, ChunkedLoader) and not isinstance(plain, ChunkedLoader)
    assert len(chunked) == len(plain) and chunked.dataset is ds and chunked.batch_size == 10
    assert len(plain.sampler) % 10  # the last batch is a short one
    got, want = batches(chunked, range(3)), batches(plain, range(3))
    assert len(got) == 3 * len(plain)
    assert_same_batches(got, want)
    if mode == "rect":
        assert len({b[0].shape for b in want}) > 1  # batches of different shapes were compared


def test_chunks_by_default_only_where_they_shorten_an_epoch(tiny_data):
    assert _chunking_pays(128, 64, 8, 8)  # COCO128 at batch 64 on 8 workers: 2 of them would build it all
    assert not _chunking_pays(128, 16, 8, 8)  # 8 batches of 16 for 8 workers: chunks gain nothing
    assert not _chunking_pays(118_287, 64, 8, 8)  # COCO: 1849 batches keep 8 workers busy
    assert not _chunking_pays(400, 16, 8, 8)  # the built-in set: chunks would save an eighth, less than the join costs
    train = load_data_config(tiny_data)["train"]  # 24 images
    assert _chunking_pays(24, 24, 8, 3)  # one batch, 3 workers: chunks of 8 cut the busiest share to a third
    assert not _chunking_pays(24, 24, 8, 2)  # 2 workers: 16 of 24, not half
    if (os.cpu_count() or 1) >= 2:  # 2 workers
        loader, _ = create_dataloader(train, 64, 24, 32, augment=True, workers=2, chunk=8)  # asked for: chunked
        assert isinstance(loader, ChunkedLoader) and loader.num_workers == 2
    for workers, batch_size in ((1, 24), (2, 24), (2, 16), (2, 8)):  # one worker; 16 + 8 (each to its worker); 8 = a chunk
        loader, _ = create_dataloader(train, 64, batch_size, 32, augment=True, workers=workers)
        assert not isinstance(loader, ChunkedLoader), (workers, batch_size)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked memory needs CUDA")
def test_chunked_batches_are_joined_in_page_locked_memory(tiny_data):
    train = load_data_config(tiny_data)["train"]
    kw = dict(hyp=load_hyp(), augment=True, shuffle=True, seed=2, workers=2)
    plain, _ = create_dataloader(train, 64, 10, 32, chunk=0, **kw)
    chunked, _ = create_dataloader(train, 64, 10, 32, chunk=4, **kw)
    got, want = batches(chunked, range(2)), batches(plain, range(2))
    assert_same_batches(got, want)
    assert all(ims.is_pinned() and targets.is_pinned() for ims, targets, *_ in got)
