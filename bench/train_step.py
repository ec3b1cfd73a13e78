"""Training-step throughput of a model on this machine, beside the loader's, to see which bounds training.

    python bench/train_step.py                      # yolov5n, batch 16, 320 and 640, FP32 and bf16
    python bench/train_step.py --cfg yolov5s.yaml --imgsz 320 --steps 5
    python bench/train_step.py --imgsz 320 --profile bf16   # torch.profiler: where one step's time goes
    python bench/train_step.py --imgsz 256 --compile        # FP32 eager against torch.compile, and its compile time

One step = forward + loss under the precision's autocast, scaled backward, and the optimizer update
(what train.py does per batch with accumulation 1), on random images with a fixed set of targets.
Reports images/s per configuration; ratios between rows of one run are the figures to quote.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from models.yolo import Model  # noqa: E402
from utils.data.data_config import load_hyp  # noqa: E402
from utils.engine.amp import Precision, cpu_has_native_bf16  # noqa: E402
from utils.engine.loss import ComputeLoss, loss_gains  # noqa: E402
from utils.engine.optim import build_optimizer  # noqa: E402
from utils.engine.updater import AmpUpdater  # noqa: E402


def step_rate(cfg: str, imgsz: int, batch: int, mode: str, steps: int, channels_last: bool = True,
              profile: bool = False, compiled: bool = False, nc: int = 80, optimizer: str = "SGD") -> float:
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = Model(cfg, nc=nc).train().to(memory_format=fmt)
    hyp = load_hyp()
    loss_fn = ComputeLoss(model, loss_gains(hyp, 3, nc, imgsz))
    lr = 0.01 if optimizer == "SGD" else 0.001
    updater = AmpUpdater(model, build_optimizer(model, optimizer, lr, 0.937, 5e-4), Precision(mode, "cpu"))
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 3, imgsz, imgsz, generator=g).contiguous(memory_format=fmt)
    n = batch * 6  # ~6 objects per image, like COCO
    targets = torch.cat((torch.arange(n).remainder(batch)[:, None].float(), torch.randint(0, nc, (n, 1), generator=g).float(),
                         0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.05 + 0.3 * torch.rand(n, 2, generator=g)), 1)
    prec = Precision(mode, "cpu")
    forward = torch.compile(model) if compiled else model

    def one():
        with prec.autocast():
            loss, _ = loss_fn(forward(x), targets)
        updater.backward(loss)
        updater.step()

    t0 = time.perf_counter()
    one()  # warm-up: oneDNN picks and caches kernels on first use (and torch.compile compiles)
    if compiled:
        print(f"{imgsz:>6} first step (compilation) {time.perf_counter() - t0:.1f} s")
    if profile:
        print_profile(one, steps)
    t0 = time.perf_counter()
    for _ in range(steps):
        one()
    return steps * batch / (time.perf_counter() - t0)


def print_profile(step, steps: int, top: int = 18) -> None:
    """torch.profiler over `steps` steps: the ops with the most self CPU time, and the share of the total."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"{'op':<44} {'self ms/step':>12} {'share':>7} {'calls/step':>10}")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        print(f"{e.key[:44]:<44} {e.self_cpu_time_total / 1e3 / steps:12.1f} {e.self_cpu_time_total / total:7.1%} "
              f"{e.count / steps:10.0f}")
    print(f"{'all ops':<44} {total / 1e3 / steps:12.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cfg", default="yolov5n.yaml")
    ap.add_argument("--imgsz", type=int, nargs="+", default=[320, 640])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--profile", choices=["off", "bf16"], help="profile this precision (channels_last) and stop")
    ap.add_argument("--compile", action="store_true", help="FP32 channels_last, eager against torch.compile")
    ap.add_argument("--nc", type=int, default=80, help="number of classes of the model")
    ap.add_argument("--optimizer", default="SGD", choices=["SGD", "AdamW"])
    args = ap.parse_args()
    if args.compile:
        print(f"{args.cfg}, nc {args.nc}, {args.optimizer}, batch {args.batch}, FP32 channels_last, "
              f"{torch.get_num_threads()} threads, {args.steps} timed steps")
        kw = dict(nc=args.nc, optimizer=args.optimizer)
        for imgsz in args.imgsz:
            eager = step_rate(args.cfg, imgsz, args.batch, "off", args.steps, **kw)
            comp = step_rate(args.cfg, imgsz, args.batch, "off", args.steps, compiled=True, **kw)
            print(f"{imgsz:>6} eager {eager:.1f} images/s, torch.compile {comp:.1f} images/s ({comp / eager:.2f}x)")
        return
    if args.profile:
        for imgsz in args.imgsz:
            print(f"{args.cfg}, {imgsz} px, batch {args.batch}, {args.profile}, {torch.get_num_threads()} threads")
            step_rate(args.cfg, imgsz, args.batch, args.profile, args.steps, True, profile=True)
        return
    modes = ["off", "bf16"] if cpu_has_native_bf16() else ["off"]
    print(f"{args.cfg}, batch {args.batch}, {torch.get_num_threads()} threads, {args.steps} timed steps")
    print(f"{'imgsz':>6} {'precision':>10} {'layout':>14} {'images/s':>9}")
    for imgsz in args.imgsz:
        base = None
        for mode in modes:
            for cl in (False, True):
                r = step_rate(args.cfg, imgsz, args.batch, mode, args.steps, cl)
                base = base or r
                print(f"{imgsz:>6} {mode if mode != 'off' else 'FP32':>10} {'channels_last' if cl else 'NCHW':>14} "
                      f"{r:>9.1f}  ({r / base:.2f}x FP32 NCHW)")


if __name__ == "__main__":
    main()
