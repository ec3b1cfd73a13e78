"""Training data-loader throughput (images/s) with mosaic, on COCO128.

    python bench/loader.py [--data PATH/coco128.yaml] [--batches 10] [--batch-size 16] [--cache off ram]
                           [--chunk 0 8]

Times N batches after a warm-up (worker start-up and first decode excluded) for each image size
and worker count, and prints a table. The timed batches go on across epochs, so the epoch boundaries
(where a small dataset's workers wait) count. --chunk compares the samples a worker builds at a time
(0: whole batches; default: the loader's own choice, and the table has no chunk column).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from utils.data.data_config import SHARED_COCO128, load_data_config, load_hyp  # noqa: E402
from utils.data.datasets import create_dataloader  # noqa: E402
from utils.errors import run_cli  # noqa: E402

DEFAULT_DATA = SHARED_COCO128 / "coco128.yaml"


def measure(train: list, imgsz: int, workers: int, batch_size: int, batches: int, warmup: int = 2,
            cache: str = "off", chunk: int | None = None) -> float:
    """Images per second of the augmenting (mosaic) training loader."""
    loader, _ = create_dataloader(train, imgsz, batch_size, 32, hyp=load_hyp(), augment=True, shuffle=True,
                                  workers=workers, seed=0, cache=cache, chunk=chunk)
    seen, t0, epoch = 0, 0.0, 0
    while True:
        loader.sampler.set_epoch(epoch)
        for ims, *_ in loader:
            if warmup:
                warmup -= 1
                t0 = time.perf_counter()
                continue
            seen += len(ims)
            batches -= 1
            if batches == 0:
                return seen / (time.perf_counter() - t0)
        epoch += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DEFAULT_DATA), help="dataset YAML (default: the shared COCO128)")
    p.add_argument("--batches", type=int, default=10, help="timed batches per setting")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--imgsz", type=int, nargs="+", default=[640, 320])
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--cache", nargs="+", default=["off", "ram"], help="image cache modes to time (train.py: auto)")
    p.add_argument("--chunk", type=int, nargs="+", help="samples per worker task to compare (0: whole batches)")
    opt = p.parse_args()
    train = load_data_config(opt.data)["train"]
    chunks = opt.chunk or [None]
    rows = [(s, c, w, k, measure(train, s, w, opt.batch_size, opt.batches, cache=c, chunk=k))
            for s in opt.imgsz for c in opt.cache for w in opt.workers for k in chunks]
    # without --chunk the table keeps its four columns: bench/gpu_goals.py reads it
    print(f"\n{'imgsz':>6} {'cache':>6} {'workers':>8}" + (f" {'chunk':>6}" if opt.chunk else "") + f" {'images/s':>9}")
    for s, c, w, k, ips in rows:
        print(f"{s:>6} {c:>6} {w:>8}" + (f" {k:>6}" if opt.chunk else "") + f" {ips:>9.1f}")


if __name__ == "__main__":
    run_cli(main)
