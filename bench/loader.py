"""Training data-loader throughput (images/s) with mosaic, on COCO128.

    python bench/loader.py [--data PATH/coco128.yaml] [--batches 10] [--batch-size 16] [--cache off ram]
                           [--chunk 0 8] [--augment-on host device] [--device cpu]

Times N batches after a warm-up (worker start-up and first decode excluded) for each image size
and worker count, and prints a table. The timed batches go on across epochs, so the epoch boundaries
(where a small dataset's workers wait) count. --chunk compares the samples a worker builds at a time
(0: whole batches; default: the loader's own choice, and the table has no chunk column).

--augment-on says which path the workers run (train.py's option; the "augment" column): host, the whole
augmentation; device, only reading and placing the mosaic tiles, so images/s is what the host must sustain for
the training device to do the rest. For device rows, "device s/batch" is what that rest (utils/data/
device_augment.DeviceAugment: warp, HSV, flips, boxes) takes per batch on --device, timed after the loader on
the same batches: wall seconds on a GPU (synchronised before each clock reading), CPU seconds on a CPU.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import torch  # noqa: E402

from utils.data.data_config import SHARED_COCO128, load_data_config, load_hyp  # noqa: E402
from utils.data.datasets import create_dataloader  # noqa: E402
from utils.data.device_augment import DeviceAugment  # noqa: E402
from utils.device import select_device  # noqa: E402
from utils.errors import run_cli  # noqa: E402

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DEFAULT_DATA), help="dataset YAML (default: the shared COCO128)")
    p.add_argument("--batches", type=int, default=10, help="timed batches per setting")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--imgsz", type=int, nargs="+", default=[640, 320])
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--cache", nargs="+", default=["off", "ram"], help="image cache modes to time (train.py: auto)")
    p.add_argument("--chunk", type=int, nargs="+", help="samples per worker task to compare (0: whole batches)")
    p.add_argument("--augment-on", nargs="+", default=["host"], choices=["host", "device"],
                   help="the workers' share: host (all of the augmentation) or device (tiles only; train.py's option)")
    p.add_argument("--device", default="cpu", help="where device rows time the rest of the augmentation")
    opt = p.parse_args()
    train = load_data_config(opt.data)["train"]
    chunks = opt.chunk or [None]
    rows = [(s, c, w, k, a, *measure(train, s, w, opt.batch_size, opt.batches, cache=c, chunk=k, augment_on=a,
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


if __name__ == "__main__":
    run_cli(main)
