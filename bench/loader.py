"""Training data-loader benchmarks: throughput (images/s) with mosaic on COCO128, and three modes.

    python bench/loader.py [--data PATH/coco128.yaml] [--batches 10] [--batch-size 16] [--cache off ram]
                           [--chunk 0 8] [--augment-on host device] [--device cpu]
    python bench/loader.py --decode [--device 0] [--rounds 3] [--json OUT]
    python bench/loader.py --compare-paths --data DATA.yaml --imgsz 320 [--epochs 0 5] [--batches 4] [--seed 1]
    python bench/loader.py --repeat 16 --out /tmp/coco2048        # prints /tmp/coco2048/repeat.yaml

Times N batches after a warm-up (worker start-up and first decode excluded) for each image size
and worker count, and prints a table. The timed batches go on across epochs, so the epoch boundaries
(where a small dataset's workers wait) count. --chunk compares the samples a worker builds at a time
(0: whole batches; default: the loader's own choice, and the table has no chunk column).

--augment-on says which path the workers run (train.py's option; the "augment" column): host, the whole
augmentation; device, only reading and placing the mosaic tiles, so images/s is what the host must sustain for
the training device to do the rest. For device rows, "device s/batch" is what that rest (utils/data/
device_augment.DeviceAugment: warp, HSV, flips, boxes) takes per batch on --device, timed after the loader on
the same batches: wall seconds on a GPU (synchronised before each clock reading), CPU seconds on a CPU.

--decode: JPEG decoding with the cache off, cv2.imdecode on one CPU core (what a loader worker does) beside
torchvision.io.decode_jpeg on --device, batched (what --augment-on device could use instead). The files are read
into memory first; only decoding is timed (the best of --rounds passes over every JPEG of the training split; a
GPU is synchronised at both ends of each pass). Prints one JSON object, also written to --json.

--compare-paths: the same training batches through both --augment-on paths, side by side, for each --imgsz. For
each of the first --batches batches (default 4) of each epoch in --epochs: whether the two paths kept the same
boxes (and the largest difference of their normalised coordinates), the mean and largest pixel difference in grey
levels, the share of pixel values that differ, and each path's mean grey level. The training loader's settings
otherwise (default hyperparameters, mosaic, cache ram, shuffle seeded by --seed, one process).

--repeat N --out DIR: DIR/repeat.yaml, N copies of --data's training images under distinct names, so a training
loop can be timed over many batches (COCO128 at batch 64 is 2 batches an epoch: that times epoch start-up). Copy 3
of x.jpg is images/train/k03_x.jpg, its label labels/train/k03_x.txt, so each copy is its own sample; validation is
the source's. Links, not copies (2,048 images cost no disk); running it again on the same folder keeps what is there.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from utils.data.data_config import SHARED_COCO128, load_data_config, load_hyp  # noqa: E402
from utils.data.datasets import create_dataloader  # noqa: E402
from utils.data.device_augment import DeviceAugment  # noqa: E402
from utils.data.labels import img2label_paths, list_image_files  # noqa: E402
from utils.device import select_device  # noqa: E402
from utils.errors import UserError, run_cli  # noqa: E402

DEFAULT_DATA = SHARED_COCO128 / "coco128.yaml"


def measure(train: list, imgsz: int, workers: int, batch_size: int, batches: int, warmup: int = 2,
            cache: str = "off", chunk: int | None = None, augment_on: str = "host", device: str = "cpu"
            ) -> tuple[float, float | None]:
    """Images per second of the augmenting (mosaic) training loader; for device mode also the seconds per batch
    that the training device then spends on the rest of the augmentation (None for host mode)."""
    loader, _ = create_dataloader(train, imgsz, batch_size, 32, hyp=load_hyp(), augment=True, shuffle=True,
                                  workers=workers, seed=0, cache=cache, chunk=chunk, augment_on=augment_on)
    seen, t0, epoch, kept = 0, 0.0, 0, []
    while True:
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            if warmup:
                warmup -= 1
                t0 = time.perf_counter()
                continue
            seen += len(batch[0])
            batches -= 1
            if augment_on == "device" and len(kept) < 4:  # a few batches for the device's share
                kept.append(batch[:2])
            if batches == 0:
                rate = seen / (time.perf_counter() - t0)
                return rate, device_seconds(kept, device) if kept else None
        epoch += 1


def device_seconds(batches: list, device: str) -> float:
    """Median seconds per batch of DeviceAugment (what train.py calls) on `device`, after one untimed batch: wall
    seconds on a GPU (synchronised), CPU seconds of this process on a CPU (what the training process gives up)."""
    dev = select_device(device)
    augment = DeviceAugment(load_hyp(), dev)
    on_gpu = dev.type == "cuda"
    sync, clock = (torch.cuda.synchronize, time.perf_counter) if on_gpu else ((lambda: None), time.process_time)
    times = []
    for k, (raw, labels) in enumerate([batches[0], *batches]):
        sync()
        t0 = clock()
        augment(raw, labels)
        sync()
        if k:
            times.append(clock() - t0)
    return sorted(times)[len(times) // 2]


def decode_rates(files: list[str], device: str = "0", rounds: int = 3, batch: int = 64) -> dict:
    """--decode: images/s of cv2.imdecode on one core and of decode_jpeg on `device` (batches of `batch`)."""
    from torchvision.io import decode_jpeg

    blobs = [Path(f).read_bytes() for f in files if f.lower().endswith((".jpg", ".jpeg"))]
    if not blobs:
        raise UserError("--decode: no JPEG files in the training split")
    cv2.setNumThreads(1)
    best_cv2 = min(_timed(lambda: [cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR) for b in blobs])
                   for _ in range(rounds))
    dev = select_device(device)
    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def device_pass():
        for k in range(0, len(tensors), batch):
            decode_jpeg(tensors[k:k + batch], device=dev)
        sync()

    device_pass()  # the decoder's start-up
    best_dev = min(_timed(device_pass) for _ in range(rounds))
    return {"images": len(blobs), "cv2 img/s (1 core)": len(blobs) / best_cv2,
            f"decode_jpeg img/s ({dev.type})": len(blobs) / best_dev, "device": str(dev)}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare_paths(train: list, imgsz: int, epochs: list[int], batches: int, batch_size: int, seed: int,
                  device: str) -> list[dict]:
    """--compare-paths: one dict per batch, how the host and the device path's finished batches differ."""
    hyp, dev = load_hyp(), select_device(device)
    kw = dict(hyp=hyp, augment=True, shuffle=True, seed=seed, cache="ram", workers=0)
    loaders = [create_dataloader(train, imgsz, batch_size, 32, augment_on=a, **kw)[0] for a in ("host", "device")]
    augments = [DeviceAugment(hyp, dev), DeviceAugment(hyp, dev)]  # the host path's batch passes through it too
    rows = []
    for epoch in epochs:
        for loader in loaders:
            loader.sampler.set_epoch(epoch)
        for k, (h, d) in enumerate(zip(*loaders)):
            if k == batches:
                break
            (hi, ht), (di, dt) = augments[0](*h[:2]), augments[1](*d[:2])
            diff = ((hi - di) * 255).abs()
            same = ht.shape == dt.shape and bool((ht[:, :2] == dt[:, :2]).all())
            rows.append({"imgsz": imgsz, "epoch": epoch, "batch": k, "boxes": len(ht), "same_boxes": same,
                         "box_diff": float((ht[:, 2:] - dt[:, 2:]).abs().max()) if same and len(ht) else 0.0,
                         "mean_diff": float(diff.mean()), "max_diff": float(diff.max()),
                         "differ": float((diff > 0.5).float().mean()), "host_mean": float(hi.mean() * 255),
                         "device_mean": float(di.mean() * 255)})
    return rows


