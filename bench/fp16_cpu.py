"""What fp16 costs on a CPU: the training step and inference, FP32 vs fp16, in one run.

    python bench/fp16_cpu.py                        # yolov5n, 128 px, batch 8, 5 timed steps each
    python bench/fp16_cpu.py --cfg yolov5s.yaml --imgsz 256 --steps 3

Training: the step train.py takes (utils.engine.updater.AmpUpdater: autocast forward and loss, scaled backward,
unscale, clip, step, update), FP32 vs fp16 autocast with a live GradScaler. Inference: a fused eval
model in FP32 vs the same model after .half(), as test.py / detect.py --half run it.

Most CPUs have no FP16 arithmetic: PyTorch converts to FP32 and back around each operation, so fp16 is
much slower than FP32 there. The median step time ratio printed here is the figure the warnings of
utils/engine/amp.py quote (utils.engine.amp.CPU_FP16_SLOWDOWN). Timings on a shared machine are noisy: compare the
two precisions within one run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from models.yolo import Model  # noqa: E402
from utils.data.data_config import load_hyp  # noqa: E402
from utils.engine.amp import Precision  # noqa: E402
from utils.engine.loss import ComputeLoss, loss_gains  # noqa: E402
from utils.engine.optim import build_optimizer  # noqa: E402
from utils.engine.updater import AmpUpdater  # noqa: E402


def fake_batch(batch: int, imgsz: int, nc: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images and 4 random boxes per image (same every call)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 3, imgsz, imgsz, generator=g)
    n = batch * 4
    t = torch.cat((torch.arange(n).remainder(batch)[:, None].float(), torch.randint(0, nc, (n, 1), generator=g).float(),
                   0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.1 + 0.3 * torch.rand(n, 2, generator=g)), 1)
    return x.contiguous(memory_format=torch.channels_last), t


def time_train(cfg: str, imgsz: int, batch: int, steps: int, mode: str) -> tuple[float, float]:
    """(median seconds per training step, GradScaler scale at the end)."""
    torch.manual_seed(0)
    model = Model(cfg, nc=3).to(memory_format=torch.channels_last).train()
    prec = Precision(mode, "cpu")
    loss_fn = ComputeLoss(model, loss_gains(load_hyp(), 3, 3, imgsz))
    updater = AmpUpdater(model, build_optimizer(model, "SGD", 0.01, 0.937, 5e-4), prec)
    x, t = fake_batch(batch, imgsz, 3)
    times = []
    for i in range(steps + 1):  # the first step allocates and picks kernels: not timed
        t0 = time.perf_counter()
        with prec.autocast():
            loss, _ = loss_fn(model(x), t)
        updater.backward(loss)
        updater.step()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), float(updater.scaler.get_scale()) if prec.use_scaler else 1.0


@torch.inference_mode()
def time_infer(cfg: str, imgsz: int, batch: int, steps: int, dtype: torch.dtype) -> float:
    torch.manual_seed(0)
    model = Model(cfg, nc=3).fuse().eval().to(dtype)
    x, _ = fake_batch(batch, imgsz, 3)
    x = x.contiguous().to(dtype)  # as test.py / detect.py feed it
    model(x)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cfg", default="yolov5n.yaml")
    ap.add_argument("--imgsz", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per precision (median reported)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{args.cfg} {args.imgsz}px batch {args.batch}, median of {args.steps} steps, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    f32, _ = time_train(args.cfg, args.imgsz, args.batch, args.steps, "off")
    f16, scale = time_train(args.cfg, args.imgsz, args.batch, args.steps, "fp16")
    i32 = time_infer(args.cfg, args.imgsz, args.batch, args.steps, torch.float32)
    i16 = time_infer(args.cfg, args.imgsz, args.batch, args.steps, torch.float16)
    print(f"{'':<34}{'FP32 s':>9}{'fp16 s':>9}{'fp16/FP32':>11}")
    print(f"{'train step (autocast + GradScaler)':<34}{f32:>9.3f}{f16:>9.3f}{f16 / f32:>10.1f}x   (scale {scale:g})")
    print(f"{'inference (.half() model)':<34}{i32:>9.3f}{i16:>9.3f}{i16 / i32:>10.1f}x")


if __name__ == "__main__":
    main()
