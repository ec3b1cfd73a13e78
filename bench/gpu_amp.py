"""GPU training precision: FP32 vs fp16 AMP (GradScaler) vs bf16 AMP, one script, under 5 minutes.

    python bench/gpu_amp.py [--cfg yolov5s.yaml] [--imgsz 640] [--batch 64] [--steps 50] [--json OUT.json]

yolov5s at 640, batch 64, channels_last, the same step train.py takes (utils.engine.updater.AmpUpdater with
the precision's autocast and scaler, ComputeLoss in FP32). Reports images/s over the timed steps,
peak memory (torch.cuda.max_memory_allocated), and whether the AMP check passes for each mode.
"FP32" is PyTorch's default FP32, whose cuDNN convolutions may use TF32 on Ampere and newer GPUs
(torch.backends.cudnn.allow_tf32); the header line says which. --json also writes the rows to a file
(bench/gpu_precision.sh reads it). Exits 1 with a one-line message where no CUDA device is present.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from models.yolo import Model  # noqa: E402
from utils.data.data_config import load_hyp  # noqa: E402
from utils.engine.amp import Precision, amp_check  # noqa: E402
from utils.engine.loss import ComputeLoss, loss_gains  # noqa: E402
from utils.engine.optim import build_optimizer  # noqa: E402
from utils.engine.updater import AmpUpdater  # noqa: E402


def measure(cfg: str, imgsz: int, batch: int, steps: int, mode: str) -> dict:
    dev = torch.device("cuda:0")
    torch.manual_seed(0)
    model = Model(cfg, nc=80).to(dev, memory_format=torch.channels_last).train()
    prec = Precision(mode, "cuda")
    passed = amp_check(model, prec)
    loss_fn = ComputeLoss(model, loss_gains(load_hyp(), 3, 80, imgsz))
    updater = AmpUpdater(model, build_optimizer(model, "AdamW", 0.001, 0.9, 5e-4, fused=True), prec)  # as train.py on CUDA
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand(batch, 3, imgsz, imgsz, device=dev, generator=g).contiguous(memory_format=torch.channels_last)
    n = batch * 6
    t = torch.cat((torch.arange(n, device=dev).remainder(batch)[:, None].float(),
                   torch.randint(0, 80, (n, 1), device=dev, generator=g).float(),
                   0.2 + 0.6 * torch.rand(n, 2, device=dev, generator=g), 0.05 + 0.3 * torch.rand(n, 2, device=dev, generator=g)), 1)

    def step():
        with prec.autocast():
            loss, _ = loss_fn(model(x), t)
        updater.backward(loss)
        updater.step()

    for _ in range(5):  # warm-up: cuDNN autotuning, allocator growth
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return {"mode": mode, "img/s": steps * batch / (time.perf_counter() - t0),
            "peak GiB": torch.cuda.max_memory_allocated() / 2**30, "amp check": passed, "skipped": updater.skipped}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cfg", default="yolov5s.yaml")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_amp.py: no CUDA device here; run it where a GPU is available")
        sys.exit(1)
    torch.backends.cudnn.benchmark = True
    rows = [measure(args.cfg, args.imgsz, args.batch, args.steps, m) for m in ("off", "fp16", "bf16")]
    print(f"{args.cfg} {args.imgsz}px batch {args.batch}, {args.steps} timed steps, {torch.cuda.get_device_name()}, "
          f"FP32 convolutions {'may use TF32' if torch.backends.cudnn.allow_tf32 else 'in full FP32'}")
    print(f"{'mode':>5} {'img/s':>8} {'x FP32':>7} {'peak GiB':>9} {'x FP32':>7} {'AMP check':>9} {'skipped':>7}")
    for r in rows:
        print(f"{r['mode']:>5} {r['img/s']:>8.1f} {r['img/s'] / rows[0]['img/s']:>7.2f} {r['peak GiB']:>9.2f} "
              f"{r['peak GiB'] / rows[0]['peak GiB']:>7.2f} {str(r['amp check']):>9} {r['skipped']:>7}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