def repeat_dataset(data: str | Path, copies: int, out: Path) -> Path:
    """--repeat: write `out`/repeat.yaml, `copies` x the training images of `data` (links); returns its path."""
    cfg = load_data_config(data)
    files = list_image_files(cfg["train"])
    images, labels = out / "images" / "train", out / "labels" / "train"
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    for k in range(copies):
        for im, lab in zip(files, img2label_paths(files)):
            name = f"k{k:02d}_{Path(im).name}"
            if not (images / name).is_symlink():
                os.symlink(Path(im).resolve(), images / name)
            link = labels / (Path(name).stem + ".txt")
            if Path(lab).is_file() and not link.is_symlink():
                os.symlink(Path(lab).resolve(), link)
    yaml_file = out / "repeat.yaml"
    yaml_file.write_text(yaml.safe_dump({"path": str(out), "train": "images/train",
                                         "val": [str(v) for v in cfg["val"]], "names": dict(enumerate(cfg["names"]))},
                                        sort_keys=False))
    return yaml_file


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--decode", action="store_true", help="cv2.imdecode on one core vs decode_jpeg on --device")
    mode.add_argument("--compare-paths", action="store_true", help="the same batches through both --augment-on paths")
    mode.add_argument("--repeat", type=int, metavar="N", help="write --out/repeat.yaml, N copies of the training set")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="dataset YAML (default: the shared COCO128)")
    p.add_argument("--batches", type=int, help="timed batches per setting (default 10; --compare-paths: per epoch, 4)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--imgsz", type=int, nargs="+", default=[640, 320])
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--cache", nargs="+", default=["off", "ram"], help="image cache modes to time (train.py: auto)")
    p.add_argument("--chunk", type=int, nargs="+", help="samples per worker task to compare (0: whole batches)")
    p.add_argument("--augment-on", nargs="+", default=["host"], choices=["host", "device"],
                   help="the workers' share: host (all of the augmentation) or device (tiles only; train.py's option)")
    p.add_argument("--device", default="cpu", help="where device rows time the rest of the augmentation, --decode "
                   "decodes and --compare-paths augments")
    p.add_argument("--rounds", type=int, default=3, help="--decode: passes over the images (the best one counts)")
    p.add_argument("--json", help="--decode: also write its result to this file")
    p.add_argument("--epochs", type=int, nargs="+", default=[0, 5], help="--compare-paths: the epochs to compare")
    p.add_argument("--seed", type=int, default=1, help="--compare-paths: the shuffle's seed")
    p.add_argument("--out", type=Path, help="--repeat: the folder to write the dataset in")
    opt = p.parse_args(argv)
    if opt.repeat is not None:
        if opt.out is None:
            p.error("--repeat needs --out DIR")
        print(repeat_dataset(opt.data, opt.repeat, opt.out))
        return
    train = load_data_config(opt.data)["train"]
    if opt.decode:
        r = decode_rates(list_image_files(train), opt.device, opt.rounds)
        print(json.dumps(r))
        if opt.json:
            Path(opt.json).write_text(json.dumps(r, indent=1))
    elif opt.compare_paths:
        batches = 4 if opt.batches is None else opt.batches
        print(paths_table([r for s in opt.imgsz for r in compare_paths(train, s, opt.epochs, batches, opt.batch_size,
                                                                        opt.seed, opt.device)]))
    else:
        chunks, batches = opt.chunk or [None], 10 if opt.batches is None else opt.batches
        rows = [(s, c, w, k, a, *measure(train, s, w, opt.batch_size, batches, cache=c, chunk=k, augment_on=a,
                                         device=opt.device))
                for s in opt.imgsz for c in opt.cache for w in opt.workers for k in chunks for a in opt.augment_on]
        print(table(rows, bool(opt.chunk), opt.device))


