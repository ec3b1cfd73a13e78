"""--augment-on device: the training device's warp, colours, flips and boxes against the host path's.

Tolerances, and why: boxes come from the same float64 arithmetic as the host path's (1e-3 px, the issue asks for
1 px). Colours come from tables of cv2's own conversions, so given the same warped pixels they are the host's bit
for bit. The warp is the same bilinear interpolation as cv2.warpAffine's, computed in float32 on the device; cv2's
vector code rounds a few pixels the other way: without colour jitter every pixel is within 1 grey level and under
0.1% differ; with it, a pixel one level off in the warp can move further through the HSV round trip, so the
whole pipeline is held to a mean difference under 0.01 levels and 99.9% of values within 1. (At widths that
are not a multiple of OpenCV's vector width, cv2 converts the last pixels of each row to BGR with rounding instead
of truncation, so there the host path itself is half a level brighter on average: the device path is not.)
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import train
from utils.data.augment import PAD_VALUE, augment_hsv, hsv_gains, hsv_luts
from utils.hyp import load_hyp
from utils.data.datasets import YoloDataset, create_dataloader
from utils.data.device_augment import (HSV_TABLE_BYTES, DeviceAugment, RawBatch, collate_plans, device_augment_bytes,
                                       hsv_jitter, hsv_tables)
from utils.device import resolve_augment_on
from utils.engine.callbacks import Callbacks
from utils.engine.train_options import TrainOptions, saved_options
from utils.errors import UserError
from utils.files import load_yaml
from utils.report.results import read_rows

IMGSZ = 128  # a multiple of OpenCV's vector width (64 pixels with AVX-512): see hsv_tables on the others


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    """20 pictures of 1-4 coloured rectangles on textured backgrounds, of several sizes and aspect ratios."""
    root = tmp_path_factory.mktemp("pictures")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    rng = np.random.default_rng(0)
    for i in range(20):
        w, h = int(rng.integers(60, 160)), int(rng.integers(60, 160))
        im = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (5, 5), 0)
        rows = []
        for _ in range(int(rng.integers(1, 5))):
            bw, bh = int(rng.integers(6, w // 2)), int(rng.integers(6, h // 2))
            x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            im[y:y + bh, x:x + bw] = rng.integers(0, 256, 3)
            cx, cy = (x + bw / 2) / w, (y + bh / 2) / h
            rows.append(f"{int(rng.integers(3))} {cx:.6f} {cy:.6f} {bw / w:.6f} {bh / h:.6f}")
        cv2.imwrite(str(root / "images" / f"{i}.png"), im)
        (root / "labels" / f"{i}.txt").write_text("\n".join(rows) + "\n")
    return root / "images"


def both_paths(images: Path, hyp: dict, items: list[tuple[int, int]], seeds=(5, 5), rect: bool = False):
    """The same samples through the host path and through the device path (on this CPU)."""
    kw = dict(imgsz=IMGSZ, hyp=hyp, augment=True, cache="ram", rect=rect, batch_size=len(items))
    host = YoloDataset([images], seed=seeds[0], **kw)
    dev = YoloDataset([images], seed=seeds[1], augment_on="device", **kw)
    h_imgs, h_targets, *_ = YoloDataset.collate_fn([host[i] for i in items])
    raw, labels, *_ = collate_plans([dev[i] for i in items])
    d_imgs, d_targets = DeviceAugment(hyp, "cpu")(raw, labels)
    return h_imgs.float(), h_targets, d_imgs * 255, d_targets


HYPS = {
    "mosaic": {},
    "whole images": {"mosaic": 0.0},
    "mixup": {"mixup": 1.0},
    "rotation, shear, perspective, up-down flips": {"degrees": 10.0, "shear": 3.0, "perspective": 0.0005,
                                                   "flipud": 0.5},
}


@pytest.mark.slow
@pytest.mark.parametrize("change", HYPS, ids=list(HYPS))
def test_same_draws_give_the_host_paths_boxes_and_pixels(pictures, change):
    hyp = load_hyp().updated(**HYPS[change])
    items = [(i, epoch) for epoch in range(2) for i in range(0, 20, 2)]
    h_imgs, h_targets, d_imgs, d_targets = both_paths(pictures, hyp, items)
    assert d_imgs.shape == h_imgs.shape and d_imgs.is_contiguous(memory_format=torch.channels_last)
    assert len(h_targets) >= len(items) and d_targets.shape == h_targets.shape  # the same boxes kept
    assert torch.equal(d_targets[:, :2], h_targets[:, :2])  # image and class
    assert (d_targets[:, 2:] - h_targets[:, 2:]).abs().max() * IMGSZ <= 1e-3  # pixels
    diff = (d_imgs - h_imgs).abs()
    assert diff.mean() < 0.01 and torch.quantile(diff.flatten()[::7], 0.999) <= 1, (diff.mean(), diff.max())


def test_without_colour_jitter_every_pixel_is_within_one_level(pictures):
    hyp = load_hyp().updated(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, degrees=7.0)
    h_imgs, _, d_imgs, _ = both_paths(pictures, hyp, [(i, 3) for i in range(20)])
    diff = (d_imgs - h_imgs).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3, (diff.max(), (diff > 0).float().mean())


def test_rectangular_batches(pictures):
    # no colour jitter: these batches are 96 wide, where cv2's own colours change in the last 32 columns (above)
    hyp = load_hyp().updated(degrees=5.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    # the last batch of 4 holds the tallest pictures: 128 x 96
    h_imgs, h_targets, d_imgs, d_targets = both_paths(pictures, hyp, [(i, 0) for i in range(16, 20)], rect=True)
    assert d_imgs.shape == h_imgs.shape and h_imgs.shape[-1] != h_imgs.shape[-2]  # not square
    assert d_targets.shape == h_targets.shape and (d_targets - h_targets).abs().max() < 1e-4
    assert (d_imgs - h_imgs).abs().max() <= 1


def test_colours_are_cv2s_bit_for_bit():
    """hsv_jitter (the device's HSV) against augment_hsv (cv2) on every kind of colour: greys, saturated, dark."""
    rng = np.random.default_rng(1)
    ims = rng.integers(0, 256, (6, 32, 64, 3), dtype=np.uint8)
    ims[0, :4] = np.arange(256).reshape(4, 64, 1)  # greys: saturation 0
    ims[1, :, :, 0] = 0  # no blue at all
    want, gains = [], []
    for k, im in enumerate(ims):
        g = hsv_gains(np.random.default_rng(k), 0.3, 0.9, 0.6)
        gains.append(g)
        want.append(augment_hsv(im, np.random.default_rng(k), 0.3, 0.9, 0.6))
    got = hsv_jitter(torch.from_numpy(ims).float(), torch.from_numpy(hsv_luts(np.stack(gains))), *hsv_tables())
    assert np.array_equal(got.numpy(), np.stack(want))


def test_taps_outside_the_picture_read_the_border_value():
    """A picture shifted half out of the frame: the uncovered part is cv2's border grey, the rest cv2's pixels."""
    im = np.random.default_rng(2).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    m = np.array([[0.9, 0.1, 21.3], [-0.1, 0.9, -9.6], [0, 0, 1]])
    want = cv2.warpAffine(im, m[:2], (48, 40), borderValue=(PAD_VALUE,) * 3)
    layers = torch.zeros((1, 16), dtype=torch.float64)
    layers[0, :6] = torch.tensor([0, 0, 40, 50, 0, 0])
    layers[0, 6:15] = torch.from_numpy(m.ravel())
    pixels = torch.from_numpy(np.concatenate([im.ravel(), [PAD_VALUE] * 3]).astype(np.uint8))
    raw = RawBatch(pixels, layers, torch.tensor([[1.0, 1, 1, 1, 0, 0]], dtype=torch.float64), (40, 48), False)
    got = DeviceAugment(load_hyp().updated(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0), "cpu").pixels(raw)[0].permute(1, 2, 0).flip(-1).numpy()  # back to BGR HWC
    assert (got == PAD_VALUE).all(-1).sum() > 100
    assert np.abs(got - want.astype(np.float32)).max() <= 1


@pytest.mark.slow
def test_distributions_over_1000_independent_draws_match(pictures):
    """Different seeds on each path, 1,000 samples each: boxes kept per image, box sizes and pixel statistics.
    Each tolerance is at least twice what separates two host runs of different seeds here (box count mean 5%,
    box sides 3%, brightness 3.5 levels, contrast 2); a device path without its colour jitter is 35 levels off in
    brightness."""
    hyp = load_hyp()
    items = [(i % 20, i // 20) for i in range(1000)]
    host = YoloDataset([pictures], imgsz=64, hyp=hyp, augment=True, cache="ram", seed=11)
    dev = YoloDataset([pictures], imgsz=64, hyp=hyp, augment=True, cache="ram", seed=12, augment_on="device")
    aug = DeviceAugment(hyp, "cpu")
    h_batches = [YoloDataset.collate_fn([host[i] for i in items[k:k + 100]]) for k in range(0, 1000, 100)]
    d_batches = [aug(*collate_plans([dev[i] for i in items[k:k + 100]])[:2]) for k in range(0, 1000, 100)]

    def stats(batches, scale):
        per_image, sizes, means, stds = [], [], [], []
        for imgs, targets, *_ in batches:
            per_image += np.bincount(targets[:, 0].long().numpy(), minlength=len(imgs)).tolist()
            sizes += (targets[:, 4] * targets[:, 5]).sqrt().tolist()
            x = imgs.float() * scale
            means += x.mean((1, 2, 3)).tolist()
            stds += x.std((2, 3)).mean(1).tolist()
        return np.array(per_image), np.array(sizes), np.array(means), np.array(stds)

    h, d = stats(h_batches, 1.0), stats(d_batches, 255.0)
    q = [0.1, 0.25, 0.5, 0.75, 0.9]
    assert abs(h[0].mean() - d[0].mean()) < 0.15 * h[0].mean()  # boxes kept per image
    assert np.abs(np.quantile(h[0], q) - np.quantile(d[0], q)).max() <= 1
    assert np.abs(np.quantile(h[1], q) / np.quantile(d[1], q) - 1).max() < 0.12  # box sides
    assert np.abs(np.quantile(h[2], q) - np.quantile(d[2], q)).max() < 8  # image brightness (0..255)
    assert np.abs(np.quantile(h[3], q) - np.quantile(d[3], q)).max() < 5  # contrast


@pytest.mark.slow
def test_chunked_batches_are_the_whole_batches(pictures):
    """Workers that each paint a chunk of a batch (ChunkedLoader) give the batch one worker would have built."""
    kw = dict(hyp=load_hyp().updated(mixup=0.5), augment=True, shuffle=True, seed=1, cache="ram", augment_on="device")
    whole, _ = create_dataloader([pictures], IMGSZ, 8, 32, workers=0, chunk=0, **kw)
    chunked, _ = create_dataloader([pictures], IMGSZ, 8, 32, workers=2, chunk=3, **kw)
    aug = DeviceAugment(kw["hyp"], "cpu")
    n = 0
    for (a, ta, pa, _), (b, tb, pb, _) in zip(whole, chunked):
        assert isinstance(b, RawBatch) and pa == pb
        (ia, ta), (ib, tb) = aug(a, ta), aug(b, tb)
        assert torch.equal(ia, ib) and torch.equal(ta, tb)
        n += 1
    assert n == 3


def test_augment_on_auto_is_the_host_everywhere_and_device_is_opt_in():
    """auto keeps the host path on a GPU too: the device path is not measured on one yet (docs/augment_on_device.md)."""
    assert resolve_augment_on("auto", torch.device("cpu")) == "host"
    assert resolve_augment_on("auto", torch.device("cuda")) == "host"
    assert resolve_augment_on("auto", torch.device("cuda", 0)) == "host"
    assert resolve_augment_on("device", torch.device("cuda")) == "device"
    assert resolve_augment_on("device", torch.device("cpu")) == "device"
    assert resolve_augment_on("host", torch.device("cuda")) == "host"
    with pytest.raises(UserError, match="--augment-on"):
        resolve_augment_on("gpu", torch.device("cpu"))


def _peak_bytes(fn) -> int:
    """The most bytes the CPU allocator held at once while fn ran, from the profiler's allocation events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for e in events:
        held += e.nbytes()
        peak = max(peak, held)
    return peak


@pytest.mark.slow
@pytest.mark.parametrize("mixup", [0.0, 1.0], ids=["one picture", "mixup"])
def test_the_memory_estimate_covers_what_the_device_path_allocates(pictures, mixup):
    """device_augment_bytes (what AutoBatch adds for --augment-on device) against the peak the warp, mixup and colour
    jitter of a real batch allocate, measured here on the CPU (the same tensors as on a GPU): at least it, at most
    a quarter more. At batch 64 and 640 px that is about 2 GiB, twice that with mixup."""
    hyp = load_hyp().updated(mixup=mixup)
    ds = YoloDataset([pictures], imgsz=IMGSZ, hyp=hyp, augment=True, cache="ram", seed=3, augment_on="device")
    raw, _, *_ = collate_plans([ds[(i, 0)] for i in range(8)])
    aug = DeviceAugment(hyp, "cpu")
    aug.tables()  # built once per run, counted apart (HSV_TABLE_BYTES)
    measured = _peak_bytes(lambda: aug.pixels(raw))
    estimate = device_augment_bytes(8, IMGSZ, IMGSZ, mixup > 0) - HSV_TABLE_BYTES
    assert measured <= estimate <= 1.25 * measured, (measured, estimate)
    assert 1.8 * 2**30 < device_augment_bytes(64, 640, 640, False) < 2.4 * 2**30
    per_batch = [device_augment_bytes(64, 640, 640, m) - device_augment_bytes(0, 640, 640, m) for m in (False, True)]
    assert per_batch[1] == 2 * per_batch[0]


def test_a_workers_pixel_buffer_is_in_shared_memory(monkeypatch):
    """In a loader worker the batch's pixels are written straight into shared memory (handing them over copies
    nothing); in the main process into ordinary memory."""
    from utils.data import device_augment

    assert not device_augment._uint8_buffer(1000).is_shared()
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    buf = device_augment._uint8_buffer(1000)
    assert buf.is_shared() and buf.shape == (1000,) and buf.dtype == torch.uint8


def test_resume_keeps_what_ran():
    base = {k: v for k, v in vars(TrainOptions()).items()}
    assert saved_options({**base, "augment_on": "device"}, Path("last.pt"))["augment_on"] == "device"
    old = {k: v for k, v in base.items() if k != "augment_on"}  # a last.pt from before the option
    assert saved_options(old, Path("last.pt"))["augment_on"] == "host"
    with pytest.raises(UserError, match="augment_on"):
        saved_options({**base, "augment_on": "gpu"}, Path("last.pt"))


@pytest.mark.slow
def test_seeded_device_runs_repeat_and_resume_bit_for_bit(micro, tmp_path):
    """A seeded run stopped once epoch 0's last.pt is written repeats that epoch of an uninterrupted run; resumed,
    it continues at epoch 1 and ends with the uninterrupted run's results.csv and weights, bit for bit; both say
    they augmented on the device."""
    args = dict(data=str(micro), epochs=2, imgsz=64, batch_size=4, workers=0, seed=1, noplots=True, noval=True,
                amp="off", augment_on="device")
    whole = train.run(project=str(tmp_path / "whole"), **args)
    stop, seen = Callbacks(), Callbacks()

    def interrupt(t, epoch):
        if epoch == 1:  # epoch 0 is done: its results.csv row and last.pt are written
            raise KeyboardInterrupt

    stop.register("on_epoch_start", interrupt)
    cut = train.run(project=str(tmp_path / "cut"), callbacks=stop, **args)
    last = cut.save_dir / "weights" / "last.pt"
    assert cut.interrupted and torch.load(last, weights_only=True)["epoch"] == 0
    rows = [read_rows(r.save_dir / "results.csv", clock=False) for r in (whole, cut)]
    assert len(rows[1]) == 2 and rows[1] == rows[0][:2]  # the header and epoch 0, as the uninterrupted run's
    started: list[int] = []
    seen.register("on_epoch_start", lambda t, epoch: started.append(epoch))
    resumed = train.run(resume=str(last), callbacks=seen)
    assert started == [1] and resumed.save_dir == cut.save_dir
    assert [load_yaml(r.save_dir / "opt.yaml")["augment_on"] for r in (whole, resumed)] == ["device", "device"]
    assert read_rows(resumed.save_dir / "results.csv", clock=False) == rows[0] and len(rows[0]) == 3
    a, b = (torch.load(r.save_dir / "weights" / "last.pt", weights_only=True)["model"] for r in (whole, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_opt_yaml_records_the_resolved_choice(micro, tmp_path):
    out = train.run(data=str(micro), epochs=1, imgsz=64, batch_size=4, workers=0, noplots=True, noval=True,
                    project=str(tmp_path))
    assert load_yaml(out.save_dir / "opt.yaml")["augment_on"] == "host"  # auto, on a CPU
