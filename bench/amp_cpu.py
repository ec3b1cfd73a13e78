"""FP32 vs bf16 autocast training on this CPU, in one run (issue 3's measurement).

    python bench/amp_cpu.py                       # (a) built-in dataset, default recipe, both precisions
    python bench/amp_cpu.py --coco128 PATH.yaml   # (b) also COCO128 at 320, batch 16, 3 epochs
    python bench/amp_cpu.py --sizes               # (c) checkpoint sizes only

Prints seconds per epoch (median over epochs, from the per-epoch timings) and the final mAP of
each precision, and the ratio. The CPU default (--amp auto -> bf16) is justified only if bf16's
mAP@0.5:0.95 on (a) is within 1 point of FP32's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import train  # noqa: E402
from models.yolo import Model  # noqa: E402
from utils.engine.callbacks import Callbacks  # noqa: E402
from utils.engine.checkpoint import atomic_save, make_checkpoint  # noqa: E402
from utils.report.results import read_records  # noqa: E402


class EpochTimer:
    """Wall seconds of each epoch's training pass (validation excluded), from the Trainer's callbacks."""

    def __init__(self):
        self.times: list[float] = []
        self.callbacks = Callbacks()
        self.callbacks.register("on_epoch_start", self._start)
        self.callbacks.register("on_train_epoch_end", self._stop)

    def _start(self, trainer, epoch) -> None:
        self._t0 = time.perf_counter()

    def _stop(self, trainer, epoch) -> None:
        self.times.append(time.perf_counter() - self._t0)


def run_one(amp: str, project: str, **kw) -> dict:
    timer = EpochTimer()
    t0 = time.perf_counter()
    out = train.run(amp=amp, project=project, name=amp, noplots=True, callbacks=timer.callbacks, **kw)
    total = time.perf_counter() - t0
    rows = read_records(out.save_dir / "results.csv")
    last = rows[-1]
    return {"amp": amp, "s/epoch": statistics.median(timer.times), "total_s": total, "epochs": len(rows),
            "map50": float(last["metrics/mAP_0.5"]), "map": float(last["metrics/mAP_0.5:0.95"])}


def table(title: str, results: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'amp':>5} {'epochs':>6} {'s/epoch':>8} {'total s':>8} {'mAP@0.5':>8} {'mAP@.5:.95':>10}")
    for r in results:
        print(f"{r['amp']:>5} {r['epochs']:>6} {r['s/epoch']:>8.1f} {r['total_s']:>8.0f} {r['map50']:>8.3f} {r['map']:>10.3f}")
    if len(results) == 2:
        a, b = results
        print(f"speed-up bf16 vs FP32: {a['s/epoch'] / b['s/epoch']:.2f}x per epoch; "
              f"mAP@0.5:0.95 difference {100 * (b['map'] - a['map']):+.1f} points")


def checkpoint_sizes() -> None:
    print("\ncheckpoint sizes (best.pt = FP16 EMA + metadata, vs torch.save of the FP32 state dict)")
    with tempfile.TemporaryDirectory() as d:
        for cfg in ("yolov5n.yaml", "yolov5s.yaml"):
            m = Model(cfg, nc=80)
            atomic_save(make_checkpoint(m, m.yaml, [str(i) for i in range(80)], 0), Path(d) / "best.pt")
            torch.save(m.state_dict(), Path(d) / "fp32.pt")
            a, b = os.path.getsize(Path(d) / "best.pt"), os.path.getsize(Path(d) / "fp32.pt")
            print(f"{cfg}: best.pt {a / 1e6:.2f} MB, FP32 {b / 1e6:.2f} MB, ratio {a / b:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--coco128", default="", help="COCO128 data YAML for part (b)")
    ap.add_argument("--sizes", action="store_true", help="only the checkpoint sizes")
    ap.add_argument("--skip-default", action="store_true", help="skip part (a)")
    ap.add_argument("--project", default=tempfile.mkdtemp(prefix="amp_cpu_"))
    args = ap.parse_args()
    checkpoint_sizes()
    if args.sizes:
        return
    if not args.skip_default:
        table("(a) built-in dataset, default recipe (python train.py --amp off|bf16)",
              [run_one(a, f"{args.project}/default") for a in ("off", "bf16")])
    if args.coco128:
        table("(b) COCO128, imgsz 320, batch 16, 3 epochs",
              [run_one(a, f"{args.project}/coco128", data=args.coco128, imgsz=320, batch_size=16, epochs=3)
               for a in ("off", "bf16")])


if __name__ == "__main__":
    main()