def table(rows: list[tuple], chunks: bool, device: str) -> str:
    """The printed table (bench/gpu_goals.py reads its rows: imgsz, cache, workers, augment, images/s first)."""
    lines = [f"\n{'imgsz':>6} {'cache':>6} {'workers':>8} {'augment':>8}" + (f" {'chunk':>6}" if chunks else "")
             + f" {'images/s':>9}  device s/batch ({device})"]
    for s, c, w, k, a, ips, dev_s in rows:
        lines.append(f"{s:>6} {c:>6} {w:>8} {a:>8}" + (f" {k:>6}" if chunks else "") + f" {ips:>9.1f}  "
                     + ("-" if dev_s is None else f"{dev_s:.4f}"))
    return "\n".join(lines)


def paths_table(rows: list[dict]) -> str:
    """--compare-paths' printed table, one line per batch."""
    lines = [f"{'imgsz':>5} {'epoch':>5} {'batch':>5} {'boxes':>5} {'same boxes':>10} {'box diff':>9} "
             f"{'pixel diff mean':>15} {'max':>4} {'values that differ':>18} {'mean level host / device':>25}"]
    for r in rows:
        lines.append(f"{r['imgsz']:>5} {r['epoch']:>5} {r['batch']:>5} {r['boxes']:>5} {str(r['same_boxes']):>10} "
                     f"{r['box_diff']:>9.1e} {r['mean_diff']:>15.5f} {r['max_diff']:>4.0f} {r['differ']:>17.4%} "
                     f"{r['host_mean']:>12.3f} / {r['device_mean']:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    run_cli(main)
