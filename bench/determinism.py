"""What deterministic algorithms (train.py's default; --no-deterministic opts out) cost in training time.

    python bench/determinism.py                                   # COCO128, yolov5n, 128 and 320 px, batch 16
    python bench/determinism.py --data data.yaml --imgsz 640 --rounds 3 --amp off

Whole training epochs through train.run, deterministic on and off in alternation in one process (so drift in
the machine's speed falls on both), the seconds of each epoch's training pass summed per setting. The first
epoch of every run is left out (kernel selection, cache warm-up). Prints one table; the ratio is the figure
to quote.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import train  # noqa: E402
from utils.engine.callbacks import Callbacks  # noqa: E402

COCO128 = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "coco128" / "coco128.yaml"


def epoch_seconds(data: str, imgsz: int, deterministic: bool, epochs: int, amp: str, cfg: str, batch: int,
                  workers: int, project: str) -> list[float]:
    """Seconds of each training pass after the first (on_epoch_start to on_train_epoch_end)."""
    marks: dict[int, float] = {}
    spans: list[float] = []
    cb = Callbacks()
    cb.register("on_epoch_start", lambda t, e: marks.__setitem__(e, time.perf_counter()))
    cb.register("on_train_epoch_end", lambda t, e: spans.append(time.perf_counter() - marks[e]))
    train.run(data=data, cfg=cfg, imgsz=imgsz, batch_size=batch, epochs=epochs, workers=workers, amp=amp,
              deterministic=deterministic, noval=True, noplots=True, seed=0, project=project, callbacks=cb)
    return spans[1:]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(COCO128))
    p.add_argument("--imgsz", type=int, nargs="+", default=[128, 320])
    p.add_argument("--cfg", default="yolov5n.yaml")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=3, help="per run; the first is not counted")
    p.add_argument("--rounds", type=int, default=2, help="on/off pairs per size")
    p.add_argument("--amp", default="auto")
    p.add_argument("--workers", type=int, default=2)
    opt = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for imgsz in opt.imgsz:
            total = {True: 0.0, False: 0.0}
            for r in range(opt.rounds):
                for det in ((False, True) if r % 2 else (True, False)):  # alternate which goes first
                    total[det] += sum(epoch_seconds(opt.data, imgsz, det, opt.epochs, opt.amp, opt.cfg,
                                                    opt.batch_size, opt.workers, tmp))
            rows.append((imgsz, total[False], total[True]))
    print(f"\n{opt.cfg} batch {opt.batch_size}, --amp {opt.amp}, {torch.get_num_threads()} threads, "
          f"{opt.rounds} x {opt.epochs - 1} timed epochs per setting")
    print(f"{'imgsz':>6} {'off (s)':>9} {'on (s)':>9} {'on / off':>9}")
    for imgsz, off, on in rows:
        print(f"{imgsz:>6} {off:9.1f} {on:9.1f} {on / off:9.3f}")


if __name__ == "__main__":
    main()
